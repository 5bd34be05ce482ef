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
5. Store: ``put_snapshot``. When the store is unreachable the outage is logged once, scraping goes on, and the
   first successful write logs the recovery.
"""

from __future__ import annotations

import asyncio
import logging
import math
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
    parse_prometheus_text,
)
from kvstate.slots import SlotsPoll
from kvstate.store import EndpointSnapshot, Store

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
class RateEstimator:
    """Learns an endpoint's prefill and decode throughput (tokens/s) from its cumulative counters.

    Prefill: what we want is the capacity C, in uncached prompt tokens per second. Over a window between two
    scrapes the engine processed ``dT = d(prompt_tokens) - d(prefix_cache_hits)`` uncached tokens. Two estimators:

    - per-request rate ``dT / d(busy)``, where ``busy`` is per-request prefill time: the engine's own measure when
      it has one (vLLM ``request_prefill_time_seconds``, llama.cpp ``prompt_seconds``), else the TTFT histogram sum
      minus the queue-time sum, else the TTFT sum. A request of n tokens needs at least n/C seconds, more when it
      shares its batch, and TTFT adds queueing on top, so this is a sound LOWER bound of C: numerator and
      denominator are counted at the same moment (the first token). Its window closes once it holds
      ``min_prefill_tokens``, so a trickle of tiny requests (all fixed overhead) becomes one meaningful sample.
    - throughput ``dT / d(wall time)`` over windows of at least ``throughput_window_s``: also <= C over a long
      window, and close to C whenever the engine was saturated, which is exactly when a TTFT-based per-request
      rate is pessimistic (queueing inflates TTFT). Used ONLY for engines that expose no queue-free busy time
      (neither a prefill-time nor a queue-time histogram: SGLang, old vLLM), because it is measured on the wall
      clock while the histograms are on the engine's clock, and the two differ for a time-scaled simulator.
      Short windows are not used: counters jump when a long prompt finishes, so a one-interval window can
      show more than C.

    Each is smoothed by an EWMA (``alpha``); the estimate is the larger of the two (the tighter lower bound).

    Decode: the per-sequence decode speed ``d(itl_count) / d(itl_sum)``, i.e. 1 / mean inter-token latency
    (llama.cpp: tokens predicted / seconds predicting), EWMA-smoothed, once ``min_decode_tokens`` were generated.

    Service: the mean time a request holds a batch slot (scheduled to finished, queueing excluded), the W of
    Little's law that placement turns into a departure rate (``running / mean_service_s``). From the engine's own
    histogram when it has one (vLLM ``request_inference_time_seconds``: ``d(sum) / d(count)``), else as mean
    generated tokens per finished request over the learned per-sequence decode speed
    (``d(generation_tokens) / d(requests_finished) / decode_tokens_per_s``). A window closes once
    ``min_service_requests`` requests finished in it, EWMA-smoothed like the rest.

    Counter resets (engine restart: a counter went down) and health failures restart the windows; what was learned
    is kept, since the hardware did not change. 0.0 means "not learned yet".
    """

    alpha: float = 0.3
    min_prefill_tokens: float = 256.0
    throughput_window_s: float = 10.0
    min_decode_tokens: float = 64.0
    min_service_requests: float = 4.0
    per_request_prefill: float = 0.0
    throughput_prefill: float = 0.0
    decode_tokens_per_s: float = 0.0
    mean_service_s: float = 0.0
    _request_base: EngineLoad | None = field(default=None, repr=False)
    _throughput_base: tuple[EngineLoad, float] | None = field(default=None, repr=False)
    _decode_base: EngineLoad | None = field(default=None, repr=False)
    _service_base: EngineLoad | None = field(default=None, repr=False)

    @property
    def prefill_tokens_per_s(self) -> float:
        return max(self.per_request_prefill, self.throughput_prefill)

    def restart_windows(self) -> None:
        self._request_base = None
        self._throughput_base = None
        self._decode_base = None
        self._service_base = None

    def observe(self, load: EngineLoad, now: float) -> None:
        """Feed one scrape taken at monotonic time ``now`` (seconds)."""
        bases = [self._request_base, self._decode_base, self._service_base]
        if self._throughput_base is not None:
            bases.append(self._throughput_base[0])
        if any(base is not None and counters_went_down(base, load) for base in bases):
            self.restart_windows()
        if self._request_base is None or self._per_request_sample(self._request_base, load):
            self._request_base = load
        if not has_queue_free_busy_time(load) and (
            self._throughput_base is None or self._throughput_sample(self._throughput_base, load, now)
        ):
            self._throughput_base = (load, now)
        if self._decode_base is None or self._decode_sample(self._decode_base, load):
            self._decode_base = load
        if self._service_base is None or self._service_sample(self._service_base, load):
            self._service_base = load

    def _per_request_sample(self, old: EngineLoad, load: EngineLoad) -> bool:
        """Update from the window ``old`` .. ``load``; False while the window is still too small to close."""
        tokens = uncached_prompt_tokens(old, load)
        if tokens is None:
            return True  # this engine does not count prompt tokens: nothing to learn
        if tokens < self.min_prefill_tokens:
            return False
        busy = busy_prefill_seconds(old, load)
        if busy is not None and busy > 0:
            self.per_request_prefill = ewma(self.per_request_prefill, tokens / busy, self.alpha)
        return True

    def _throughput_sample(self, base: tuple[EngineLoad, float], load: EngineLoad, now: float) -> bool:
        old, then = base
        tokens = uncached_prompt_tokens(old, load)
        if tokens is None:
            return True
        if now - then < self.throughput_window_s or tokens < self.min_prefill_tokens:
            return False
        self.throughput_prefill = ewma(self.throughput_prefill, tokens / (now - then), self.alpha)
        return True

    def _decode_sample(self, old: EngineLoad, load: EngineLoad) -> bool:
        count = delta(old.itl_count, load.itl_count)
        seconds = delta(old.itl_seconds_sum, load.itl_seconds_sum)
        if count is None or seconds is None:
            return True
        generated = delta(old.generation_tokens_total, load.generation_tokens_total)
        # TRT-LLM's time-per-output-token histogram counts requests, not tokens: judge the window by tokens made.
        if (generated if generated is not None else count) < self.min_decode_tokens:
            return False
        if count > 0 and seconds > 0:
            self.decode_tokens_per_s = ewma(self.decode_tokens_per_s, count / seconds, self.alpha)
        return True

    def _service_sample(self, old: EngineLoad, load: EngineLoad) -> bool:
        count = delta(old.service_count, load.service_count)
        if count is not None:
            seconds = delta(old.service_seconds_sum, load.service_seconds_sum)
            if count < self.min_service_requests:
                return False
            if seconds is not None and seconds > 0:
                self.mean_service_s = ewma(self.mean_service_s, seconds / count, self.alpha)
            return True
        finished = delta(old.requests_finished_total, load.requests_finished_total)
        generated = delta(old.generation_tokens_total, load.generation_tokens_total)
        if finished is None or generated is None:
            return True  # neither source: nothing to learn
        if finished < self.min_service_requests:
            return False
        if self.decode_tokens_per_s > 0 and generated > 0:
            self.mean_service_s = ewma(self.mean_service_s, generated / finished / self.decode_tokens_per_s, self.alpha)
        return True


def has_queue_free_busy_time(load: EngineLoad) -> bool:
    """The engine measures prefill time without queueing (directly, or as TTFT minus a queue-time histogram)."""
    return load.prefill_seconds_sum is not None or load.queue_seconds_sum is not None


def uncached_prompt_tokens(old: EngineLoad, new: EngineLoad) -> float | None:
    """Prompt tokens actually prefilled between two scrapes (cache hits excluded); None when not counted."""
    prompt = delta(old.prompt_tokens_total, new.prompt_tokens_total)
    if prompt is None:
        return None
    hits = delta(old.prefix_cache_hits_total, new.prefix_cache_hits_total) or 0.0
    return max(prompt - hits, 0.0)


CUMULATIVE_FIELDS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_hits_total",
    "ttft_count",
    "itl_count",
    "prefill_seconds_sum",
    "requests_finished_total",
    "service_count",
)


def counters_went_down(old: EngineLoad, new: EngineLoad) -> bool:
    for name in CUMULATIVE_FIELDS:
        before, after = getattr(old, name), getattr(new, name)
        if before is not None and after is not None and after < before:
            return True
    return False


def delta(old: float | None, new: float | None) -> float | None:
    return None if old is None or new is None else new - old


def busy_prefill_seconds(old: EngineLoad, new: EngineLoad) -> float | None:
    """Per-request prefill time spent between two scrapes, from the best source the engine exposes."""
    prefill = delta(old.prefill_seconds_sum, new.prefill_seconds_sum)
    if prefill is not None and prefill > 0:
        return prefill
    ttft = delta(old.ttft_seconds_sum, new.ttft_seconds_sum)
    if ttft is None or ttft <= 0:
        return None
    queued = delta(old.queue_seconds_sum, new.queue_seconds_sum)
    if queued is not None and 0 <= queued < ttft:
        return ttft - queued
    return ttft


def ewma(current: float, sample: float, alpha: float) -> float:
    if not math.isfinite(sample) or sample <= 0:
        return current
    return sample if current <= 0 else current + alpha * (sample - current)


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
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
        endpoint.snapshot = self._snapshot_of(endpoint)
        await self._put(endpoint.snapshot)
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
        return endpoint.spec.load_from(samples)

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
            decode_tokens_per_s=endpoint.estimator.decode_tokens_per_s,
            power_watts=watts or 0.0,
            energy_joules=joules or 0.0,
            block_size=load.block_size or spec.default_block_size or 0,
            kv_capacity_tokens=(load.kv_blocks or 0) * (load.block_size or spec.default_block_size or 0),
            consecutive_failures=endpoint.consecutive_failures,
            mean_service_s=endpoint.estimator.mean_service_s or None,
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

    async def _put(self, snapshot: EndpointSnapshot) -> None:
        try:
            async with asyncio.timeout(self.interval_s):
                await self.store.put_snapshot(snapshot)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # StoreUnavailable, or a client error the backend did not wrap: same outage
            self.stats.store_failures += 1
            if not self._store_down:
                log.warning("store unavailable; still scraping", extra={"reason": repr(exc)})
                self._store_down = True
            return
        if self._store_down:
            log.info("store reachable again")
            self._store_down = False

    # -- reading state --------------------------------------------------------------------------------------
    def snapshot(self, endpoint_id: str) -> EndpointSnapshot | None:
        """The last snapshot written for ``endpoint_id`` (None before health was first decided)."""
        return self._endpoints[endpoint_id].snapshot

    def endpoint_ids(self) -> list[str]:
        return list(self._endpoints)
