"""``cognitora``: the LiteLLM callback that reports each placed attempt's end to the core.

In a proxy config this is also the ONE line that loads the plugin before LiteLLM builds its Router::

    litellm_settings:
      callbacks: ["litellm_plugin.callbacks.cognitora"]

(importing this module registers the ``cognitora`` strategy name). Strategies add the same instance to
``litellm.callbacks`` themselves, so SDK users need no callback line.

What each LiteLLM hook becomes:

- ``async_post_call_failure_deployment_hook`` (once per failed attempt, awaited before LiteLLM retries):
  ``Router.mark_unhealthy`` when the engine is unreachable, then ``Router.finished`` with a failed Outcome; the
  retry re-enters the strategy, which no longer picks that engine;
- ``async_post_call_success_deployment_hook`` (awaited before a whole response is returned) and, for streams,
  ``async_log_success_event`` (at the stream's end, with the full usage): ``Router.finished`` with usage and
  ``cached_tokens``;
- ``async_log_failure_event`` and the sync ``log_*`` twins: settle whatever attempt is still open;
- ``async_post_call_streaming_iterator_hook`` (the proxy wraps every stream in it): the first chunk reports
  ``Router.first_token``, so a stream's prefill stops counting as queued work as soon as it is done. The SDK
  (``Router.acompletion`` without the proxy) has no per-chunk hook: there a stream's prefill counts as queued until
  the stream ends, and its queue estimate is pessimistic for long streams.

The ledger makes sure each attempt is reported once whichever of these fire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from cognitora.request import Outcome
from cognitora.router import Router
from litellm_plugin.ledger import Placement, PlacementLedger
from litellm_plugin.register import register
from litellm_plugin.runtime import HostClosed, wait_spawned
from litellm_plugin.translate import failure_outcome, placement_id, success_outcome, unreachable_reason

# Importing this module is what the proxy's `litellm_settings.callbacks` line does, before it builds its Router.
register()

log = logging.getLogger("cognitora.litellm")


async def settle(router: Router, placement: Placement, outcome: Outcome, unreachable: str | None) -> None:
    """On the core's loop: the attempt is over. Its dispatch write lands first, so the release never precedes it."""
    if placement.dispatch is not None:
        await wait_spawned(placement.dispatch)
    decision = placement.decision
    if unreachable is not None and decision.endpoint is not None:
        await router.mark_unhealthy(decision.endpoint, unreachable)
    await router.finished(decision, outcome)


class CognitoraCallbacks(CustomLogger):
    """Reports attempts' ends (see the module docstring). One instance per process: ``cognitora``."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = PlacementLedger()

    # -- async hooks (the proxy and acompletion) ----------------------------------------------------------------
    async def async_post_call_failure_deployment_hook(
        self,
        request_data: Any,
        exception: Exception,
        call_type: Any,
        fallback_depth: int | None = None,
    ) -> None:
        await self._failed(request_data, exception)

    async def async_post_call_success_deployment_hook(
        self, request_data: dict[str, Any], response: Any, call_type: Any
    ) -> Any:
        # Awaited before LiteLLM returns a whole (non-streamed) response: the release is reported before the
        # caller can send its next request. Streams end later; async_log_success_event reports those.
        if getattr(response, "usage", None) is None or request_data.get("stream"):
            return None
        placement = self._take(request_data)
        if placement is not None:
            timing = getattr(request_data.get("litellm_logging_obj"), "model_call_details", None)
            outcome = success_outcome(placement.decision, timing if isinstance(timing, dict) else {}, response)
            await self._guarded(placement.host.call(lambda router: settle(router, placement, outcome, None)))
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        placement = self._take(kwargs)
        if placement is not None:
            outcome = success_outcome(placement.decision, kwargs, response_obj)
            await self._guarded(placement.host.call(lambda router: settle(router, placement, outcome, None)))

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        await self._failed(kwargs, kwargs.get("exception") if isinstance(kwargs, dict) else None)

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        # The proxy's per-stream hook: its first chunk means the prefill is over, so the request stops counting as
        # queued prefill at once rather than when a long stream ends (which made every engine look swamped).
        pid = placement_id(request_data)
        placement = self.ledger.get(pid) if pid else None
        async for chunk in response:
            if placement is not None:
                first, placement = placement, None
                # Not awaited: the client's first token never waits for the core.
                with contextlib.suppress(HostClosed):
                    first.host.spawn(lambda router, d=first.decision: router.first_token(d))  # type: ignore[misc]
            yield chunk

    # -- sync twins (Router.completion; LiteLLM also calls these from worker threads) ---------------------------
    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        placement = self._take(kwargs)
        if placement is not None:
            outcome = success_outcome(placement.decision, kwargs, response_obj)
            self._from_sync(placement, lambda router: settle(router, placement, outcome, None))

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        placement = self._take(kwargs)
        if placement is not None:
            error = kwargs.get("exception") if isinstance(kwargs, dict) else None
            outcome = failure_outcome(placement.decision, error or "request failed")
            reason = unreachable_reason(error)
            self._from_sync(placement, lambda router: settle(router, placement, outcome, reason))

    # -- helpers -----------------------------------------------------------------------------------------------
    def _take(self, kwargs: Any) -> Placement | None:
        pid = placement_id(kwargs) if isinstance(kwargs, dict) else None
        return self.ledger.take(pid) if pid else None

    async def _failed(self, kwargs: Any, error: BaseException | None) -> None:
        placement = self._take(kwargs)
        if placement is None:
            return
        outcome = failure_outcome(placement.decision, error or "request failed")
        reason = unreachable_reason(error)
        await self._guarded(placement.host.call(lambda router: settle(router, placement, outcome, reason)))

    def _from_sync(self, placement: Placement, fn: Any) -> None:
        try:
            placement.host.call_from_sync_callback(fn)
        except HostClosed:
            pass  # the strategy was uninstalled; its store is gone with it
        except Exception as exc:  # a logging callback must never fail the request it reports on
            log.warning("cognitora: could not report an attempt's end: %s", exc)

    @staticmethod
    async def _guarded(call: Any) -> None:
        try:
            await call
        except asyncio.CancelledError:
            raise
        except HostClosed:
            pass  # the strategy was uninstalled; its store is gone with it
        except Exception as exc:  # a logging callback must never fail the request it reports on
            log.warning("cognitora: could not report to the core: %s", exc)


cognitora = CognitoraCallbacks()
"""The instance named in ``litellm_settings.callbacks`` (LiteLLM wants an instance, not a class)."""
