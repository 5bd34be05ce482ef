"""LiteLLM's request kwargs, responses and errors <-> the core's ``RouteRequest``, ``Outcome`` and ``Rejection``.

Pure functions, no LiteLLM state: each one reads what LiteLLM hands the strategy or a callback and returns the
core's type (or the reverse, for rejections). Identity comes only from the ``user_api_key_*`` metadata the proxy
writes after authentication (it strips those keys from the client's own ``metadata`` first); the client's body
metadata is never read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import litellm

from cognitora.config import DEFAULT_PRIORITY
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.decision import Decision, Rejection
from cognitora.disagg.wire import PREFILL_ENDPOINT_HEADER
from cognitora.identity import Claims, Identity, IdentitySource, resolve_identity
from cognitora.intent import Rewrite
from cognitora.request import RouteRequest, check_body, new_request_id, read_choices, read_max_tokens
from cognitora.stream_usage import usage_from_object
from cognitora.surface_entry import SurfaceReader, surface_under_prefix
from cognitora.surface_entry import route_request as surface_route_request
from kvstate.surfaces import SurfaceName, SurfaceRequest

__all__ = [
    "PLACEMENT_KEY",
    "REWRITE_KEY",
    "client_trace",
    "failure_outcome",
    "metadata_of",
    "note_rewrite",
    "placement_id",
    "rejection_error",
    "rewrite_of",
    "route_request",
    "set_engine_headers",
    "set_prefill_endpoint",
    "success_outcome",
    "surface_path",
    "trace_id",
    "writable_metadata",
]

PLACEMENT_KEY = "cognitora_request_id"
"""Metadata key the strategy writes on each attempt, so the callbacks find that attempt's decision."""

PRIORITY_KEY = "cognitora_priority"
"""Key (or team) ``metadata`` entry naming the request's priority class: set by an admin, never by the client."""

ALLOW_PINNING_KEY = "cognitora_allow_pinning"
"""Key (or team) ``metadata`` entry that lets a key's requests name one engine's deployment id and be served there
(``true``): set by an admin, never by the client. Without it a named engine is placed like its model group."""

INTENT_KEY = "cognitora_intent"
"""Key (or team) ``metadata`` entry with an intent hint for the rewrite rules (``rules[].hint``): set by an admin,
never by the client."""

REWRITE_KEY = "cognitora_rewrite"
"""Metadata key the pre-call hook writes: the core's model rewrite, which the strategy hands back to the core with
the placement (so it is decided once and explained with the decision). Any client copy is dropped first."""

CONNECTION_ERROR_TEXT = "Connection error"
"""What the OpenAI client says when it cannot reach a server (refused, reset); LiteLLM keeps it in the message."""

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


