"""Prometheus metric families built from live state when a page is rendered (``prometheus_client`` custom
collectors): nothing here runs on the request path.

- ``RouterFamilies``: a gateway's ``Router`` (its ``Telemetry``, ``RouterStats`` and open attempts);
- ``CollectorFamilies``: a collector's subscriber, ingestor and scraper counters (``cognitora.metrics.sources``);
- ``FleetFamilies``: endpoint snapshots (handed in by the exporter, which read them from the store or the scraper),
  with energy per token and hit rate over a window (``cognitora.metrics.window``).

Every family's name, type, labels and help come from ``cognitora.metrics.names``. Label values pass through
``cognitora.redaction.redact``, like every other text a person sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector
from prometheus_client.samples import Sample

from cognitora.burst.cloud_state import Breaker
from cognitora.config import CognitoraConfig
from cognitora.metrics.names import Kind, spec
from cognitora.metrics.sources import CollectorSource
from cognitora.metrics.window import CounterWindow, WindowDelta, fleet_energy
from cognitora.redaction import redact
from cognitora.telemetry import Histogram
from kvstate.store import EndpointSnapshot

if TYPE_CHECKING:
    from cognitora.budgets.gate import BudgetGate
    from cognitora.core.flow_gate import FlowGate
    from cognitora.core.router import Router

__all__ = [
    "CollectorFamilies",
    "FleetFamilies",
    "RouterFamilies",
    "budget_families",
    "family",
    "flow_families",
    "histogram_family",
]

Family = CounterMetricFamily | GaugeMetricFamily
_K = TypeVar("_K", bound=tuple[str, ...])
"""A family of plain samples (one value per label set)."""


def family(name: str) -> Family:
    """An empty counter or gauge family for ``name``, typed and labelled as ``cognitora.metrics.names`` declares."""
    s = spec(name)
    if s.kind is Kind.COUNTER:
        return CounterMetricFamily(s.name, s.help, labels=s.labels)
    if s.kind is Kind.GAUGE:
        return GaugeMetricFamily(s.name, s.help, labels=s.labels)
    raise TypeError(f"{name} is a histogram: use histogram_family")


def histogram_family(name: str) -> HistogramMetricFamily:
    s = spec(name)
    if s.kind is not Kind.HISTOGRAM:
        raise TypeError(f"{name} is a {s.kind.value}, not a histogram")
    return HistogramMetricFamily(s.name, s.help, labels=s.labels)


def _labels(values: Iterable[str]) -> list[str]:
    return [redact(v) for v in values]


def _counters(name: str, table: Mapping[_K, float]) -> Family:
    fam = family(name)
    for key, value in sorted(table.items()):
        fam.add_metric(_labels(key), value)
    return fam


def _histograms(name: str, table: Mapping[_K, Histogram]) -> HistogramMetricFamily:
    fam = histogram_family(name)
    for key, hist in sorted(table.items()):
        labels = _labels(key)
        buckets = [(_bound(b), float(n)) for b, n in hist.cumulative()]
        fam.add_metric(labels, buckets, hist.sum)
        if hist.bounds and hist.bounds[0] < 0:
            # prometheus_client leaves _count and _sum out when buckets go negative (an OpenMetrics rule); the
            # Prometheus text format takes them, and a signed figure's mean is what its reader wants.
            named = dict(zip(spec(name).labels, labels, strict=True))
            fam.samples.append(Sample(f"{fam.name}_count", named, float(hist.count)))
            fam.samples.append(Sample(f"{fam.name}_sum", named, hist.sum))
    return fam


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


def _one(name: str, value: float, labels: Sequence[str] = ()) -> Family:
    fam = family(name)
    fam.add_metric(_labels(labels), value)
    return fam


class RouterFamilies(PrometheusCollector):
    """The decision core's families (``cognitora.metrics.names``, source ``router``)."""

    def __init__(self, router: Router, extproc_errors: Callable[[], int] | None = None) -> None:
        self.router = router
        self.extproc_errors = extproc_errors
        """Phases of the Envoy exchange that raised (``envoy_extproc.server.ExtProcService``), when there is one."""

    def collect(self) -> Iterator[Metric]:
        t = self.router.telemetry
        stats = self.router.stats
        yield _counters("cognitora_decisions", t.decisions)
        yield _counters("cognitora_rewrites", t.rewrites)
        yield _histograms("cognitora_decision_duration_seconds", {(m,): h for m, h in t.decision_seconds.items()})
        yield _counters("cognitora_attempts_finished", t.finished_attempts)
        yield _one("cognitora_attempts_open", len(self.router.open_attempts()))
        yield _histograms("cognitora_attempt_ttft_predicted_seconds", t.ttft_predicted)
        yield _histograms("cognitora_attempt_ttft_achieved_seconds", t.ttft_achieved)
        yield _histograms("cognitora_routing_regret_seconds", t.regret)
        bias = family("cognitora_ttft_bias_factor")
        for endpoint, factor in sorted(self.router.ttft_bias_factors().items()):
            bias.add_metric([endpoint], factor)
        yield bias
        yield _counters("cognitora_attempt_cache_reports", {k: s.reports for k, s in t.cache.items()})
        yield _counters(
            "cognitora_attempt_cached_tokens_predicted", {k: s.predicted_cached_tokens for k, s in t.cache.items()}
        )
        yield _counters(
            "cognitora_attempt_cached_tokens_achieved", {k: s.achieved_cached_tokens for k, s in t.cache.items()}
        )
        yield _counters("cognitora_attempt_cache_prompt_tokens", {k: s.prompt_tokens for k, s in t.cache.items()})
        yield _counters("cognitora_attempt_tokens", t.tokens)
        yield _histograms("cognitora_store_read_duration_seconds", {(): t.store_read_seconds})
        yield _one("cognitora_store_errors", stats.store_errors)
        errors = family("cognitora_internal_errors")
        errors.add_metric(["placement"], stats.internal_errors)
        if self.extproc_errors is not None:
            errors.add_metric(["extproc"], self.extproc_errors())
        yield errors
        yield _one("cognitora_endpoints_marked_unhealthy", stats.marked_unhealthy)
        tallies = self.router.token_agreement.tallies
        yield _counters("cognitora_prompt_token_checks", {k: t.checks for k, t in tallies.items()})
        yield _counters("cognitora_prompt_token_mismatches", {k: t.mismatches for k, t in tallies.items()})
        yield _counters("cognitora_prompt_token_mismatch_last", {k: t.last_difference for k, t in tallies.items()})
        gate = self.router.budgets
        if gate is not None:
            yield from budget_families(gate)
        yield from _burst_families(self.router)
        if self.router.flow is not None:
            yield from flow_families(self.router.flow)


