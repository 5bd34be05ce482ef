"""Every metric Cognitora exports, in one table: name, type, labels, meaning, and how pages of several processes
merge. ``docs/metrics.md`` holds ``reference_markdown()`` verbatim (a test keeps the two equal), so a name used in
code and a name a dashboard reads are the same string, defined here once.

Counter names are written without ``_total``: Prometheus' text format appends it to the sample
(``cognitora_decisions`` is scraped as ``cognitora_decisions_total``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = ["SPECS", "Kind", "Merge", "MetricSpec", "Source", "reference_markdown", "spec"]


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Source(StrEnum):
    """Which part of a process a metric comes from, hence which processes serve it."""

    PROCESS = "process"
    """Every Cognitora metrics page."""
    ROUTER = "router"
    """The decision core of a gateway: ``cognitora extproc`` and the LiteLLM plugin."""
    COLLECTOR = "collector"
    """KV-event subscribers and the /metrics scraper: ``cognitora collector``, or a gateway's embedded collector
    (``cognitora extproc --collector``, the LiteLLM plugin without ``redis_url``)."""
    FLEET = "fleet"
    """The store's endpoint snapshots, re-exported: every page (the collector's from its own scraper, a gateway's
    from the store it reads)."""


class Merge(StrEnum):
    """How the page of ``cognitora extproc --workers N`` combines its workers' pages."""

    SUM = "sum"
    """Each worker counts its own share: the page shows the sum over workers."""
    FIRST = "first"
    """Every worker reads the same store: the page shows one worker's figure (the first that answered)."""


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    source: Source
    merge: Merge = Merge.SUM

    @property
    def sample_name(self) -> str:
        """The name as scraped: ``_total`` appended to a counter's."""
        return f"{self.name}_total" if self.kind is Kind.COUNTER else self.name


def _m(name: str, kind: Kind, labels: tuple[str, ...], source: Source, help_: str) -> MetricSpec:
    merge = Merge.FIRST if source in (Source.FLEET, Source.PROCESS) else Merge.SUM
    return MetricSpec(name, kind, labels, " ".join(help_.split()), source, merge)


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
P, R, K, F = Source.PROCESS, Source.ROUTER, Source.COLLECTOR, Source.FLEET
ME = ("model", "endpoint")
E = ("endpoint",)

