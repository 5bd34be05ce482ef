"""What the Router records about every decision and every finished attempt, for metrics and the decision log.

The hot path's half of Cognitora's own metrics (``cognitora.metrics`` is the other half, which turns this into
Prometheus metric families when a page is asked for). Everything here is plain Python: a counter is a dict entry
incremented, a histogram observation is one ``bisect`` and two increments. Nothing is formatted, locked or
allocated per call beyond a label tuple, and nothing imports ``prometheus_client``.

The Router calls, on its own event loop (so no lock is needed, and a page rendered on that loop is consistent):

- ``decided(request, decision, seconds, fallback=...)``: once per ``Router.admit`` (a request the gateway is
  handling; ``cognitora explain`` does not count), with how long the decision took; also writes the decision's
  log line (``DECISION_LOGGER`` at INFO, built only when that level is enabled);
- ``finished(record)``: once per finished attempt, with the prediction beside what was achieved;
- ``store_read(seconds, ok)``: once per read of the fleet's state.

Label values are bounded by the config: a model the config does not know, or a priority class it does not define,
is recorded as ``UNKNOWN`` (a client's free text never becomes a label).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from cognitora.core.outcome import AttemptRecord
from cognitora.decision import Decision
from cognitora.request import RouteRequest

__all__ = [
    "DECISION_LOGGER",
    "UNKNOWN",
    "CacheSums",
    "DecisionOutcome",
    "Histogram",
    "RouterStats",
    "Telemetry",
    "decision_outcome",
]

DECISION_LOGGER = "cognitora.decisions"
"""The logger of the one-line-per-decision log (INFO). Raise its level to silence it alone."""

UNKNOWN = "(unknown)"
"""The label value of a model or priority class the config does not define."""

decision_log = logging.getLogger(DECISION_LOGGER)

DECISION_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Upper bounds (s) of the decision and store-read latency histograms: 100 us to 1 s."""
TTFT_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (s) of the predicted and achieved TTFT histograms."""
REGRET_SECONDS_BUCKETS = (
    -10.0,
    -5.0,
    -2.5,
    -1.0,
    -0.5,
    -0.25,
    -0.1,
    -0.05,
    -0.01,
    0.0,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (s) of the routing-regret histogram: signed, negative when the pick beat the runner-up's prediction."""


class DecisionOutcome(StrEnum):
    """What became of a request at placement: the ``outcome`` label of ``cognitora_decisions_total``."""

    PLACED = "placed"
    """Placed on an endpoint that meets the request's priority SLO, from the store's view of the fleet."""
    SATURATED = "saturated"
    """Placed, but no endpoint met the priority's SLO: the fastest one took it (the class is not sheddable)."""
    PROBE = "probe"
    """Placed as a probe: a sheddable class missed its SLO everywhere on learned figures alone, and an idle endpoint
    took it to measure them instead of a 429 (``cognitora.placement.shed_probe``)."""
    DEGRADED = "degraded"
    """Placed without the store (unreachable or too slow): on load and this process's own in-flight counts."""
    FALLBACK = "fallback"
    """Placement raised (a bug): placed by ``placement.on_error: fallback`` on the least-loaded eligible endpoint."""
    BURST = "burst"
    """Sent to a cloud target (``cognitora.burst``): the fleet could not meet the class's SLO."""
    SHED = "shed"
    """Refused with 429 and Retry-After: the fleet is saturated for a sheddable class."""
    REJECTED = "rejected"
    """Refused for any other reason (unknown model 404, unreadable prompt 400, no endpoint 503...): see ``status``."""


def decision_outcome(decision: Decision, *, fallback: bool = False) -> DecisionOutcome:
    """The outcome of ``decision``; ``fallback`` says placement raised and ``placement.on_error`` answered."""
    if decision.rejection is not None:
        shed = decision.saturated and decision.rejection.status == 429
        return DecisionOutcome.SHED if shed else DecisionOutcome.REJECTED
    if fallback:
        return DecisionOutcome.FALLBACK
    if decision.cloud is not None:
        return DecisionOutcome.BURST
    if decision.degraded:
        return DecisionOutcome.DEGRADED
    if decision.shed_probe:
        return DecisionOutcome.PROBE
    if decision.saturated:
        return DecisionOutcome.SATURATED
    return DecisionOutcome.PLACED