def _burst_families(router: Router) -> Iterator[Metric]:
    burst = router.burst
    yield _counters("cognitora_burst_decisions", burst.decisions)
    yield _counters("cognitora_burst_denied", burst.denied)
    active = family("cognitora_burst_active")
    for (model, priority), bursting in burst.detector.states().items():
        active.add_metric([model, priority], 1.0 if bursting else 0.0)
    yield active
    yield _counters("cognitora_burst_probes", burst.probes.results)
    inflight = family("cognitora_cloud_inflight")
    breaker = family("cognitora_cloud_breaker")
    opened = family("cognitora_cloud_breaker_opened")
    probes = family("cognitora_cloud_breaker_probes")
    states = burst.cloud.summary(burst.now())
    for cloud_target in burst.settings.targets:
        name = cloud_target.name
        inflight.add_metric([name], burst.cloud.inflight(name))
        current = burst.cloud.state(name, burst.now())
        for state in Breaker:
            breaker.add_metric([name, state.value], 1.0 if state is current else 0.0)
        known = states.get(name)
        opened.add_metric([name], 0 if known is None else known.opened)
        probes.add_metric([name], 0 if known is None else known.probes)
    yield inflight
    yield breaker
    yield opened
    yield probes
    yield _counters("cognitora_cloud_attempts", burst.cloud.results)
    requests, tokens, cost = (
        family(n) for n in ("cognitora_cloud_requests", "cognitora_cloud_tokens", "cognitora_cloud_cost_usd")
    )
    rows: dict[tuple[str, str], list[float]] = {}
    for (team, target), row in burst.ledger.rows.items():
        acc = rows.setdefault((burst.team_label(team), target), [0, 0, 0, 0.0])
        acc[0] += row.requests
        acc[1] += row.input_tokens
        acc[2] += row.output_tokens
        acc[3] += row.cost_usd
    for (team, target), (n, prompt, completion, usd) in rows.items():
        requests.add_metric([team, target], n)
        tokens.add_metric([team, target, "prompt"], prompt)
        tokens.add_metric([team, target, "completion"], completion)
        cost.add_metric([team, target], usd)
    yield requests
    yield tokens
    yield cost


