"""Poll every engine's health route and /metrics; write one ``EndpointSnapshot`` per endpoint per round.

What a round does, per endpoint (all endpoints concurrently, each on its own fixed-rate ticker):

1. GET the engine's health route and, when it has one, its metrics route (and ``power_url``, a separate DCGM
   exporter, when configured; llama.cpp's ``/slots``, ``kvstate.slots``), concurrently, the whole round bounded
   by ``timeout_s``.
2. Health: a round fails when the health route does not answer with an accepted status in time. ``unhealthy_after``
   (default 2) CONSECUTIVE failed rounds mark the endpoint unhealthy; one good round marks it healthy again. With
   the timeout capped at one interval, a dead endpoint is unhealthy within ``unhealthy_after + 1`` intervals (3 by
   default) and a single blip never flips it.
3. Load: the metrics body is parsed by the engine's module (``kvstate.engines``) into an ``EngineLoad``. A body
   that is not Prometheus text is counted (``stats.garbage``) and the last good load is kept.
4. Rates: ``RateEstimator`` learns prefill and decode throughput and the mean service time from counter deltas
   (see its docstring); ``kvstate.energy.EnergyEstimator`` learns the marginal energy per token from the power
   meter. Both are learned here, once per fleet, and reach every gateway replica through the snapshot.
5. Store: ``put_snapshot``, with the store's count of the endpoint's cached blocks when its KV events feed the store
   (``ScrapeTarget.counts_blocks``, ``Store.cached_blocks``: how full its prefix cache is, read once a round for
   placement's tie-break). When the store is unreachable the outage
   is logged once, scraping goes on, and the first successful write logs the recovery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import httpx

from kvstate.energy import EnergyEstimator
from kvstate.engines import (
    ENGINES,
    EngineLoad,
    EngineRegistry,
    EngineSpec,
    MetricsParseError,
    dcgm,
    declared_clock,
    parse_prometheus_text,
)
from kvstate.rates import RateEstimator
from kvstate.slots import SlotsPoll
from kvstate.store import EndpointSnapshot, Store
from kvstate.task_stop import cancel_and_wait

__all__ = ["ScrapeStats", "ScrapeTarget", "Scraper", "base_url"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
DEFAULT_UNHEALTHY_AFTER = 2


@dataclass(frozen=True)
class ScrapeTarget:
    """One engine endpoint to poll."""

    endpoint_id: str
    """The id snapshots are stored under (``host:port``, as placement and the event subscriber name it)."""
    url: str
    """Base URL of the engine's HTTP server (``http://host:port``; a trailing ``/v1`` is ignored)."""
    engine: str
    """Engine kind, a key of the engine registry (``vllm``, ``sglang``, ...)."""
    power_url: str | None = None
    """Full URL of a separate DCGM exporter or node agent for this endpoint's GPUs (``http://host:9400/metrics``)."""
    power_gpus: tuple[str, ...] = ()
    """The GPUs on that page this endpoint uses (``gpu`` index as text, or ``UUID``); empty: every series on it."""
    counts_blocks: bool = False
    """The store is fed this endpoint's KV events, so its count of the endpoint's blocks says how full the engine's
    prefix cache is: each snapshot carries it (``EndpointSnapshot.cached_blocks``). False: the snapshot says None
    (without events the store holds no confirmed blocks there, and a count of 0 would read as an empty cache)."""


def base_url(url: str) -> str:
    """``http://h:p/v1/`` -> ``http://h:p``: routes like ``/health`` and ``/metrics`` live at the server root."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


@dataclass
class ScrapeStats:
    """Counters over the scraper's life, summed over endpoints."""

    rounds: int = 0
    """Endpoint scrape rounds attempted."""
    failures: int = 0
    """Rounds whose health check failed (refused, timed out, or a status the engine kind does not accept)."""
    metrics_failures: int = 0
    """Rounds where the health check passed but /metrics could not be fetched (transport error or non-2xx)."""
    garbage: int = 0
    """/metrics bodies that were not Prometheus text."""
    unrecognized: int = 0
    """/metrics bodies that parsed but held none of the engine kind's metric names (wrong ``engine:``?)."""
    store_failures: int = 0
    """Snapshot writes that failed (store unreachable)."""


