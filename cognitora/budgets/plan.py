"""One request's budget plan: which counters it touches, what it reserves in each, and the report rows it adds.

Pure: the same plan is run by the Redis script and by the in-process ledger (and kept by the gate for the settle,
or for the fail-open backlog), so both stores count exactly alike.

Counter names carry the subject, the metric and the window id (``team:alpha:total_tokens:m2026-12``): a new
window is a new counter (no reset job), and reordering limits in the config moves no count.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from cognitora.budgets.config import ANONYMOUS_TEAM, BudgetsConfig, LimitConfig, Metric, SubjectKind
from cognitora.budgets.estimate import output_tokens
from cognitora.budgets.windows import WindowCache, window_label
from cognitora.identity import Identity
from cognitora.request import RouteRequest

__all__ = [
    "CounterPlan",
    "Identity",
    "Planner",
    "Reservation",
    "Usage",
    "counter_name",
    "escape",
    "row_field",
    "subjects",
]

MICRO = 1_000_000
"""Cost is counted in micro-dollars: integer counters stay exact."""
ROW_METRICS = ("requests", "input_tokens", "output_tokens", "cached_tokens", "cost_micro_usd", "rejections")


@functools.lru_cache(maxsize=4096)
def escape(name: str) -> str:
    """A subject or model name made safe inside a key or a report field (no separator, no hash-tag brace)."""
    out = name.replace("%", "%25")
    for ch, code in ((":", "%3A"), ("{", "%7B"), ("}", "%7D"), ("\t", "%09"), (" ", "%20"), ("\n", "%0A")):
        out = out.replace(ch, code)
    return out[:200]


def unescape(name: str) -> str:
    for ch, code in (("\n", "%0A"), (" ", "%20"), ("\t", "%09"), ("}", "%7D"), ("{", "%7B"), (":", "%3A")):
        name = name.replace(code, ch)
    return name.replace("%25", "%")


def counter_name(kind: SubjectKind, subject: str, metric: Metric, window_id: str) -> str:
    return f"{kind.value}:{escape(subject)}:{metric.value}:{window_id}"


@functools.lru_cache(maxsize=4096)
def row_field(kind: str, subject: str, model: str, metric: str) -> str:
    """A field of a day's usage hash: ``team\\talpha\\tsmollm2\\tinput_tokens``."""
    return f"{kind}\t{escape(subject)}\t{escape(model)}\t{metric}"


@dataclass(frozen=True)
class Usage:
    """Tokens (and cost, micro-dollars) of one request: its estimate, or what it really used."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_micro_usd: int = 0

    def of(self, metric: Metric) -> int:
        if metric is Metric.INPUT:
            return self.input_tokens
        if metric is Metric.OUTPUT:
            return self.output_tokens
        if metric is Metric.TOTAL:
            return self.input_tokens + self.output_tokens
        return self.cost_micro_usd


def subjects(identity: Identity) -> list[tuple[SubjectKind, str]]:
    """Whom a request is counted for: its team (``ANONYMOUS_TEAM`` when it has none), key and user."""
    found = [
        (SubjectKind.TEAM, identity.team or ANONYMOUS_TEAM),
        (SubjectKind.KEY, identity.key),
        (SubjectKind.USER, identity.user),
    ]
    return [(k, v) for k, v in found if v]


@dataclass(frozen=True)
class CounterPlan:
    """One counter a request touches: a limit's metric, for one subject, in the current window."""

    name: str
    """``counter_name``: the ledger prefixes it."""
    metric: Metric
    cap: int
    """In the metric's unit (tokens, or micro-dollars)."""
    amount: int
    """Reserved: the estimate's value of ``metric``."""
    expire_at_ms: int
    resets_at_ms: int
    bucket: int | None = None
    min_bucket: int | None = None
    bucket_ms: int | None = None
    limit_path: str = ""
    """``budgets.teams.alpha.limits[0].total_tokens``: what a refusal names."""
    window: str = ""
    """``month (UTC)``, ``rolling 3600 s``."""
    subject_kind: SubjectKind = SubjectKind.TEAM
    subject: str = ""

    @property
    def rolling(self) -> bool:
        return self.bucket is not None