def flow_families(gate: FlowGate) -> Iterator[Metric]:
    """``cognitora_flow_*``: the gateway queue's depth and oldest wait now, waits by how they ended, dispatches by
    reason, departures (timeouts among them), held tries, holds by reason; and what it learned and decides with:
    the prediction margin and each band's arrivals."""
    snap = gate.controller.snapshot()
    label = gate.telemetry.flow_label
    depth = family("cognitora_flow_queue_depth")
    oldest = family("cognitora_flow_queue_oldest_wait_seconds")
    dispatches: dict[tuple[str, str], int] = {}
    departures: dict[tuple[str, str], int] = {}
    for band in snap.bands:
        by_flow: dict[str, int] = {}
        for f in band.flows:
            by_flow[label(f.flow)] = by_flow.get(label(f.flow), 0) + f.waiting
        for flow, n in sorted(by_flow.items()):
            depth.add_metric(_labels((band.band, flow)), n)
        if not by_flow:
            depth.add_metric(_labels((band.band, "")), 0)
        oldest.add_metric([band.band], band.oldest_wait_s)
        dispatches.update({(band.band, why.value): n for why, n in band.dispatched.items()})
        departures.update({(band.band, how.value): n for how, n in band.left.items()})
    yield depth
    yield oldest
    yield _histograms("cognitora_flow_wait_seconds", gate.telemetry.waits)
    yield _counters("cognitora_flow_dispatches", dispatches)
    yield _counters("cognitora_flow_departures", departures)
    yield _one("cognitora_flow_held_tries", snap.held_tries)
    yield _counters("cognitora_flow_holds", gate.telemetry.holds)
    yield _one("cognitora_flow_prediction_margin", gate.margin.factor)
    yield _one("cognitora_flow_prediction_margin_samples", gate.margin.samples)
    rate, gaps, mean_gap = (
        family(n)
        for n in (
            "cognitora_flow_band_arrival_rate",
            "cognitora_flow_band_gaps",
            "cognitora_flow_band_mean_gap_seconds",
        )
    )
    for learned in gate.activity.rates():
        rate.add_metric([learned.band], learned.rate_per_s or 0.0)
        gaps.add_metric([learned.band], learned.gaps)
        if learned.mean_gap_s is not None:
            mean_gap.add_metric([learned.band], learned.mean_gap_s)
    yield rate
    yield gaps
    yield mean_gap


def budget_families(gate: BudgetGate) -> Iterator[Metric]:
    """``cognitora_budget_*``: limits from the config, usage as last read from the store, refusals, backlog."""
    usage = family("cognitora_budget_usage")
    for labels, value in sorted(gate.last_usage.items()):
        usage.add_metric(list(labels), value)
    yield usage
    limit = family("cognitora_budget_limit")
    for labels, value in sorted(gate.limit_gauges().items()):
        limit.add_metric(list(labels), value)
    yield limit
    yield _counters("cognitora_budget_rejections", gate.stats.refused)
    yield _one("cognitora_budget_backlog", gate.backlog)
    yield _one("cognitora_budget_fail_open", gate.stats.fail_open)
    yield _histograms("cognitora_budget_reserve_duration_seconds", {(): gate.stats.reserve_seconds})


_SKIPPED = ("unknown_parent", "block_size_mismatch", "inconsistent", "unknown_blocks", "map_overflow")
_SUBSCRIBER_FIELDS = {
    "cognitora_kv_event_batches_received": "received",
    "cognitora_kv_event_batches_applied": "applied",
    "cognitora_kv_event_batches_malformed": "malformed",
    "cognitora_kv_event_batches_replayed": "replayed",
    "cognitora_kv_event_batches_duplicate": "duplicates",
    "cognitora_kv_event_gaps": "gaps",
    "cognitora_kv_event_purges": "purges",
    "cognitora_kv_event_store_errors": "store_errors",
    "cognitora_kv_event_store_writes": "writes",
}


class CollectorFamilies(PrometheusCollector):
    """KV-event and scrape counters of the collector ``collector()`` returns (None: not started; nothing yet)."""

    def __init__(self, collector: Callable[[], CollectorSource | None]) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        collector = self.collector()
        if collector is None:
            return
        subscribers = {e: asdict(s.stats) for e, s in collector.subscribers.items()}
        for name, field_name in _SUBSCRIBER_FIELDS.items():
            yield _counters(name, {(e,): stats[field_name] for e, stats in subscribers.items()})
        ingest = {m: i.stats for m, i in collector.ingestors.items()}
        yield _counters("cognitora_kv_blocks_stored", {(m,): s.blocks_stored for m, s in ingest.items()})
        yield _counters("cognitora_kv_blocks_removed", {(m,): s.blocks_removed for m, s in ingest.items()})
        yield _counters(
            "cognitora_kv_events_skipped",
            {(m, reason): getattr(s, reason) for m, s in ingest.items() for reason in _SKIPPED},
        )
        yield _counters("cognitora_kv_clears", {(m,): s.clears for m, s in ingest.items()})
        scrape = collector.scraper.stats
        yield _counters("cognitora_scrapes", {("ok",): scrape.rounds - scrape.failures, ("failed",): scrape.failures})
        yield _counters(
            "cognitora_scrape_problems",
            {
                ("metrics_fetch",): scrape.metrics_failures,
                ("garbage",): scrape.garbage,
                ("unrecognized",): scrape.unrecognized,
                ("store_write",): scrape.store_failures,
            },
        )