class Histogram:
    """Bucket counts, a sum and a count: what a Prometheus histogram is, without its locks."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        """Upper bounds, ascending; an implicit +Inf bucket follows the last."""
        self.counts = [0] * (len(self.bounds) + 1)
        """Observations per bucket (not cumulative): ``counts[i]`` holds values in (bounds[i-1], bounds[i]]."""
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= bound)`` per bucket, ending with ``(inf, count)``."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class CacheSums:
    """Finished attempts whose response reported ``cached_tokens``, and the sums over exactly those."""

    reports: int = 0
    predicted_cached_tokens: float = 0.0
    achieved_cached_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class Telemetry:
    """Cumulative records of one Router (see the module docstring). Read them on the router's loop."""

    models: frozenset[str] = frozenset()
    """Model names (and LoRA adapters) the config defines: other names are recorded as ``UNKNOWN``."""
    priorities: frozenset[str] = frozenset()
    """Priority classes the config defines."""
    decisions: dict[tuple[str, str, str, str, str], int] = field(default_factory=dict)
    """(model, priority, endpoint, outcome, status) -> decisions. ``endpoint`` and ``status`` are "" when unset."""
    rewrites: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    """(requested, model, intent, how) -> decisions that carried a model rewrite (``cognitora.intent``)."""
    names: frozenset[str] = frozenset()
    """Names a rewrite label may show beside the models: the intents, aliases and weighted names of the policy."""
    decision_seconds: dict[str, Histogram] = field(default_factory=dict)
    """model -> how long ``admit`` took to decide (prompt keys, store read, placement)."""
    finished_attempts: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    """(model, endpoint, OutcomeKind value, status) -> finished attempts."""
    ttft_predicted: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    """(model, endpoint) -> predicted TTFT of attempts whose TTFT was measured (the same attempts as below)."""
    ttft_achieved: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    regret: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    """(model, endpoint) -> achieved TTFT minus the runner-up's predicted TTFT, where both are known."""
    cache: dict[tuple[str, str], CacheSums] = field(default_factory=dict)
    tokens: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """(model, endpoint, "prompt" | "completion") -> tokens of finished attempts whose response counted them."""
    store_read_seconds: Histogram = field(default_factory=lambda: Histogram(DECISION_SECONDS_BUCKETS))
    store_read_failures: int = 0
    """Reads of the fleet's state that failed or timed out (each one made a degraded decision)."""
    stats: RouterStats = field(default_factory=lambda: RouterStats())
    """The router's plain counters (``Router.stats`` is this object): one record of the router, not two."""

    @classmethod
    def for_names(cls, models: Iterable[str], priorities: Iterable[str]) -> Telemetry:
        return cls(models=frozenset(models), priorities=frozenset(priorities))

    def model_label(self, model: str) -> str:
        return model if model in self.models else UNKNOWN

    # -- what the Router calls ---------------------------------------------------------------------------------
    def decided(self, request: RouteRequest, decision: Decision, seconds: float, *, fallback: bool = False) -> None:
        """One decision of ``admit``, which took ``seconds``; logs it at INFO on ``DECISION_LOGGER``."""
        model = decision.model if decision.model in self.models else UNKNOWN
        priority = request.identity.priority if request.identity.priority in self.priorities else UNKNOWN
        outcome = decision_outcome(decision, fallback=fallback)
        status = "" if decision.rejection is None else str(decision.rejection.status)
        key = (model, priority, decision.endpoint or "", outcome.value, status)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        rewrite = decision.rewrite
        if rewrite is not None:
            known = self.models | self.names
            rkey = (
                rewrite.requested if rewrite.requested in known else UNKNOWN,
                rewrite.model if rewrite.model in known else UNKNOWN,
                "" if rewrite.intent is None else rewrite.intent if rewrite.intent in known else UNKNOWN,
                rewrite.how,
            )
            self.rewrites[rkey] = self.rewrites.get(rkey, 0) + 1
        hist = self.decision_seconds.get(model)
        if hist is None:
            hist = self.decision_seconds[model] = Histogram(DECISION_SECONDS_BUCKETS)
        hist.observe(seconds)
        if decision_log.isEnabledFor(logging.INFO):
            _log_decision(decision, request.identity.priority, outcome, seconds)

    def finished(self, record: AttemptRecord) -> None:
        """One finished attempt (``Router.recent_outcomes`` keeps the last ones too)."""
        model = self.model_label(record.model)
        pair = (model, record.endpoint)
        status = "" if record.status is None else str(record.status)
        key = (model, record.endpoint, record.kind.value, status)
        self.finished_attempts[key] = self.finished_attempts.get(key, 0) + 1
        if record.achieved_ttft_s is not None:
            _hist(self.ttft_predicted, pair, TTFT_SECONDS_BUCKETS).observe(record.predicted_ttft_s)
            _hist(self.ttft_achieved, pair, TTFT_SECONDS_BUCKETS).observe(record.achieved_ttft_s)
            if record.runner_up_predicted_ttft_s is not None:
                regret = record.achieved_ttft_s - record.runner_up_predicted_ttft_s
                _hist(self.regret, pair, REGRET_SECONDS_BUCKETS).observe(regret)
        if record.achieved_cached_tokens is not None:
            sums = self.cache.get(pair)
            if sums is None:
                sums = self.cache[pair] = CacheSums()
            sums.reports += 1
            sums.predicted_cached_tokens += record.predicted_cached_tokens
            sums.achieved_cached_tokens += record.achieved_cached_tokens
            sums.prompt_tokens += record.prompt_tokens
        if record.completion_tokens is not None:
            for kind, n in (("prompt", record.prompt_tokens), ("completion", record.completion_tokens)):
                tkey = (model, record.endpoint, kind)
                self.tokens[tkey] = self.tokens.get(tkey, 0) + n

    def store_read(self, seconds: float, ok: bool) -> None:
        self.store_read_seconds.observe(seconds)
        if not ok:
            self.store_read_failures += 1