def _first_str(meta: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = meta.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _admin_set(meta: Mapping[str, Any], name: str) -> Any:
    """A value an admin set on the authenticated key (or its team), never one the client sent."""
    for key in ("user_api_key_metadata", "user_api_key_team_metadata"):
        admin_set = meta.get(key)
        if isinstance(admin_set, Mapping) and name in admin_set:
            return admin_set[name]
    return None


def _priority(meta: Mapping[str, Any]) -> str:
    value = _admin_set(meta, PRIORITY_KEY)
    if not (isinstance(value, str) and value):
        # LiteLLM's own spelling (its priority reservation reads it the same way: the team's, then the key's).
        for key in ("user_api_key_team_metadata", "user_api_key_metadata"):
            admin_set = meta.get(key)
            if isinstance(admin_set, Mapping) and isinstance(admin_set.get("priority"), str):
                value = admin_set["priority"]
                break
    return value if isinstance(value, str) and value else DEFAULT_PRIORITY


def _client_body(request_kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The body the client sent the proxy (``proxy_server_request.body``); empty outside the proxy."""
    server_request = request_kwargs.get("proxy_server_request")
    body = server_request.get("body") if isinstance(server_request, Mapping) else None
    return body if isinstance(body, Mapping) else {}


def _check_client_body(request_kwargs: Mapping[str, Any]) -> None:
    """The body the client sent the proxy, by the core's rules as Envoy's service checks it (``check_body``): the
    same malformed chat or completions body gets the same 400 through either gateway. Raises ``InvalidRequest``."""
    server_request = request_kwargs.get("proxy_server_request")
    url = server_request.get("url") if isinstance(server_request, Mapping) else None
    body = _client_body(request_kwargs)
    if not isinstance(url, str) or not body:
        return  # an SDK call: LiteLLM's own Python API typed the fields
    if urlsplit(url).path.rstrip("/").endswith("/chat/completions") or "messages" in body:
        check_body(body, chat=True)
    elif "prompt" in body:  # a completions body (embeddings' and responses' ``input`` are their APIs' own)
        check_body(body, chat=False)


def _is_token_ids(value: Any) -> bool:
    if not isinstance(value, list) or not value:
        return False
    rows = value if all(isinstance(v, list) for v in value) else [value]
    return all(isinstance(t, int) and not isinstance(t, bool) for row in rows for t in row)


def _prompt_fields(
    messages: Sequence[Mapping[str, Any]] | None, input: str | list[Any] | None, request_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The request's prompt fields as the client sent them, for ``RouteRequest`` (the core reads them).

    LiteLLM hands the strategy a text completion as ``messages=[{"role": "user", "content": prompt}]``: the
    client's ``prompt`` comes back from the proxy's copy of the body, or, outside the proxy, from that one message
    when its content can only be a prompt (token ids). Embeddings and responses pass ``input``.
    """
    body = _client_body(request_kwargs)
    if body.get("prompt") is not None and body.get("messages") is None:
        messages, prompt = None, body["prompt"]
    elif messages is not None:
        only = messages[0] if len(messages) == 1 else None
        is_prompt = isinstance(only, Mapping) and set(only) == {"role", "content"} and _is_token_ids(only["content"])
        messages, prompt = (None, only["content"]) if isinstance(only, Mapping) and is_prompt else (messages, None)
    elif isinstance(input, list) and input and all(isinstance(i, Mapping) and "role" in i for i in input):
        messages, prompt = input, None  # Responses API input items of the message kind
    else:
        prompt = input
    extra = request_kwargs.get("extra_body")
    extra = extra if isinstance(extra, Mapping) else {}

    def field(name: str) -> Any:
        # vLLM's own fields reach LiteLLM top-level (the proxy) or in extra_body (the OpenAI SDK's way).
        value = request_kwargs.get(name)
        return extra.get(name) if value is None else value

    flags = {
        name: value
        for name in ("add_special_tokens", "add_generation_prompt", "continue_final_message")
        if isinstance(value := field(name), bool)
    }
    template_kwargs = field("chat_template_kwargs")
    tools = field("tools")
    return {
        "messages": messages,
        "prompt": prompt,
        "tools": tools if isinstance(tools, list) else None,
        "chat_template_kwargs": template_kwargs if isinstance(template_kwargs, Mapping) else None,
        **flags,
    }


_SURFACES_READ_BY_THE_CORE = frozenset({"messages", "responses", "embeddings"})
"""The proxy's endpoints whose client body the core's surface reader reads (``cognitora.surface_entry``): LiteLLM
hands the strategy only part of it (Anthropic's ``system`` is a separate kwarg, Responses' items are ``input``)."""


def surface_path(request_kwargs: Mapping[str, Any]) -> str | None:
    """The proxy path of a Messages, Responses or embeddings request (``/v1/messages``, ...), whose client body
    the core reads; None for chat and completions, and for a call through LiteLLM's Python API (no proxy)."""
    server_request = request_kwargs.get("proxy_server_request")
    url = server_request.get("url") if isinstance(server_request, Mapping) else None
    if not isinstance(url, str) or not _client_body(request_kwargs):
        return None
    path = urlsplit(url).path
    return path if surface_under_prefix(path) in _SURFACES_READ_BY_THE_CORE else None


def responses_holder(request_kwargs: Mapping[str, Any]) -> str | None:
    """The deployment id LiteLLM encoded in a Responses request's ``previous_response_id`` (its response ids carry
    the deployment that answered): only that engine holds the conversation (vLLM's response store is per server)."""
    previous = _client_body(request_kwargs).get("previous_response_id")
    if not isinstance(previous, str):
        return None
    from litellm.responses.utils import ResponsesAPIRequestUtils  # LiteLLM's own decoding of its ids

    found = ResponsesAPIRequestUtils.get_model_id_from_response_id(previous)
    return found if isinstance(found, str) and found else None


def route_request(
    model: str,
    messages: Sequence[Mapping[str, Any]] | None,
    input: str | list[Any] | None,
    request_kwargs: Mapping[str, Any],
    candidates: Sequence[str],
    pinned_endpoint: str | None = None,
    burst_targets: Sequence[str] = (),
    named_cloud: str | None = None,
    *,
    reader: SurfaceReader | None = None,
    holder: str | None = None,
) -> RouteRequest:
    """The core's view of one attempt. ``model`` is the model group; ``candidates`` are endpoint ids.

    ``reader``: the core's surface reader, for a request ``surface_path`` names: its client body is read by the
    surface's own rules (Anthropic's ``system`` and blocks, Responses' items, ...). ``holder``: the endpoint that
    holds a Responses request's ``previous_response_id`` (``responses_holder``), where it is pinned.

    Raises ``cognitora.request.InvalidRequest`` for a body or a ``max_tokens``, ``n`` or ``best_of`` the core
    refuses (the strategy answers 400)."""
    path = surface_path(request_kwargs) if reader is not None else None
    if reader is not None and path is not None:
        read = reader.read(path, _client_body(request_kwargs), model=model)
        assert read is not None  # surface_path named a surface's path
        return _surface_request(model, read, request_kwargs, candidates, burst_targets, named_cloud, holder)
    _check_client_body(request_kwargs)
    meta = metadata_of(request_kwargs)
    n, best_of = read_choices(request_kwargs)
    return RouteRequest(
        model=model,
        **_prompt_fields(messages, input, request_kwargs),
        request_id=new_request_id(),
        identity=_identity(meta),
        max_tokens=read_max_tokens(request_kwargs),
        n=n,
        best_of=best_of,
        stream=bool(request_kwargs.get("stream")),
        candidates=tuple(candidates),
        burst_targets=tuple(burst_targets),
        named_cloud=named_cloud,
        pinned_endpoint=pinned_endpoint,
        may_pin=_admin_set(meta, ALLOW_PINNING_KEY) is True,
        rewrite=rewrite_of(request_kwargs, model),
    )


def _surface_request(
    model: str,
    read: SurfaceRequest,
    request_kwargs: Mapping[str, Any],
    candidates: Sequence[str],
    burst_targets: Sequence[str],
    named_cloud: str | None,
    holder: str | None,
) -> RouteRequest:
    meta = metadata_of(request_kwargs)
    pin: dict[str, Any] = {} if holder is None else {"pinned_endpoint": holder, "may_pin": True}
    return surface_route_request(
        read,
        model=model,
        request_id=new_request_id(),
        identity=_identity(meta),
        candidates=tuple(candidates),
        burst_targets=tuple(burst_targets),
        named_cloud=named_cloud,
        rewrite=rewrite_of(request_kwargs, model),
        **pin,
    )


def _identity(meta: Mapping[str, Any]) -> Identity:
    return resolve_identity(
        Claims(
            IdentitySource.LITELLM_KEY,
            team=_first_str(meta, "user_api_key_team_id"),
            # The key's admin-set alias names it in budgets when it has one; else its hash (never the key).
            key=_first_str(meta, "user_api_key_alias", "user_api_key_hash", "user_api_key"),
            # Only the key's owner: LiteLLM's end-user id is the body's `user` field, which the client chooses.
            user=_first_str(meta, "user_api_key_user_id"),
            priority=_priority(meta),
            intent_hint=_admin_str(meta, INTENT_KEY),
        )
    )


def _admin_str(meta: Mapping[str, Any], name: str) -> str | None:
    value = _admin_set(meta, name)
    return value if isinstance(value, str) and value else None


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


# -- responses -> Outcome ------------------------------------------------------------------------------------


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    return None


def _ttft_s(kwargs: Mapping[str, Any]) -> float | None:
    start = kwargs.get("api_call_start_time")
    first = kwargs.get("completion_start_time")
    if isinstance(start, datetime.datetime) and isinstance(first, datetime.datetime):
        try:
            seconds = (first - start).total_seconds()
        except TypeError:  # one naive, one aware: no TTFT rather than a failed callback
            return None
        return seconds if seconds >= 0 else None
    return None


def success_outcome(kwargs: Mapping[str, Any], response: Any) -> Outcome:
    """A finished request: usage from the response (streamed: the assembled one), achieved cache hit included."""
    usage = _get(response, "usage")
    logged = kwargs.get("standard_logging_object")
    prompt_tokens = _int_or_none(_get(usage, "prompt_tokens"))
    completion_tokens = _int_or_none(_get(usage, "completion_tokens"))
    details = _get(usage, "prompt_tokens_details")
    cached = _int_or_none(_get(details, "cached_tokens")) if details is not None else None
    if prompt_tokens is None and _get(usage, "input_tokens") is not None:
        # An Anthropic Messages or Responses answer: the core's reading of each surface's usage fields
        surface: SurfaceName = "messages" if _get(response, "type") == "message" else "responses"
        dumped = usage.model_dump() if hasattr(usage, "model_dump") else usage
        read = usage_from_object(surface, dumped)
        if read is not None:
            prompt_tokens, completion_tokens, cached = read.prompt_tokens, read.completion_tokens, read.cached_tokens
    if prompt_tokens is None and isinstance(logged, Mapping):
        prompt_tokens = _int_or_none(logged.get("prompt_tokens"))
        completion_tokens = _int_or_none(logged.get("completion_tokens"))
    return Outcome(
        OutcomeKind.COMPLETED,
        status=200,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached,
        ttft_s=_ttft_s(kwargs),
    )


def failure_outcome(error: BaseException | str | None) -> Outcome:
    """How an attempt that raised ``error`` ended, in the core's terms (what that means for the engine is the
    core's call: ``OutcomeKind.marks_unhealthy``)."""
    if error is None or isinstance(error, str):
        return Outcome(OutcomeKind.FAILED, detail=(error or "request failed")[:500])
    detail = f"{type(error).__name__}: {str(error)[:400]}"
    status = _int_or_none(getattr(error, "status_code", None))
    kind = OutcomeKind.FAILED
    if isinstance(error, asyncio.CancelledError):
        kind = OutcomeKind.CLIENT_CANCELLED
    elif isinstance(error, litellm.Timeout):
        kind = OutcomeKind.TIMEOUT
    elif isinstance(error, litellm.APIConnectionError) or (
        # LiteLLM 1.108 wraps the OpenAI client's APIConnectionError (refused, reset, DNS) for OpenAI-compatible
        # engines as InternalServerError; the client's own message is the only mark left of it.
        isinstance(error, litellm.InternalServerError) and CONNECTION_ERROR_TEXT in str(error)
    ):
        kind, status = OutcomeKind.CONNECT_FAILED, None
    elif isinstance(error, litellm.ServiceUnavailableError):
        kind, status = OutcomeKind.UPSTREAM_ERROR, 503
    elif isinstance(error, litellm.BadGatewayError):
        kind, status = OutcomeKind.UPSTREAM_ERROR, 502
    elif status is not None and status >= 500:
        kind = OutcomeKind.UPSTREAM_ERROR
    elif status is not None and status >= 400:
        kind = OutcomeKind.REJECTED
    return Outcome(kind, status=status, detail=detail, retry_after_s=_retry_after(error))


def _retry_after(error: BaseException) -> float | None:
    """The ``Retry-After`` (seconds) of the answer behind ``error`` (a provider's 429), when it had one."""
    response = getattr(error, "response", None)
    for headers in (getattr(error, "litellm_response_headers", None), getattr(response, "headers", None)):
        value = headers.get("retry-after") if headers is not None and hasattr(headers, "get") else None
        if value is not None:
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                continue  # an HTTP date: the target's default hold-off applies
            if math.isfinite(seconds) and seconds >= 0:
                return seconds
    return None


# -- Rejection -> LiteLLM's error ------------------------------------------------------------------------------


def rejection_error(rejection: Rejection, model: str) -> Exception:
    """The LiteLLM exception whose HTTP status is the rejection's, so the proxy answers with that status.

    ``num_retries=0``: a refusal is the core's answer for this request, not a flaky deployment to retry.
    """
    message = f"cognitora: {rejection.message}"
    status = rejection.status
    error: Exception
    if status == 429:
        headers = {"retry-after": str(rejection.retry_after_s)} if rejection.retry_after_s is not None else None
        error = litellm.RateLimitError(
            message=message,
            llm_provider="cognitora",
            model=model,
            num_retries=0,
            category="litellm_rate_limit",
            headers=headers,
        )
    elif status == 404:
        error = litellm.NotFoundError(message=message, model=model, llm_provider="cognitora")
    elif status == 400:
        error = litellm.BadRequestError(message=message, model=model, llm_provider="cognitora")
    elif status == 503:
        error = litellm.ServiceUnavailableError(message=message, model=model, llm_provider="cognitora")
    else:
        error = litellm.APIError(status_code=status, message=message, llm_provider="cognitora", model=model)
    error.num_retries = 0
    return error