def _maybe(delta: WindowDelta | None, figure: str) -> float | None:
    if delta is None:
        return None
    value: float | None = getattr(delta, figure)
    return value


class FleetFamilies(PrometheusCollector):
    """Per-endpoint gauges and counters from the snapshots last handed to ``observe``, and the fleet's sums."""

    def __init__(self, config: CognitoraConfig, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._info = sorted(
            {(e.id, m.name, e.engine.value) for m in config.models for e in m.endpoints}, key=lambda row: row
        )
        self._snapshots: dict[str, EndpointSnapshot] = {}
        self._windows: dict[str, CounterWindow] = {}

    def observe(self, snapshots: Mapping[str, EndpointSnapshot]) -> None:
        """The snapshots this page shows (the exporter reads them just before rendering)."""
        self._snapshots.update(snapshots)
        for endpoint, snap in snapshots.items():
            window = self._windows.get(endpoint)
            if window is None:
                window = self._windows[endpoint] = CounterWindow()
            window.observe(snap)

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        info = family("cognitora_endpoint_info")
        for row in self._info:
            info.add_metric(_labels(row), 1)
        yield info
        snaps = sorted(self._snapshots.items())
        deltas = {e: w.delta() for e, w in self._windows.items()}

        def each(name: str, value: Callable[[EndpointSnapshot], float | None]) -> Family:
            fam = family(name)
            for endpoint, snap in snaps:
                v = value(snap)
                if v is not None:
                    fam.add_metric(_labels([endpoint]), v)
            return fam

        metered: Callable[[EndpointSnapshot], bool] = lambda s: s.energy_joules > 0 or s.power_watts > 0  # noqa: E731
        yield each("cognitora_endpoint_healthy", lambda s: 1.0 if s.healthy else 0.0)
        yield each("cognitora_endpoint_snapshot_age_seconds", lambda s: max(0.0, now - s.last_seen))
        yield each("cognitora_endpoint_running", lambda s: s.running)
        yield each("cognitora_endpoint_waiting", lambda s: s.waiting)
        yield each("cognitora_endpoint_kv_usage_ratio", lambda s: s.kv_usage)
        yield each("cognitora_endpoint_prefill_tokens_per_second", lambda s: s.prefill_tokens_per_s or None)
        yield each("cognitora_endpoint_decode_tokens_per_second", lambda s: s.decode_tokens_per_s or None)
        yield each("cognitora_endpoint_inter_token_latency_seconds", lambda s: s.itl_s)
        yield each("cognitora_endpoint_power_watts", lambda s: s.power_watts if metered(s) else None)
        yield each("cognitora_endpoint_energy_joules", lambda s: s.energy_joules or None)
        yield each("cognitora_endpoint_prompt_tokens", lambda s: s.prompt_tokens_total)
        yield each("cognitora_endpoint_generation_tokens", lambda s: s.generation_tokens_total)
        yield each("cognitora_endpoint_prefix_cache_hits", lambda s: s.prefix_cache_hits_total)
        yield each("cognitora_endpoint_prefix_cache_queries", lambda s: s.prefix_cache_queries_total)

        def windowed(name: str, value: Callable[[str], float | None]) -> Family:
            fam = family(name)
            for endpoint, _ in snaps:
                v = value(endpoint)
                if v is not None:
                    fam.add_metric(_labels([endpoint]), v)
            return fam

        yield windowed("cognitora_endpoint_cache_hit_ratio", lambda e: _maybe(deltas.get(e), "cache_hit_ratio"))
        yield windowed("cognitora_endpoint_joules_per_token", lambda e: _maybe(deltas.get(e), "joules_per_token"))
        yield each("cognitora_endpoint_marginal_joules_per_token", lambda s: s.joules_per_token)
        watts = [s.power_watts for _, s in snaps if metered(s)]
        power = family("cognitora_fleet_power_watts")
        if watts:
            power.add_metric([], sum(watts))
        yield power
        fleet = fleet_energy([d for e, d in deltas.items() if d is not None and e in self._snapshots])
        per_token = family("cognitora_fleet_joules_per_token")
        per_output = family("cognitora_fleet_joules_per_output_token")
        span = family("cognitora_fleet_energy_window_seconds")
        if fleet is not None:
            if fleet.joules_per_token is not None:
                per_token.add_metric([], fleet.joules_per_token)
            if fleet.joules_per_output_token is not None:
                per_output.add_metric([], fleet.joules_per_output_token)
            span.add_metric([], fleet.seconds)
        yield per_token
        yield per_output
        yield span