@dataclass
class _Endpoint:
    """Per-endpoint scraping state."""

    target: ScrapeTarget
    spec: EngineSpec
    root: str
    estimator: RateEstimator
    energy: EnergyEstimator = field(default_factory=EnergyEstimator)
    healthy: bool | None = None
    """None until the first decision (never scraped successfully, and fewer than N failures so far)."""
    consecutive_failures: int = 0
    last_seen: float = 0.0
    load: EngineLoad = field(default_factory=EngineLoad)
    power: EngineLoad = field(default_factory=EngineLoad)
    """DCGM values from ``power_url`` (only power fields set)."""
    power_gpus_missing: list[str] = field(default_factory=list)
    """Mapped GPUs the power page did not show last time (logged when the set changes)."""
    metrics_broken: bool = False
    """The last metrics fetch failed or was garbage: log only the first of a streak."""
    snapshot: EndpointSnapshot | None = None
    slots: SlotsPoll | None = None
    """llama.cpp ``/slots``, when the engine kind has one and polling it is on (``kvstate.slots``)."""


class Scraper:
    """Polls ``endpoints`` every ``interval_s`` and writes their snapshots to ``store``.

    ``timeout_s`` bounds each round (default and maximum: ``interval_s``, so health is decided within
    ``unhealthy_after + 1`` intervals). ``start()`` / ``stop()`` run it in the background; ``scrape_all()`` runs one
    round of every endpoint now (tests, one-shot tools). ``rate`` is a template ``RateEstimator`` whose parameters
    are copied for each endpoint.
    """

    def __init__(
        self,
        store: Store,
        endpoints: Sequence[ScrapeTarget],
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float | None = None,
        *,
        unhealthy_after: int = DEFAULT_UNHEALTHY_AFTER,
        engines: EngineRegistry = ENGINES,
        rate: RateEstimator | None = None,
        poll_slots: bool = True,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"scrape interval must be positive, got {interval_s}")
        if unhealthy_after < 1:
            raise ValueError(f"unhealthy_after must be at least 1, got {unhealthy_after}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"scrape timeout must be positive, got {timeout_s}")
        if timeout_s is not None and timeout_s > interval_s:
            log.warning(
                "scrape timeout capped at the interval so a dead endpoint is noticed within a few intervals",
                extra={"timeout_s": timeout_s, "interval_s": interval_s},
            )
        self.store = store
        self.interval_s = interval_s
        self.timeout_s = min(timeout_s or interval_s, interval_s)
        self.unhealthy_after = unhealthy_after
        self.stats = ScrapeStats()
        self._endpoints: dict[str, _Endpoint] = {}
        for target in endpoints:
            if target.endpoint_id in self._endpoints:
                raise ValueError(f"endpoint id {target.endpoint_id!r} is listed twice")
            spec = engines.get(target.engine)
            root = base_url(target.url)
            self._endpoints[target.endpoint_id] = _Endpoint(
                target=target,
                spec=spec,
                root=root,
                estimator=replace(rate) if rate is not None else RateEstimator(),
                slots=SlotsPoll(target.endpoint_id, root + spec.slots_path) if poll_slots and spec.slots_path else None,
            )
        self._client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._store_down = False

    # -- lifecycle ------------------------------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # trust_env=False: engines sit on the cluster network; a desktop HTTP(S)_PROXY must not reroute them.
            # No pool cap: a round waiting for a pooled connection would time out and count against health.
            # Keep-alive for up to 4 connections per endpoint (health, metrics, power exporter, llama.cpp /slots).
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(20, 4 * len(self._endpoints)))
            self._client = httpx.AsyncClient(
                timeout=self.timeout_s, trust_env=False, follow_redirects=True, limits=limits
            )
        return self._client

    async def start(self) -> None:
        if self._tasks:
            return
        count = max(len(self._endpoints), 1)
        for i, endpoint in enumerate(self._endpoints.values()):
            # Spread endpoints over the interval so a large fleet is not scraped in one burst.
            offset = self.interval_s * i / count
            self._tasks.append(asyncio.create_task(self._run(endpoint, offset), name=f"scrape {endpoint.root}"))

    async def stop(self) -> None:
        await asyncio.gather(*(cancel_and_wait(task) for task in self._tasks), return_exceptions=True)
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self, endpoint: _Endpoint, offset: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + offset
        while True:
            await asyncio.sleep(max(due - loop.time(), 0.0))
            try:
                await self.scrape(endpoint.target.endpoint_id)
            except Exception:  # a bug in one round must not end this endpoint's scraping for good
                log.exception("scrape round failed", extra={"endpoint": endpoint.target.endpoint_id})
            due += self.interval_s
            now = loop.time()
            if due < now:  # fell behind (slow store): skip the missed ticks rather than burst
                due = now

    # -- one round ------------------------------------------------------------------------------------------
    async def scrape_all(self) -> None:
        """One round of every endpoint, concurrently."""
        await asyncio.gather(*(self.scrape(endpoint_id) for endpoint_id in self._endpoints))

    async def scrape(self, endpoint_id: str) -> EndpointSnapshot | None:
        """Scrape one endpoint once, update its state and store its snapshot (None until health is decided)."""
        endpoint = self._endpoints[endpoint_id]
        spec = endpoint.spec
        self.stats.rounds += 1
        metrics_url = None if spec.metrics_path is None else endpoint.root + spec.metrics_path
        slots_url = None if endpoint.slots is None else endpoint.slots.poll_url()
        try:
            async with asyncio.timeout(self.timeout_s):
                health, metrics, power, slots = await asyncio.gather(
                    self._get(endpoint.root + spec.health_path),
                    self._get(metrics_url),
                    self._get(endpoint.target.power_url),
                    self._get(slots_url),
                )
        except TimeoutError:
            health = metrics = power = slots = None
        if isinstance(health, httpx.Response) and spec.healthy_status(health.status_code):
            self._on_success(endpoint)
            self._read_metrics(endpoint, metrics)
            self._read_power(endpoint, power)
            if endpoint.slots is not None:
                endpoint.slots.read(slots)
        else:
            self._on_failure(endpoint)
        if endpoint.healthy is None:
            return None
        endpoint.snapshot = await self._put(self._snapshot_of(endpoint), endpoint.target.counts_blocks)
        return endpoint.snapshot

    async def _get(self, url: str | None) -> httpx.Response | httpx.HTTPError | None:
        """GET ``url``: the response, or the transport error (None when there is nothing to fetch)."""
        if url is None:
            return None
        try:
            return await self._http().get(url)
        except httpx.HTTPError as exc:
            return exc

    def _body(self, endpoint: _Endpoint, what: str, result: httpx.Response | httpx.HTTPError | None) -> str | None:
        """The text of a 2xx response; anything else is counted as a metrics failure and logged once per streak."""
        if result is None:
            return None
        if isinstance(result, httpx.Response) and result.is_success:
            return result.text
        self.stats.metrics_failures += 1
        reason = repr(result) if isinstance(result, Exception) else f"HTTP {result.status_code}"
        self._metrics_problem(endpoint, f"{what} fetch failed", reason)
        return None

    def _metrics_problem(self, endpoint: _Endpoint, msg: str, reason: str) -> None:
        if not endpoint.metrics_broken:
            log.warning(msg, extra={"endpoint": endpoint.target.endpoint_id, "reason": reason})
        endpoint.metrics_broken = True

    def _on_success(self, endpoint: _Endpoint) -> None:
        if endpoint.healthy is False:
            log.info("endpoint healthy again", extra={"endpoint": endpoint.target.endpoint_id})
        endpoint.healthy = True
        endpoint.consecutive_failures = 0
        endpoint.last_seen = time.time()

    def _read_metrics(self, endpoint: _Endpoint, result: httpx.Response | httpx.HTTPError | None) -> None:
        body = self._body(endpoint, "metrics", result)
        if body is None:
            return
        load = self._parse(endpoint, body)
        if load is not None:
            endpoint.load = load
            endpoint.estimator.observe(load, time.monotonic())

    def _read_power(self, endpoint: _Endpoint, result: httpx.Response | httpx.HTTPError | None) -> None:
        body = self._body(endpoint, "power exporter", result)
        if body is None:
            return
        try:
            samples = parse_prometheus_text(body)
        except MetricsParseError as exc:
            self.stats.garbage += 1
            self._metrics_problem(endpoint, "power exporter body is not Prometheus text", str(exc))
            return
        gpus = endpoint.target.power_gpus
        if gpus:
            missing = sorted(set(gpus) - dcgm.gpus_shown(samples))
            if missing and missing != endpoint.power_gpus_missing:
                log.warning(
                    "power exporter shows no power series for some of the endpoint's GPUs",
                    extra={"endpoint": endpoint.target.endpoint_id, "missing_gpus": missing},
                )
            endpoint.power_gpus_missing = missing
            samples = dcgm.only_gpus(samples, gpus)
        endpoint.power = EngineLoad(power_watts=dcgm.power_watts(samples), energy_joules=dcgm.energy_joules(samples))

    def _parse(self, endpoint: _Endpoint, body: str) -> EngineLoad | None:
        try:
            samples = parse_prometheus_text(body)
        except MetricsParseError as exc:
            self.stats.garbage += 1
            self._metrics_problem(endpoint, "metrics body is not Prometheus text", str(exc))
            return None
        if not endpoint.spec.recognizes(samples):
            self.stats.unrecognized += 1
            self._metrics_problem(
                endpoint,
                f"metrics hold none of the {endpoint.spec.kind} metric names: is the engine kind right?",
                f"{len(samples)} samples",
            )
            return None
        if endpoint.metrics_broken:
            log.info("metrics readable again", extra={"endpoint": endpoint.target.endpoint_id})
        endpoint.metrics_broken = False
        return replace(endpoint.spec.load_from(samples), clock_rate=declared_clock.declared_clock_rate(samples))

    def _on_failure(self, endpoint: _Endpoint) -> None:
        self.stats.failures += 1
        endpoint.consecutive_failures += 1
        # Counters across an outage may belong to a restarted process: never take a delta across one.
        endpoint.estimator.restart_windows()
        if endpoint.consecutive_failures >= self.unhealthy_after and endpoint.healthy is not False:
            log.warning(
                "endpoint unhealthy",
                extra={
                    "endpoint": endpoint.target.endpoint_id,
                    "consecutive_failures": endpoint.consecutive_failures,
                },
            )
            endpoint.healthy = False

    def _snapshot_of(self, endpoint: _Endpoint) -> EndpointSnapshot:
        """What this round saw and learned, energy per token included (learned from this very snapshot)."""
        load, spec = endpoint.load, endpoint.spec
        watts = endpoint.power.power_watts if endpoint.power.power_watts is not None else load.power_watts
        joules = endpoint.power.energy_joules if endpoint.power.energy_joules is not None else load.energy_joules
        seen = EndpointSnapshot(
            endpoint=endpoint.target.endpoint_id,
            healthy=bool(endpoint.healthy),
            last_seen=endpoint.last_seen,
            running=int(load.running or 0),
            waiting=int(load.waiting or 0),
            kv_usage=min(max(load.kv_usage or 0.0, 0.0), 1.0),
            prefill_tokens_per_s=endpoint.estimator.prefill_tokens_per_s,
            prefill_rate_from_short_prompts=endpoint.estimator.prefill_rate_from_short_prompts,
            prefill_rate_prompt_tokens=endpoint.estimator.prefill_rate_prompt_tokens,
            short_prompt_prefill_s=endpoint.estimator.short_prompt_prefill_s,
            decode_tokens_per_s=endpoint.estimator.decode_tokens_per_s,
            power_watts=watts or 0.0,
            energy_joules=joules or 0.0,
            block_size=load.block_size or spec.default_block_size or 0,
            kv_capacity_tokens=(load.kv_blocks or 0) * (load.block_size or spec.default_block_size or 0),
            consecutive_failures=endpoint.consecutive_failures,
            mean_service_s=endpoint.estimator.mean_service_s or None,
            # A declared clock (the simulator's) is exact, the learned one an estimate (engines.declared_clock)
            clock_rate=load.clock_rate or endpoint.estimator.clock_rate or None,
            clock_declared=load.clock_rate is not None,
            prompt_tokens_total=load.prompt_tokens_total,
            generation_tokens_total=load.generation_tokens_total,
            prefix_cache_hits_total=load.prefix_cache_hits_total,
            prefix_cache_queries_total=load.prefix_cache_queries_total,
            requests_finished_total=load.requests_finished_total,
        )
        if endpoint.slots is not None:
            seen = endpoint.slots.apply(seen)
        endpoint.energy.observe(seen)
        return replace(seen, joules_per_token=endpoint.energy.joules_per_token)

    async def _put(self, snapshot: EndpointSnapshot, count_blocks: bool) -> EndpointSnapshot:
        """Store ``snapshot``, with ``count_blocks`` the store's count of the endpoint's cached blocks; the snapshot as
        written (without the count when the store did not answer)."""
        try:
            async with asyncio.timeout(self.interval_s):
                if count_blocks:
                    # Counted here, once a round, so that placement reads it from the snapshot rather than asking
                    # the store on every decision.
                    snapshot = replace(snapshot, cached_blocks=await self.store.cached_blocks(snapshot.endpoint))
                await self.store.put_snapshot(snapshot)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # StoreUnavailable, or a client error the backend did not wrap: same outage
            self.stats.store_failures += 1
            if not self._store_down:
                log.warning("store unavailable; still scraping", extra={"reason": repr(exc)})
                self._store_down = True
            return snapshot
        if self._store_down:
            log.info("store reachable again")
            self._store_down = False
        return snapshot

    # -- reading state --------------------------------------------------------------------------------------
    def snapshot(self, endpoint_id: str) -> EndpointSnapshot | None:
        """The last snapshot written for ``endpoint_id`` (None before health was first decided)."""
        return self._endpoints[endpoint_id].snapshot

    def targets(self) -> list[ScrapeTarget]:
        """What it scrapes, in order (a collector's reload keeps this scraper when they are unchanged)."""
        return [endpoint.target for endpoint in self._endpoints.values()]

    def endpoint_ids(self) -> list[str]:
        return list(self._endpoints)
