"""``CognitoraCallbacks``: the LiteLLM callback that reports each placed attempt's end to the core.

One instance per process, made by ``litellm_plugin.install()`` (``Plugin.callbacks``) and named by the proxy's
callback line (``litellm_plugin.callbacks``).

What each LiteLLM hook becomes, on the attempt the strategy started (``cognitora.attempt.Attempt``, found by the
id the strategy wrote into the request's metadata):

- ``async_post_call_failure_deployment_hook`` (once per failed attempt, awaited before LiteLLM retries):
  ``Attempt.finish`` with the error translated to an ``OutcomeKind``; the core marks the engine unhealthy when
  the kind says it is gone, before the retry re-enters the strategy;
- ``async_post_call_success_deployment_hook`` (awaited before a whole response is returned) and, for streams,
  ``async_log_success_event`` (at the stream's end, with the full usage): ``Attempt.finish`` with usage and
  ``cached_tokens``;
- ``async_log_failure_event`` and the sync ``log_*`` twins: the same, for whatever attempt is still open;
- ``async_post_call_streaming_iterator_hook`` (the proxy wraps every stream in it): the first chunk is
  ``Attempt.first_token``; a stream the client abandons is finished as ``client_cancelled``. The SDK
  (``Router.acompletion`` without the proxy) has no per-chunk hook: there the core stops counting a stream's
  prefill after its first-token deadline (``placement.prefill_report_factor``).

The attempt takes each call once, from any thread, whichever of these fire.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator
from typing import Any

from litellm.constants import RETURN_RAW_MODEL_NAME_METADATA_KEY
from litellm.integrations.custom_logger import CustomLogger

from cognitora.core.attempt import Attempt
from cognitora.core.outcome import Outcome, cancelled_stream
from cognitora.core.router import Router
from cognitora.intent import Rewrite
from cognitora.request import InvalidRequest, RouteRequest
from litellm_plugin.runtime import CoreHost, HostClosed
from litellm_plugin.translate import (
    REWRITE_KEY,
    failure_outcome,
    metadata_of,
    note_rewrite,
    placement_id,
    route_request,
    success_outcome,
    writable_metadata,
)

__all__ = ["SERVED_MODEL_HEADER", "CognitoraCallbacks"]

log = logging.getLogger("cognitora.litellm")


class CognitoraCallbacks(CustomLogger):
    """Reports attempts' ends (see the module docstring). One instance per process: ``install().callbacks``."""

    def __init__(self) -> None:
        super().__init__()
        self._hosts: weakref.WeakSet[CoreHost] = weakref.WeakSet()

    def watch(self, host: CoreHost) -> None:
        """A strategy's core: its attempts are the ones the hooks report on."""
        self._hosts.add(host)

    def unwatch(self, host: CoreHost) -> None:
        self._hosts.discard(host)

    def open_attempts(self) -> list[Attempt]:
        """Every attempt of every watched core not finished yet (tests and ``cognitora explain`` read it)."""
        return [a for host in list(self._hosts) for a in host.open_attempts()]

    # -- async hooks (the proxy and acompletion) ----------------------------------------------------------------
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        # The proxy's pre-call hook runs after authentication and before the proxy hands the request to its Router:
        # the one supported place where the model group can change before LiteLLM picks a deployment (its own
        # pre-routing hook runs inside the Router's default deployment choice, which a custom strategy replaces).
        kind = str(getattr(call_type, "value", call_type))
        if kind not in _REWRITTEN_CALLS or not isinstance(data.get("model"), str):
            return None
        host = next((h for h in list(self._hosts) if h.config.intent is not None), None)
        if host is None:
            return None
        try:
            req = route_request(data["model"], data.get("messages"), data.get("prompt"), data, [])
        except InvalidRequest:
            return None  # the strategy refuses it with the same message, in its place
        rewrite = await host.call(lambda router: _rewrite(router, req))
        note_rewrite(data, rewrite)
        if rewrite is not None and rewrite.changed:
            data["model"] = rewrite.model
            # The proxy stamps the client's own model name on responses; LiteLLM's complexity router, which also
            # changes the model, sets this flag so the response's `model` is the one that served it. So do we.
            writable_metadata(data)[RETURN_RAW_MODEL_NAME_METADATA_KEY] = True
        return data

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        # Which model served the request, as Envoy's adapter says it too (the engine's `model` field agrees).
        found = metadata_of(data).get(REWRITE_KEY)
        if isinstance(found, dict) and isinstance(found.get("model"), str):
            return {SERVED_MODEL_HEADER: found["model"]}
        return None

    async def async_post_call_failure_deployment_hook(
        self,
        request_data: Any,
        exception: Exception,
        call_type: Any,
        fallback_depth: int | None = None,
    ) -> None:
        # Awaited before LiteLLM retries: the health mark must be in place when the retry is placed.
        await self._finish(request_data, failure_outcome(exception), settle=True)

    async def async_post_call_success_deployment_hook(
        self, request_data: dict[str, Any], response: Any, call_type: Any
    ) -> Any:
        # Awaited before LiteLLM returns a whole (non-streamed) response: the release is reported before the
        # caller can send its next request. Streams end later; async_log_success_event reports those.
        if getattr(response, "usage", None) is None or request_data.get("stream"):
            return None
        timing = getattr(request_data.get("litellm_logging_obj"), "model_call_details", None)
        outcome = success_outcome(timing if isinstance(timing, dict) else {}, response)
        await self._finish(request_data, outcome, settle=True)
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        await self._finish(kwargs, success_outcome(kwargs, response_obj))

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        await self._finish(kwargs, failure_outcome(kwargs.get("exception") if isinstance(kwargs, dict) else None))

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        # The proxy's per-stream hook: its first chunk means the prefill is over, so the request stops counting as
        # queued prefill at once rather than when a long stream ends (which made every engine look swamped).
        found = self._attempt(request_data)
        attempt = found[1] if found is not None else None
        first = True
        ended = False
        streamed = 0
        try:
            async for chunk in response:
                if first and attempt is not None:
                    first = False
                    attempt.first_token()  # never waits: the client's first token does not wait for the core
                streamed += 1
                yield chunk
            ended = True
        finally:
            if not ended and attempt is not None:
                # The client went away (the proxy closed this generator) before the stream's end; LiteLLM may never
                # log this stream's success, and a later call is ignored by the attempt. What it streamed is
                # settled, counted by the core's rule (cognitora.core.outcome.cancelled_stream).
                attempt.finish(cancelled_stream(streamed_chunks=streamed, detail="the client closed the stream"))

    # -- sync twins (Router.completion; LiteLLM also calls these from worker threads) ---------------------------
    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        found = self._attempt(kwargs)
        if found is not None:
            found[1].finish(success_outcome(kwargs, response_obj))

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        found = self._attempt(kwargs)
        if found is not None:
            found[1].finish(failure_outcome(kwargs.get("exception") if isinstance(kwargs, dict) else None))

    # -- helpers -----------------------------------------------------------------------------------------------
    def _attempt(self, kwargs: Any) -> tuple[CoreHost, Attempt] | None:
        rid = placement_id(kwargs) if isinstance(kwargs, dict) else None
        if rid is None:
            return None
        for host in list(self._hosts):
            attempt = host.attempt(rid)
            if attempt is not None:
                return host, attempt
        return None

    async def _finish(self, kwargs: Any, outcome: Outcome, *, settle: bool = False) -> None:
        found = self._attempt(kwargs)
        if found is None:
            return
        host, attempt = found
        attempt.finish(outcome)
        if not settle:
            return
        try:
            await host.call(lambda _: attempt.settled())
        except asyncio.CancelledError:
            raise
        except HostClosed:
            pass  # the strategy was uninstalled; its store is gone with it
        except Exception as exc:  # a logging callback must never fail the request it reports on
            log.warning("cognitora: could not report to the core: %s", exc)


SERVED_MODEL_HEADER = "x-cognitora-model"
"""The response header naming the model that served a request the ``intent`` policy decided (as through Envoy)."""

_REWRITTEN_CALLS = frozenset({"completion", "acompletion", "text_completion", "atext_completion"})
"""LiteLLM call types whose model the intent policy may rewrite (chat and completions, as Envoy places)."""


async def _rewrite(router: Router, req: RouteRequest) -> Rewrite | None:
    return await router.rewrite(req)
