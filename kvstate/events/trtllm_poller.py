"""Pulls one TensorRT-LLM engine's KV-cache events (``POST /kv_cache_events``) into the store.

``trtllm-serve`` does not push its events (unless configured with ``kv_events_config``, which publishes vLLM-format
batches over ZMQ: that endpoint gets ``kv_events:`` and a ``KVEventSubscriber`` instead). Each call drains the
engine's buffer (enabled with ``kv_cache_config: {enable_block_reuse: true, event_buffer_max_size: N}``), so this
poller asks every ``interval_s`` and applies the answer, decoded by ``kvstate.events.trtllm``, through the model's
``EventIngestor``: the same block keys as every other engine, recomputed from the tokens.

What can go wrong, and what it does:

- 404 or 405: this server has no events route (an older release): polling stops, logged once.
- A transport error or another status: counted, tried again next interval (the engine may be restarting).
- A body that does not decode, or a store write that fails: the drained events are lost (there is no replay), so
  what the store says of this endpoint may be wrong. The endpoint is purged (its blocks forgotten) before the
  next batch is applied: forgetting costs some cache hits, remembering wrongly would send requests to blocks the
  engine no longer has.
- ``created`` (the engine started, or restarted with an empty cache) purges the endpoint, like vLLM's
  ``AllBlocksCleared``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx

from kvstate.engines import trtllm
from kvstate.events.ingest import EventIngestor
from kvstate.events.model import EventDecodeError
from kvstate.events.trtllm import decode_events
from kvstate.task_stop import cancel_and_wait

__all__ = ["PollStats", "TrtllmEventPoller"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.25
ABSENT_STATUSES = frozenset({404, 405})


@dataclass
class PollStats:
    polls: int = 0
    """Requests made."""
    applied: int = 0
    """Non-empty answers applied to the store."""
    events: int = 0
    """Events decoded from those answers."""
    malformed: int = 0
    """Answers that did not decode (their events are lost; the endpoint was purged)."""
    failures: int = 0
    """Polls that got no answer (transport error, timeout, an unexpected status)."""
    purges: int = 0
    """Times the endpoint's blocks were forgotten (engine restarted, events lost)."""
    store_errors: int = 0


class TrtllmEventPoller:
    """Polls ``url`` (the engine's base URL) for ``endpoint`` and applies what it drains through ``ingestor``."""

    def __init__(
        self,
        endpoint: str,
        url: str,
        ingestor: EventIngestor,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"poll interval must be positive, got {interval_s}")
        self.endpoint = endpoint
        self.events_url = url.rstrip("/").removesuffix("/v1") + trtllm.KV_EVENTS_PATH
        self.ingestor = ingestor
        self.interval_s = interval_s
        self.timeout_s = timeout_s or max(interval_s, 1.0)
        self.stats = PollStats()
        self.enabled = True
        self._purge_needed = False
        self._broken = False
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"trtllm events {self.endpoint}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while self.enabled:
            try:
                await self.poll_once()
            except Exception:  # a bug in one poll must not end this endpoint's events for good
                log.exception("TRT-LLM event poll failed", extra={"endpoint": self.endpoint})
                self._purge_needed = True
            await asyncio.sleep(self.interval_s)

    async def poll_once(self) -> int:
        """One drain: returns how many events were applied (0 when there were none or the poll failed)."""
        if not self.enabled:
            return 0
        if self._client is None:
            # trust_env=False: engines sit on the cluster network; a desktop HTTP(S)_PROXY must not reroute them.
            self._client = httpx.AsyncClient(timeout=self.timeout_s, trust_env=False)
        self.stats.polls += 1
        try:
            response = await self._client.post(self.events_url)
        except httpx.HTTPError as exc:
            return self._failed(repr(exc))
        if response.status_code in ABSENT_STATUSES:
            self.enabled = False
            log.warning(
                "TRT-LLM engine serves no /kv_cache_events; prefix affinity for it from routing history only",
                extra={"endpoint": self.endpoint, "status": response.status_code},
            )
            return 0
        if not response.is_success:
            return self._failed(f"HTTP {response.status_code}")
        try:
            batch = decode_events(response.content)
        except EventDecodeError as exc:
            self.stats.malformed += 1
            log.warning(
                "TRT-LLM events skipped; endpoint will be purged", extra={"endpoint": self.endpoint, "reason": str(exc)}
            )
            self._purge_needed = True
            return 0
        self._broken = False
        if not batch.events and not self._purge_needed:
            return 0
        try:
            if self._purge_needed:
                await self.ingestor.purge(self.endpoint)
                self.stats.purges += 1
                self._purge_needed = False
            result = await self.ingestor.apply(self.endpoint, batch)
        except Exception as exc:  # StoreUnavailable or a driver error: these events are lost, start over
            self.stats.store_errors += 1
            self._purge_needed = True
            log.warning(
                "store write of TRT-LLM events failed; endpoint will be purged",
                extra={"endpoint": self.endpoint, "reason": repr(exc)},
            )
            return 0
        if result.cleared:
            self.stats.purges += 1
        self.stats.applied += 1
        self.stats.events += len(batch.events)
        return len(batch.events)

    def _failed(self, reason: str) -> int:
        self.stats.failures += 1
        if not self._broken:
            log.warning("TRT-LLM event poll got no answer", extra={"endpoint": self.endpoint, "reason": reason})
        self._broken = True
        return 0
