"""Whether an endpoint's cache is known from its own KV events, pushed or pulled, and where its streams are.

Pushed: ``kv_events:`` names a ZMQ stream (vLLM, SGLang, TRT-LLM's ``kv_events_config``). Pulled: an
``engine: trtllm`` endpoint without one has its ``POST /kv_cache_events`` drained by the collector
(``engine_pulls.trtllm_kv_events``, on by default). The collector, the router's routing-history TTL and
``cognitora explain`` must agree on this, so it is decided here once.

Discovered: an ``engine: vllm`` endpoint without ``kv_events`` has its streams read from the engine's own
``GET /kv_event_sources`` (every data-parallel rank's), re-read every ``engine_pulls.vllm_kv_event_sources_interval_s``
so a restarted engine's new ports are followed (``KvEventSourceWatcher``, run by the collector). Whether such an
engine publishes anything is known only once it answers, so the router keeps counting its routing history for it
(``reports_kv_events`` is False): events, when they come, confirm and correct what that history predicts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from cognitora.config import EndpointConfig, EngineKind
from kvstate.task_stop import cancel_and_wait

__all__ = [
    "KvEventSource",
    "KvEventSourceWatcher",
    "discovers_kv_events",
    "pulls_trtllm_events",
    "reports_kv_events",
    "sources_from",
]

log = logging.getLogger(__name__)


def pulls_trtllm_events(endpoint: EndpointConfig, pull_enabled: bool = True) -> bool:
    """A TRT-LLM endpoint without a ZMQ stream has its events pulled over HTTP, unless pulling is turned off."""
    return endpoint.engine == EngineKind.TRTLLM and endpoint.kv_events is None and pull_enabled


def reports_kv_events(endpoint: EndpointConfig, pull_enabled: bool = True) -> bool:
    """The engine tells what it caches (pushed or pulled events); otherwise routing history is all there is."""
    return endpoint.kv_events is not None or pulls_trtllm_events(endpoint, pull_enabled)


# -- discovery: vLLM's GET /kv_event_sources ----------------------------------------------------------------------

KV_EVENT_SOURCES_PATH = "/kv_event_sources"
"""vLLM (0.32 at least) answers with each data-parallel rank's resolved ``KVEventsConfig``:
``{"0": {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint":
"tcp://*:5558", "topic": "", ...}, "1": {... "tcp://*:5558" ...}}`` (each rank's ports already offset by its rank);
``{}`` when the engine publishes no events."""

_WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "[::]", "::"})


@dataclass(frozen=True)
class KvEventSource:
    """One data-parallel rank's event stream, as a subscriber connects to it."""

    rank: int
    publisher: str
    """``tcp://HOST:PORT`` of the rank's PUB socket (a wildcard bind is reached at the engine's own host)."""
    replay: str | None
    """Its ROUTER for replays, when the engine serves one."""


def discovers_kv_events(endpoint: EndpointConfig, enabled: bool = True) -> bool:
    """A vLLM endpoint without ``kv_events`` has its streams read from ``GET /kv_event_sources``, unless turned off."""
    return endpoint.engine == EngineKind.VLLM and endpoint.kv_events is None and enabled


def _reachable(address: str, engine_host: str) -> str:
    """Where a subscriber reaches ``address`` as the engine wrote it: a wildcard bind (``tcp://*:P``) at the engine's
    host; anything else as written (``tcp://*:0`` comes back from vLLM already resolved to the node's address)."""
    if not address.startswith("tcp://"):
        return address
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if sep and host in _WILDCARD_HOSTS:
        return f"tcp://{engine_host}:{port}"
    return address


def sources_from(body: object, engine_url: str) -> tuple[list[KvEventSource], list[str]]:
    """``GET /kv_event_sources`` -> the streams to subscribe to, rank by rank, and what could not be used (why).

    Raises ``ValueError`` when the body is not that endpoint's shape at all."""
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object of data-parallel ranks, got {type(body).__name__}")
    host = urlsplit(engine_url).hostname or "127.0.0.1"
    engine_host = f"[{host}]" if ":" in host else host
    sources: list[KvEventSource] = []
    problems: list[str] = []
    for rank_text, config in sorted(body.items(), key=lambda item: str(item[0])):
        try:
            rank = int(rank_text)
        except ValueError:
            raise ValueError(f"rank {rank_text!r} is not an integer") from None
        if not isinstance(config, dict):
            raise ValueError(f"rank {rank}: expected a KVEventsConfig object, got {type(config).__name__}")
        if not config.get("enable_kv_cache_events") or config.get("publisher") != "zmq":
            problems.append(f"rank {rank} publishes no KV events over ZMQ (publisher {config.get('publisher')!r})")
            continue
        endpoint = config.get("endpoint")
        if not isinstance(endpoint, str) or endpoint.startswith("inproc://"):
            problems.append(f"rank {rank}: events endpoint {endpoint!r} cannot be reached from another process")
            continue
        replay = config.get("replay_endpoint")
        replay = _reachable(replay, engine_host) if isinstance(replay, str) and replay else None
        sources.append(KvEventSource(rank, _reachable(endpoint, engine_host), replay))
    return sources, problems


async def read_kv_event_sources(
    client: httpx.AsyncClient, engine_url: str
) -> tuple[list[KvEventSource], list[str]] | None:
    """Ask the engine once; None when it has no such route (404: vLLM before it, or not vLLM)."""
    response = await client.get(engine_url.rstrip("/") + KV_EVENT_SOURCES_PATH)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return sources_from(response.json(), engine_url)


class KvEventSourceWatcher:
    """Reads one vLLM endpoint's ``GET /kv_event_sources`` every ``interval_s`` and calls ``on_change`` with the
    streams whenever what it says changes: at the first answer, and when a restarted engine comes back with other
    ports or ranks. An engine that does not answer (down, restarting) keeps its current streams; their subscribers
    resync by themselves when it returns on the same ports."""

    def __init__(
        self,
        endpoint: str,
        url: str,
        on_change: Callable[[list[KvEventSource]], Awaitable[None]],
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.endpoint = endpoint
        self.url = url
        self.on_change = on_change
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.current: list[KvEventSource] | None = None
        self.reads = 0
        self.failures = 0
        self._said: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-event-sources-{self.endpoint}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def _say_once(self, level: int, message: str, **extra: object) -> None:
        """Log a state of the discovery once, not every interval."""
        if message != self._said:
            self._said = message
            log.log(level, message, extra={"endpoint": self.endpoint, **extra})

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            while True:
                await self.read_once(client)
                await asyncio.sleep(self.interval_s)

    async def read_once(self, client: httpx.AsyncClient) -> None:
        self.reads += 1
        try:
            answer = await read_kv_event_sources(client, self.url)
        except (httpx.HTTPError, ValueError) as exc:
            self.failures += 1
            self._say_once(logging.DEBUG, f"{KV_EVENT_SOURCES_PATH} not read", error=str(exc))
            return
        if answer is None:
            self._say_once(
                logging.WARNING,
                f"no {KV_EVENT_SOURCES_PATH} on this engine (vLLM before 0.32?): set kv_events for it; placement "
                "uses routing history meanwhile",
            )
            return
        sources, problems = answer
        if problems:
            self._say_once(logging.WARNING, "some KV event sources cannot be subscribed to", problems=problems)
        if sources != self.current:
            log.info(
                "KV event sources discovered",
                extra={
                    "endpoint": self.endpoint,
                    "sources": [{"rank": s.rank, "publisher": s.publisher, "replay": s.replay} for s in sources],
                },
            )
            self.current = sources
            await self.on_change(sources)