def _hist(table: dict[tuple[str, str], Histogram], key: tuple[str, str], bounds: Sequence[float]) -> Histogram:
    hist = table.get(key)
    if hist is None:
        hist = table[key] = Histogram(bounds)
    return hist


def _log_decision(decision: Decision, priority: str, outcome: DecisionOutcome, seconds: float) -> None:
    fields: dict[str, object] = {
        "request_id": decision.request_id,
        "model": decision.model,
        "priority": priority,
        "endpoint": decision.endpoint,
        "outcome": outcome.value,
        "predicted_ttft_s": round(decision.predicted_ttft_s, 6),
        "predicted_cached_tokens": round(decision.predicted_cached_tokens, 1),
        "prompt_tokens": decision.prompt_tokens,
        "runner_up": None if decision.runner_up is None else decision.runner_up.endpoint,
        "runner_up_predicted_ttft_s": (
            None if decision.runner_up is None else round(decision.runner_up.predicted_ttft_s, 6)
        ),
        "decision_s": round(seconds, 6),
        "reason": decision.reason,
    }
    if decision.rewrite is not None:
        fields["rewrite"] = decision.rewrite.explain()
    if decision.rejection is not None:
        fields["status"] = decision.rejection.status
    if decision.cloud is not None:
        fields["cloud_target"] = decision.cloud.target
        fields["cloud_model"] = decision.cloud.model
    decision_log.info("decision", extra=fields)


@dataclass
class RouterStats:
    """The router's counters (``Router.stats``), cumulative since it started; ``cognitora.metrics`` exports them."""

    placed: int = 0
    rejected: int = 0
    degraded: int = 0
    """Decisions made without the store."""
    stale_state: int = 0
    """Decisions made on stale fleet state: the store answered, but its newest collector heartbeat was older than
    ``placement.state_max_age_s`` (or no collector ever wrote one)."""
    internal_errors: int = 0
    """Placements that raised (a bug): answered by ``placement.on_error`` (cognitora.failsafe)."""
    store_errors: int = 0
    """Store calls that failed or timed out (reads and writes)."""
    dispatched: int = 0
    finished_ok: int = 0
    finished_error: int = 0
    marked_unhealthy: int = 0
    finished_by_kind: dict[str, int] = field(default_factory=dict)
    """Finished attempts by ``OutcomeKind`` value."""
    hit_reports: int = 0
    """Finished requests whose response reported ``cached_tokens``: the two sums below cover exactly these."""
    predicted_cached_tokens: float = 0.0
    achieved_cached_tokens: int = 0
    ttft_reports: int = 0
    """Finished requests whose first token was timed: the two sums below cover exactly these."""
    predicted_ttft_s: float = 0.0
    achieved_ttft_s: float = 0.0
    oversized_prompts: int = 0
    """Prompts over ``limits.exact_prompt_max_chars``: placed on approximate keys or refused (``limits.over_limit``)."""
    offloaded_prompts: int = 0
    """Prompts keyed on the worker thread (too much to tokenize on the event loop)."""
    offload_queue_full: int = 0
    """Prompts given approximate keys because the keying thread had ``limits.offload_queue_max_chars`` queued."""