@dataclass(frozen=True)
class Reservation:
    request_id: str
    identity: Identity
    model: str
    estimate: Usage
    counters: tuple[CounterPlan, ...]
    day: str
    """The report day the request counts on (the day it was admitted)."""
    rows: tuple[tuple[str, str, str], ...]
    """(kind, subject, model) report rows: one per subject, team ``-`` when the request has no team."""
    lease_expires_ms: int
    created_at: float = field(default_factory=time.time)

    def row_fields(self, usage: Usage, requests: int, rejections: int = 0) -> list[tuple[str, int]]:
        values = (
            requests,
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_tokens,
            usage.cost_micro_usd,
            rejections,
        )
        return [
            (row_field(kind, subject, model, metric), value)
            for kind, subject, model in self.rows
            for metric, value in zip(ROW_METRICS, values, strict=True)
            if value
        ]


class Planner:
    """Builds reservations from the ``budgets`` section."""

    def __init__(self, config: BudgetsConfig) -> None:
        self.config = config
        self.zone = ZoneInfo(config.time_zone)
        self._windows = WindowCache(self.zone)

    def cost_micro(self, model: str, input_tokens: int, output_tokens: int) -> int:
        price = self.config.prices.get(model)
        if price is None:
            return 0
        # A price per million tokens times tokens is micro-dollars.
        return round(input_tokens * price.input_per_million_usd + output_tokens * price.output_per_million_usd)

    def usage(self, model: str, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> Usage:
        return Usage(input_tokens, output_tokens, cached_tokens, self.cost_micro(model, input_tokens, output_tokens))

    def estimate(self, model: str, prompt_tokens: int, max_tokens: int | None) -> Usage:
        """One sequence of up to ``max_tokens`` (else ``default_max_tokens``) after ``prompt_tokens``."""
        output = self.config.default_max_tokens if max_tokens is None else max_tokens
        return self.usage(model, prompt_tokens, output)

    def estimate_request(self, request: RouteRequest, model: str, prompt_tokens: int) -> Usage:
        """What ``request`` reserves: its prompt tokens (the sum over a batch) and every sequence it may generate,
        by its surface (``cognitora.budgets.estimate``)."""
        return self.usage(model, prompt_tokens, output_tokens(request, self.config.default_max_tokens))

    def plan(
        self, request_id: str, identity: Identity, model: str, estimate: Usage, now: float | None = None
    ) -> Reservation:
        now = time.time() if now is None else now
        counters: dict[str, CounterPlan] = {}
        for kind, subject in subjects(identity):
            path, limits = self.config.limits_for(kind, subject)
            for i, limit in enumerate(limits):
                for plan in self._counters(kind, subject, f"{path}.limits[{i}]", limit, estimate, now):
                    known = counters.get(plan.name)
                    if known is None or plan.cap < known.cap:  # two limits on one counter: the tighter rules
                        counters[plan.name] = plan
        rows = [(k.value, s, model) for k, s in subjects(identity)]
        return Reservation(
            request_id=request_id,
            identity=identity,
            model=model,
            estimate=estimate,
            counters=tuple(counters.values()),
            day=self._windows.day(now),
            rows=tuple(rows),
            lease_expires_ms=int((now + self.config.reservation_ttl_s) * 1000),
            created_at=now,
        )

    def _counters(
        self, kind: SubjectKind, subject: str, path: str, limit: LimitConfig, estimate: Usage, now: float
    ) -> list[CounterPlan]:
        span = self._windows.span(limit, now)
        out = []
        for metric, cap in limit.caps():
            out.append(
                CounterPlan(
                    name=counter_name(kind, subject, metric, span.id),
                    metric=metric,
                    cap=round(cap * MICRO) if metric is Metric.COST else int(cap),
                    amount=estimate.of(metric),
                    expire_at_ms=int(span.expire_at * 1000),
                    resets_at_ms=int(span.resets_at * 1000),
                    bucket=span.bucket,
                    min_bucket=span.min_bucket,
                    bucket_ms=None if span.bucket_s is None else int(span.bucket_s * 1000),
                    limit_path=f"{path}.{metric.value}",
                    window=window_label(limit, self.zone),
                    subject_kind=kind,
                    subject=subject,
                )
            )
        return out
