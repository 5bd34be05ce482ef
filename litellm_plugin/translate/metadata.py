"""LiteLLM's call kwargs beside the request body: the metadata dict (where the strategy and the pre-call hook leave
the placement id and the rewrite for the callbacks), the upstream headers, and the trace ids.

Pure functions, no LiteLLM state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cognitora.decision import Decision
from cognitora.disagg.wire import PREFILL_ENDPOINT_HEADER
from cognitora.intent import Rewrite

__all__ = [
    "PLACEMENT_KEY",
    "REWRITE_KEY",
    "callback_metadata",
    "client_trace",
    "metadata_of",
    "note_rewrite",
    "placement_id",
    "rewrite_of",
    "set_engine_headers",
    "set_prefill_endpoint",
    "trace_id",
    "writable_metadata",
]

PLACEMENT_KEY = "cognitora_request_id"
"""Metadata key the strategy writes on each attempt, so the callbacks find that attempt's decision."""

REWRITE_KEY = "cognitora_rewrite"
"""Metadata key the pre-call hook writes: the core's model rewrite, which the strategy hands back to the core with
the placement (so it is decided once and explained with the decision). Any client copy is dropped first."""

_METADATA_VARIABLES = ("litellm_metadata", "metadata")


def metadata_of(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata dict LiteLLM carries for this call (``litellm_metadata`` on some routes, else ``metadata``)."""
    for name in _METADATA_VARIABLES:
        value = kwargs.get(name)
        if isinstance(value, dict):
            return value
    return {}


def writable_metadata(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The metadata dict to annotate, created if missing, under the same name LiteLLM's retry logging uses."""
    name = "litellm_metadata" if "litellm_metadata" in kwargs else "metadata"
    value = kwargs.get(name)
    if not isinstance(value, dict):
        value = {}
        kwargs[name] = value
    return value


def callback_metadata(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata as a logging callback sees it (``kwargs['litellm_params']['metadata']``, or the call's own)."""
    params = kwargs.get("litellm_params")
    if isinstance(params, Mapping):
        found = metadata_of(params)
        if found:
            return found
    return metadata_of(kwargs)


def placement_id(kwargs: Mapping[str, Any]) -> str | None:
    """The attempt's placement id, from a strategy's request kwargs or a callback's kwargs."""
    for meta in (callback_metadata(kwargs), metadata_of(kwargs)):
        value = meta.get(PLACEMENT_KEY)
        if isinstance(value, str):
            return value
    return None


def set_prefill_endpoint(kwargs: dict[str, Any], decision: Decision) -> None:
    """The call's upstream headers name the split request's prefill endpoint for the decode endpoint's pd-sidecar
    (``cognitora.disagg.sidecar``), or name none: any copy from the client is dropped first (only placement may
    name it, on every attempt: a retry may land whole)."""
    for name in ("extra_headers", "headers"):
        headers = kwargs.get(name)
        if isinstance(headers, dict) and any(k.lower() == PREFILL_ENDPOINT_HEADER for k in headers):
            kwargs[name] = {k: v for k, v in headers.items() if k.lower() != PREFILL_ENDPOINT_HEADER}
    if decision.prefill is not None:
        extra = kwargs.get("extra_headers")
        kwargs["extra_headers"] = {
            **(extra if isinstance(extra, dict) else {}),
            PREFILL_ENDPOINT_HEADER: decision.prefill.url,
        }


def client_trace(request_kwargs: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The W3C ``traceparent`` and ``tracestate`` the client (or a gateway in front) sent the proxy."""
    server_request = request_kwargs.get("proxy_server_request")
    sent = server_request.get("headers") if isinstance(server_request, Mapping) else None
    if not isinstance(sent, Mapping):
        return None, None
    lowered = {str(k).lower(): v for k, v in sent.items() if isinstance(v, str)}
    return lowered.get("traceparent"), lowered.get("tracestate")


def set_engine_headers(kwargs: dict[str, Any], headers: Mapping[str, str]) -> None:
    """Add ``headers`` to the call's upstream request (``extra_headers``, which LiteLLM sends to the engine)."""
    if headers:
        extra = kwargs.get("extra_headers")
        kwargs["extra_headers"] = {**(extra if isinstance(extra, dict) else {}), **headers}


def trace_id(kwargs: Mapping[str, Any]) -> str | None:
    """LiteLLM's id for one logical request: the same on every retry and fallback of it."""
    value = kwargs.get("litellm_trace_id")
    return value if isinstance(value, str) else None


def rewrite_of(request_kwargs: Mapping[str, Any], group: str) -> Rewrite | None:
    """The rewrite the pre-call hook decided for this request, when it chose ``group``; None otherwise."""
    found = metadata_of(request_kwargs).get(REWRITE_KEY)
    if not isinstance(found, Mapping) or found.get("model") != group:
        return None
    try:
        return Rewrite(**{f.name: found[f.name] for f in dataclasses.fields(Rewrite) if f.name in found})
    except TypeError:
        return None


def note_rewrite(data: dict[str, Any], rewrite: Rewrite | None) -> None:
    """Record the pre-call hook's rewrite in the request's metadata (dropping whatever was there: a client's)."""
    meta = writable_metadata(data)
    meta.pop(REWRITE_KEY, None)
    if rewrite is not None:
        meta[REWRITE_KEY] = dataclasses.asdict(rewrite)  # plain JSON: LiteLLM's logging serializes metadata