SPECS: tuple[MetricSpec, ...] = (
    # -- the process ------------------------------------------------------------------------------------------
    _m("cognitora_info", G, ("process", "version"), P, "Always 1. `process`: extproc, collector or litellm."),
    _m(
        "cognitora_exporter_workers",
        G,
        (),
        P,
        "Worker pages merged into this page (`cognitora extproc --workers N` only; absent elsewhere).",
    ),
    # -- decisions --------------------------------------------------------------------------------------------
    _m(
        "cognitora_decisions",
        C,
        ("model", "priority", "endpoint", "outcome", "status"),
        R,
        """Requests the gateway asked the core to place, by what became of them. `outcome`: placed, saturated, probe (a
        sheddable class placed on an idle engine as a probe instead of shed: docs/placement.md, "Probes instead of
        shedding"), degraded, fallback (placed) or shed, rejected (refused). `endpoint` is empty for a refusal; `status`
        is the HTTP status a refusal answered (empty for a placement). A model or priority class the config does not
        define is `(unknown)`. One request is one decision, whatever retries follow.""",
    ),
    _m(
        "cognitora_rewrites",
        C,
        ("requested", "model", "intent", "how"),
        R,
        """Model rewrites decided before placement (config `intent`, docs/intent.md), one per decision that had a
        rewrite policy: `requested` the name the client sent, `model` the one that served it, `intent` the intent found
        (empty when none), `how`: rule, classifier, default or kept. A name the config does not define is
        `(unknown)`.""",
    ),
    _m(
        "cognitora_decision_duration_seconds",
        H,
        ("model",),
        R,
        "Time to decide one request: prompt keys, the store read, placement (in the gateway process, on its loop).",
    ),
    # -- attempts: prediction beside achievement ---------------------------------------------------------------
    _m(
        "cognitora_attempts_finished",
        C,
        ("model", "endpoint", "kind", "status"),
        R,
        """Attempts finished, by `kind` (the core's OutcomeKind: completed, client_cancelled, connect_failed,
        timeout, upstream_error, rejected, rerouted, abandoned, failed) and the HTTP `status` the engine answered
        (empty when none came). A retry on another endpoint is a second attempt of the same decision.""",
    ),
    _m("cognitora_attempts_open", G, (), R, "Attempts dispatched by this process and not finished yet."),
    _m(
        "cognitora_attempt_ttft_predicted_seconds",
        H,
        ME,
        R,
        """Predicted time to first token of the attempts whose TTFT was measured: the same attempts as
        `cognitora_attempt_ttft_achieved_seconds`, so the two `_sum / _count` compare like for like.""",
    ),
    _m(
        "cognitora_attempt_ttft_achieved_seconds",
        H,
        ME,
        R,
        """Measured time to first token, dispatch to the first streamed chunk as the gateway saw it, of attempts
        that had one: streamed answers (through Envoy a non-streamed answer has no observable first token; through
        LiteLLM, its own first-token time where it records one).""",
    ),
    _m(
        "cognitora_routing_regret_seconds",
        H,
        ME,
        R,
        """Achieved TTFT on the pick minus the TTFT placement predicted for the runner-up, per attempt with both.
        Negative: the pick answered sooner than the runner-up was expected to. A prediction, not a measurement, of
        the road not taken: it carries the predictor's error (see docs/metrics.md).""",
    ),
    replace(
        _m(
            "cognitora_ttft_bias_factor",
            G,
            E,
            R,
            """The TTFT feedback's learned factor per endpoint (cost_model.feedback; docs/placement.md, "Feedback"):
            its predictions are corrected by (raw + floor) x factor - floor. Above 1: the endpoint answers later than
            the cost model predicts; below 1: sooner. Absent until an endpoint has cost_model.feedback.min_samples
            streamed attempts. With --workers N, one worker's (each learns from its own attempts).""",
        ),
        merge=Merge.FIRST,
    ),
    _m(
        "cognitora_attempt_cache_reports",
        C,
        ME,
        R,
        "Finished attempts whose response reported `cached_tokens`: the three sums below cover exactly these.",
    ),
    _m(
        "cognitora_attempt_cached_tokens_predicted",
        C,
        ME,
        R,
        "Prompt tokens placement predicted the endpoint would find in its prefix cache (tier-weighted).",
    ),
    _m(
        "cognitora_attempt_cached_tokens_achieved",
        C,
        ME,
        R,
        "Prompt tokens the engine reported as served from its prefix cache (`usage...cached_tokens`).",
    ),
    _m(
        "cognitora_attempt_cache_prompt_tokens",
        C,
        ME,
        R,
        "Prompt tokens of the same attempts: achieved / this is the achieved hit rate.",
    ),
    _m(
        "cognitora_attempt_tokens",
        C,
        ("model", "endpoint", "kind"),
        R,
        "Tokens of finished attempts whose response counted them, `kind` prompt or completion.",
    ),
    # -- the store and errors ------------------------------------------------------------------------------------
    _m(
        "cognitora_store_read_duration_seconds",
        H,
        (),
        R,
        "One read of the fleet's state for a decision (one round trip on Redis), failed and timed-out reads included.",
    ),
    _m(
        "cognitora_store_errors",
        C,
        (),
        R,
        "Store calls of the core that failed or timed out, reads and writes (each read failure degrades a decision).",
    ),
    _m(
        "cognitora_internal_errors",
        C,
        ("where",),
        R,
        """Bugs caught and answered: `where` placement (answered by `placement.on_error`) or extproc (a phase of the
        Envoy exchange raised).""",
    ),
    _m(
        "cognitora_prompt_token_checks",
        C,
        ("model", "endpoint"),
        R,
        """Answers whose engine-reported `usage.prompt_tokens` was compared with the router's own token-exact count of
        the same prompt (cognitora.token_agreement).""",
    ),
    _m(
        "cognitora_prompt_token_mismatches",
        C,
        ("model", "endpoint"),
        R,
        """Of those, the answers where the engine counted a different number of prompt tokens than the router: the
        router's tokenizer or chat template is not the engine's (`models[].tokenizer`), so its block keys never match
        the engine's KV events. Logged with both counts, at most once a minute.""",
    ),
    replace(
        _m(
            "cognitora_prompt_token_mismatch_last",
            G,
            ("model", "endpoint"),
            R,
            """Engine minus router prompt tokens at the last comparison: 0 when they agree (the dashboard shows a
            warning while any is not). With --workers N, one worker's.""",
        ),
        merge=Merge.FIRST,
    ),
    _m(
        "cognitora_endpoints_marked_unhealthy",
        C,
        (),
        R,
        "Times this process marked an endpoint unhealthy from what a request saw (connection refused, 502/503).",
    ),
    # -- burst to a cloud target (cognitora.burst) -------------------------------------------------------------
    _m(
        "cognitora_burst_decisions",
        C,
        ("model", "priority", "target", "reason"),
        R,
        """Requests sent to a cloud target, by `reason`: saturated (the best local predicted TTFT missed the class's
        burst threshold), itl_saturated (the best local predicted inter-token latency missed the burst threshold of
        the class's ITL SLO) or no_local_endpoint (none was eligible).""",
    ),
    _m(
        "cognitora_burst_denied",
        C,
        ("model", "priority", "why"),
        R,
        """Requests that would have burst and stayed local (placed or shed as without burst), by `why`:
        team_not_allowed, named_not_allowed (the request named a cloud target its team may not name),
        no_target_for_model, cloud_failed_this_request, spend_exhausted (the team's spend plus its requests in flight
        would pass its limit), cloud_unhealthy (the target's breaker is open), cloud_rate_limited (a 429's
        Retry-After running), cloud_at_capacity.""",
    ),
    _m("cognitora_burst_active", G, ("model", "priority"), R, "1 while the (model, class) is in burst, else 0."),
    _m(
        "cognitora_burst_probes",
        C,
        ("model", "priority", "result"),
        R,
        """Local probes of a class in burst (a request placed on its idle best endpoint to measure it), by `result`:
        released (answered within the exit threshold: the class left burst), too_slow, failed.""",
    ),
    _m("cognitora_cloud_inflight", G, ("target",), R, "Requests this process has in flight at each cloud target."),
    _m(
        "cognitora_cloud_breaker",
        G,
        ("target", "state"),
        R,
        """1 for the target's breaker state now (`state` closed, open or half_open), 0 for the others: open holds
        every request off the target, half_open lets one through to test it.""",
    ),
    _m(
        "cognitora_cloud_breaker_opened",
        C,
        ("target",),
        R,
        "Times the target's breaker opened (failures, a 429, or a failed half-open request).",
    ),
    _m(
        "cognitora_cloud_breaker_probes",
        C,
        ("target",),
        R,
        "Half-open requests sent to the target: the only cloud calls its breaker lets through during a hold-off.",
    ),
    _m(
        "cognitora_cloud_attempts",
        C,
        ("target", "result"),
        R,
        """Every finished cloud request of this process, however it ended, by `result`: ok, rate_limited (429),
        failed (5xx, refused or reset connection, timeout, 401/403/404) or neutral (the client went away, the request
        itself was bad). A failed one was retried locally when the gateway could.""",
    ),
    _m(
        "cognitora_cloud_requests",
        C,
        ("team", "target"),
        R,
        """Finished cloud requests whose answer counted its tokens, per team (a team allowed only by `"*"` is
        `(other)`) and target.""",
    ),
    _m("cognitora_cloud_tokens", C, ("team", "target", "kind"), R, "Their tokens, `kind` prompt or completion."),
    _m(
        "cognitora_cloud_cost_usd",
        C,
        ("team", "target"),
        R,
        "What they cost (USD) at the target's `input_usd_per_mtok` / `output_usd_per_mtok`.",
    ),
    # -- budgets (cognitora.budgets) -------------------------------------------------------------------------------
    _m(
        "cognitora_budget_usage",
        G,
        ("team", "window", "metric"),
        F,
        "Tokens (or dollars, metric cost_usd) counted against a configured team's limit in its current window: "
        "settled usage plus open reservations, as last read from the budget store (every few seconds while requests "
        "come). Every gateway reads the same store.",
    ),
    _m(
        "cognitora_budget_limit",
        G,
        ("team", "window", "metric"),
        F,
        "The cap of a configured team's limit (tokens, or dollars for metric cost_usd).",
    ),
    _m(
        "cognitora_budget_rejections",
        C,
        ("team", "reason"),
        R,
        "Requests refused by a budget. `team`: a configured team, `default` (any other) or `none`; `reason`: the "
        "metric of the limit (input_tokens, output_tokens, total_tokens, cost_usd), store_unavailable "
        "(fail_closed with the store unreachable) or store_slow (the store connected but slower than "
        "budgets.reserve_timeout_s).",
    ),
    _m(
        "cognitora_budget_fail_open",
        C,
        (),
        R,
        "Requests admitted without a budget check because the budget store was unreachable (refused, reset, no "
        "connection) and budgets.on_store_error is fail_open; their usage is written to the store when it is back. "
        "Never counts a slow store: 0 while Redis is up.",
    ),
    _m(
        "cognitora_budget_reserve_duration_seconds",
        H,
        (),
        R,
        "Time from a request's budget reservation being sent to its verdict (admitted, refused, or given up after "
        "budgets.reserve_timeout_s), in this process: batched calls included.",
    ),
    _m(
        "cognitora_budget_backlog",
        G,
        (),
        R,
        "Settles counted in this process while the budget store was unreachable (fail_open), not written yet.",
    ),
    # -- the gateway queue (flow_control) ---------------------------------------------------------------------
    _m(
        "cognitora_flow_queue_depth",
        G,
        ("band", "flow"),
        R,
        "Requests waiting in this gateway's queue now, by band (priority class) and flow (`team:<name>`, "
        "`key:<id>`, `anonymous`; the first 32 flows seen keep their name, later ones are `other`).",
    ),
    _m(
        "cognitora_flow_queue_oldest_wait_seconds",
        G,
        ("band",),
        R,
        "How long the oldest request waiting in the band has waited (0 when none waits). Per process: a merged "
        "`cognitora extproc --workers N` page sums the workers' figures (read a worker's own page for the oldest).",
    ),
    _m(
        "cognitora_flow_wait_seconds",
        H,
        ("band", "flow", "how"),
        R,
        "Seconds a request waited in the gateway queue, by how it left: dispatched, timeout (429 with Retry-After, "
        "or a cloud target), cancelled (its client went away), full, closed.",
    ),
    _m(
        "cognitora_flow_dispatches",
        C,
        ("band", "reason"),
        R,
        "Requests placed from the queue, by what woke the dispatch: finished, first_token, capacity, arrival, recheck.",
    ),
    _m(
        "cognitora_flow_departures",
        C,
        ("band", "how"),
        R,
        'Requests that left the queue, by how (dispatched, timeout, cancelled, full, closed): `how="timeout"` '
        "counts the queue timeouts.",
    ),
    _m(
        "cognitora_flow_held_tries",
        C,
        (),
        R,
        "Placements of a queued request that found the fleet still saturated (it stayed at the head).",
    ),
    _m(
        "cognitora_flow_holds",
        C,
        ("at", "reason"),
        R,
        "Holds by the flow-control rule, by where (`admission`: a request that joined the queue because of it; "
        "`queue`: a try from the queue that stayed held) and why: `seats`, `kv`, `slo`, `priority` (an `slo` hold "
        "for an active higher band) or `isolation` (team isolation: the last engine free of the team's prefill).",
    ),
    # What flow control learned at run time and decides with (one worker's with --workers N: each learns its own).
    replace(
        _m(
            "cognitora_flow_prediction_margin",
            G,
            (),
            R,
            """The prediction margin flow control multiplies its predicted TTFTs by (flow_control.margin;
            docs/flow_control.md, "The prediction margin"): the quantile (0.9) of achieved / predicted TTFT of this
            process's last requests predicted at least `min_predicted_s`, within [1, `max_factor`]; 1 until
            `min_samples` are in. One figure per process (every model, class and engine). With --workers N, one
            worker's.""",
        ),
        merge=Merge.FIRST,
    ),
    replace(
        _m(
            "cognitora_flow_prediction_margin_samples",
            G,
            (),
            R,
            """The achieved / predicted TTFT ratios the prediction margin is the quantile of (at most
            `flow_control.margin.samples`; the margin is 1 below `min_samples`). With --workers N, one worker's.""",
        ),
        merge=Merge.FIRST,
    ),
    replace(
        _m(
            "cognitora_flow_band_arrival_rate",
            G,
            ("band",),
            R,
            """Requests per second of the band lately, as flow control learned it: its requests of the last 10 s
            over the span they cover (at least 1 s); 0 when none came in that time. A lower band keeps room for this
            many arrivals of an active higher band (`flow_control.priority_arrivals_quantile`). With --workers N,
            one worker's (each sees its own share).""",
        ),
        merge=Merge.FIRST,
    ),
    replace(
        _m(
            "cognitora_flow_band_gaps",
            G,
            ("band",),
            R,
            """Gaps between the band's requests its mean gap is from: its last 16, trusted from 8 (below that the band
            stays active `priority_window_s` after its last request). With --workers N, one worker's.""",
        ),
        merge=Merge.FIRST,
    ),
    replace(
        _m(
            "cognitora_flow_band_mean_gap_seconds",
            G,
            ("band",),
            R,
            """The mean of the band's last gaps between requests (`cognitora_flow_band_gaps` of them): the band stays
            active 5 mean gaps after its last request. Absent until 8 gaps are in. With --workers N, one
            worker's.""",
        ),
        merge=Merge.FIRST,
    ),
    # -- KV events ----------------------------------------------------------------------------------------------
    _m("cognitora_kv_event_batches_received", C, E, K, "Live KV-event messages received from the engine."),
    _m("cognitora_kv_event_batches_applied", C, E, K, "Event batches written to the store (live and replayed)."),
    _m("cognitora_kv_event_batches_malformed", C, E, K, "Messages that could not be decoded (skipped)."),
    _m("cognitora_kv_event_batches_replayed", C, E, K, "Batches applied from a replay (after a gap or a restart)."),
    _m(
        "cognitora_kv_event_batches_duplicate",
        C,
        E,
        K,
        "Live batches dropped because a replay had already applied them.",
    ),
    _m("cognitora_kv_event_gaps", C, E, K, "Sequence gaps seen on the live stream."),
    _m(
        "cognitora_kv_event_purges",
        C,
        E,
        K,
        "Times the endpoint was purged: unclosable gap, restart, reconnect, AllBlocksCleared, store outage.",
    ),
    _m("cognitora_kv_event_store_errors", C, E, K, "Store writes of events that failed (each followed by a resync)."),
    _m(
        "cognitora_kv_event_store_writes",
        C,
        E,
        K,
        "Store flushes of events (applied / writes = batches per round trip).",
    ),
    _m("cognitora_kv_blocks_stored", C, ("model",), K, "Blocks recorded in the store from BlockStored events."),
    _m("cognitora_kv_blocks_removed", C, ("model",), K, "Block removals translated to the store."),
    _m(
        "cognitora_kv_events_skipped",
        C,
        ("model", "reason"),
        K,
        """Events (or block hashes) that could not be applied, by `reason`: unknown_parent, block_size_mismatch,
        inconsistent, unknown_blocks, map_overflow (docs/events.md).""",
    ),
    _m("cognitora_kv_clears", C, ("model",), K, "AllBlocksCleared events applied."),
    # -- scraping -----------------------------------------------------------------------------------------------
    _m(
        "cognitora_scrapes",
        C,
        ("result",),
        K,
        "Endpoint scrape rounds, `result` ok (the health route answered) or failed (refused, timed out, bad status).",
    ),
    _m(
        "cognitora_scrape_problems",
        C,
        ("reason",),
        K,
        """Rounds that were healthy but could not read everything, by `reason`: metrics_fetch (the metrics or power
        route failed), garbage (not Prometheus text), unrecognized (none of the engine kind's names), store_write
        (the snapshot could not be stored).""",
    ),
    # -- the fleet, re-exported from the store's endpoint snapshots ---------------------------------------------
    _m("cognitora_endpoint_info", G, ("endpoint", "model", "engine"), F, "Always 1: which model an endpoint serves."),
    _m("cognitora_endpoint_healthy", G, E, F, "1 when the scraper's last verdict is healthy, else 0."),
    _m(
        "cognitora_endpoint_snapshot_age_seconds",
        G,
        E,
        F,
        "Seconds since the endpoint last answered a scrape (how old the figures below are).",
    ),
    _m("cognitora_endpoint_running", G, E, F, "Requests the engine is running (its own /metrics)."),
    _m("cognitora_endpoint_waiting", G, E, F, "Requests waiting in the engine's queue."),
    _m("cognitora_endpoint_kv_usage_ratio", G, E, F, "Share of the engine's KV cache in use, 0 to 1."),
    _m(
        "cognitora_endpoint_prefill_tokens_per_second",
        G,
        E,
        F,
        "Prefill throughput learned from the engine's counters (absent until learned).",
    ),
    _m(
        "cognitora_endpoint_decode_tokens_per_second",
        G,
        E,
        F,
        "Decode throughput learned from the engine's counters (absent until learned).",
    ),
    _m(
        "cognitora_endpoint_inter_token_latency_seconds",
        G,
        E,
        F,
        "Mean inter-token latency learned from the engine's counters (engine seconds, smoothed; the inverse of the "
        "decode throughput): what a priority class's itl_slo_s is held to. Absent until learned.",
    ),
    _m(
        "cognitora_endpoint_power_watts",
        G,
        E,
        F,
        "Power the endpoint's meter reads (engine or DCGM exporter); absent without a meter.",
    ),
    _m(
        "cognitora_endpoint_energy_joules",
        C,
        E,
        F,
        "The meter's cumulative energy counter, as the meter reports it (it resets when the meter does).",
    ),
    _m("cognitora_endpoint_prompt_tokens", C, E, F, "The engine's cumulative prompt tokens (its own counter)."),
    _m("cognitora_endpoint_generation_tokens", C, E, F, "The engine's cumulative generated tokens."),
    _m("cognitora_endpoint_prefix_cache_hits", C, E, F, "The engine's cumulative prefix-cache hits (tokens)."),
    _m("cognitora_endpoint_prefix_cache_queries", C, E, F, "The engine's cumulative prefix-cache queries (tokens)."),
    _m(
        "cognitora_endpoint_cache_hit_ratio",
        G,
        E,
        F,
        "Prefix-cache hits / queries over the energy window (absent when the window saw no query).",
    ),
    _m(
        "cognitora_endpoint_joules_per_token",
        G,
        E,
        F,
        """Measured energy per token: energy counter delta / (prompt + generated tokens) delta over the energy
        window, idle draw included (absent when the window saw no token or the endpoint has no meter).""",
    ),
    _m(
        "cognitora_endpoint_marginal_joules_per_token",
        G,
        E,
        F,
        "The marginal J/token the scraper learned (idle draw removed): what power-aware placement ranks by.",
    ),
    _m("cognitora_fleet_power_watts", G, (), F, "Sum of `cognitora_endpoint_power_watts` over metered endpoints."),
    _m(
        "cognitora_fleet_joules_per_token",
        G,
        (),
        F,
        """Fleet energy per token over the energy window: the sum of every metered endpoint's energy delta (idle
        ones included) over the sum of their prompt + generated token deltas.""",
    ),
    _m(
        "cognitora_fleet_joules_per_output_token",
        G,
        (),
        F,
        "The same energy over generated tokens only (the benchmark's J per output token).",
    ),
    _m(
        "cognitora_fleet_energy_window_seconds",
        G,
        (),
        F,
        "The longest span of snapshots the fleet figures above cover (at most the window, 60 s, plus one scrape).",
    ),
)

_BY_NAME = {s.name: s for s in SPECS}
assert len(_BY_NAME) == len(SPECS), "a metric name is listed twice"


def spec(name: str) -> MetricSpec:
    """The spec of ``name`` (``KeyError`` for a name not in the table: every family is declared here)."""
    return _BY_NAME[name]


def reference_markdown() -> str:
    """The metric reference table of docs/metrics.md, one section per source."""
    titles = {
        Source.PROCESS: "Every page",
        Source.ROUTER: "Gateways (`cognitora extproc`, the LiteLLM plugin): decisions, attempts, the store",
        Source.COLLECTOR: "Collectors (`cognitora collector`, or a gateway's embedded one): KV events, scraping",
        Source.FLEET: "The fleet, re-exported from the store's endpoint snapshots (every page)",
    }
    out: list[str] = []
    for source, title in titles.items():
        out += [
            f"### {title}",
            "",
            "| name (as scraped) | type | labels | workers | meaning |",
            "|---|---|---|---|---|",
        ]
        for s in SPECS:
            if s.source is source:
                labels = ", ".join(f"`{label}`" for label in s.labels) or "-"
                out.append(f"| `{s.sample_name}` | {s.kind.value} | {labels} | {s.merge.value} | {s.help} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
