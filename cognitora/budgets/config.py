"""The ``budgets:`` section of ``cognitora.yaml``: limits per team, key and user (and a default for each), windows,
prices, and what to do when the budget store cannot be reached.

Kept apart from ``cognitora.config`` (which imports this) so that the section is one concept in one module; the
base model repeats ``cognitora.config``'s strictness: an unknown key is an error naming it.
"""

from __future__ import annotations

import zoneinfo
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ANONYMOUS_TEAM",
    "BudgetDefaults",
    "BudgetsConfig",
    "LimitConfig",
    "Metric",
    "ModelPrice",
    "SubjectBudget",
    "SubjectKind",
    "WindowKind",
]


ANONYMOUS_TEAM = "-"
"""The team of a request that has none (no trusted source named one): one pool for all of them, in the counters
and the report alike."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class WindowKind(StrEnum):
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    MONTH = "month"
    """A calendar month in ``budgets.time_zone``."""
    ROLLING = "rolling"
    """The last ``rolling_s`` seconds."""


class Metric(StrEnum):
    """What a counter counts. Cost is counted in micro-dollars (integers: Redis counters are exact)."""

    INPUT = "input_tokens"
    OUTPUT = "output_tokens"
    TOTAL = "total_tokens"
    COST = "cost_usd"


class SubjectKind(StrEnum):
    TEAM = "team"
    KEY = "key"
    USER = "user"


class LimitConfig(_Strict):
    """One window and the caps that apply in it (one or more of the four)."""

    window: WindowKind
    """``minute``, ``hour``, ``day``, ``month`` (calendar, in ``budgets.time_zone``) or ``rolling``."""
    rolling_s: float | None = Field(default=None, ge=60, le=366 * 86400)
    """The length of a ``rolling`` window (seconds); only with ``window: rolling``."""
    input_tokens: int | None = Field(default=None, ge=0)
    """Cap on prompt tokens in the window (reserved at admission from the prompt's size, settled to the usage)."""
    output_tokens: int | None = Field(default=None, ge=0)
    """Cap on completion tokens in the window (reserved from ``max_tokens``, else ``budgets.default_max_tokens``;
    settled to the usage)."""
    total_tokens: int | None = Field(default=None, ge=0)
    """Cap on prompt plus completion tokens in the window."""
    cost_usd: float | None = Field(default=None, ge=0)
    """Needs ``budgets.prices`` for the models it should count (a model without a price costs 0)."""

    @model_validator(mode="after")
    def _check(self) -> LimitConfig:
        if self.window is WindowKind.ROLLING and self.rolling_s is None:
            raise ValueError("a rolling window needs rolling_s (its length in seconds, at least 60)")
        if self.window is not WindowKind.ROLLING and self.rolling_s is not None:
            raise ValueError(f"rolling_s is only for window: rolling (this window is {self.window.value})")
        if not self.caps():
            raise ValueError("a limit needs at least one of input_tokens, output_tokens, total_tokens, cost_usd")
        return self

    def caps(self) -> list[tuple[Metric, float]]:
        """The metrics this limit caps, with their caps (cost in dollars)."""
        values = [
            (Metric.INPUT, self.input_tokens),
            (Metric.OUTPUT, self.output_tokens),
            (Metric.TOTAL, self.total_tokens),
            (Metric.COST, self.cost_usd),
        ]
        return [(m, float(v)) for m, v in values if v is not None]


class SubjectBudget(_Strict):
    """One team's, key's or user's limits."""

    limits: list[LimitConfig] = Field(default_factory=list)
    """All apply at once: a request must fit in every one."""
    priority: str | None = None
    """Teams only: the priority class (``placement.priorities``) this team's requests get unless a trusted source
    names another."""


class BudgetDefaults(_Strict):
    """Limits for a team, key or user without its own entry (each gets its own counters of this size)."""

    team: list[LimitConfig] = Field(default_factory=list)
    """Limits of each team without an entry in ``budgets.teams`` (and of the requests without a team, unless
    ``budgets.anonymous`` is set)."""
    key: list[LimitConfig] = Field(default_factory=list)
    """Limits of each API key without an entry in ``budgets.keys``."""
    user: list[LimitConfig] = Field(default_factory=list)
    """Limits of each user without an entry in ``budgets.users``."""


class ModelPrice(_Strict):
    """What a model's tokens cost, for ``cost_usd`` limits and the report's cost column."""

    input_per_million_usd: float = Field(default=0.0, ge=0)
    """Dollars per million prompt tokens."""
    output_per_million_usd: float = Field(default=0.0, ge=0)
    """Dollars per million completion tokens."""


class BudgetsConfig(_Strict):
    """Token budgets. Counted in the store the config names (``redis_url``: Redis; absent: in process)."""

    time_zone: str = "UTC"
    """IANA time zone of the calendar windows (day, month) and of the report's days, e.g. ``Europe/Paris``."""
    on_store_error: Literal["fail_open", "fail_closed"] = "fail_open"
    """Redis unreachable (connection refused or reset, no connection within the connect timeout): ``fail_open``
    admits and counts in this process, then writes the counts to Redis when it is back (none lost);
    ``fail_closed`` refuses with 503. A Redis that is connected but slow is never a reason to admit."""
    reserve_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """The longest a request waits for its reservation while Redis is connected but slow to answer; past it the
    request is refused with 503 and Retry-After (never admitted unchecked). The wait includes the gateway's own
    event-loop lag: an overloaded gateway reads as a slow store (docs/budgets.md)."""
    reserve_batch: int = Field(default=256, ge=1, le=4096)
    """At most this many reservations (and, apart, settles) in one Redis script call: the ones that arrive while
    the previous call is out go together in the next (1: one call per request)."""
    default_max_tokens: int = Field(default=1024, ge=1)
    """Output tokens reserved for a request that sets no ``max_tokens`` (settled to what it really produced)."""
    reservation_ttl_s: float = Field(default=900.0, gt=0)
    """A reservation not settled within this (its gateway died) is settled at its estimate by the next request."""
    history_days: int = Field(default=90, ge=1, le=3660)
    """Days of per-day usage kept for ``cognitora budgets report`` (Redis TTLs)."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Per model name (as clients send it)."""
    teams: dict[str, SubjectBudget] = Field(default_factory=dict)
    """Per team id (LiteLLM: the key's ``team_id``; Envoy: the trusted team header or JWT claim)."""
    keys: dict[str, SubjectBudget] = Field(default_factory=dict)
    """Per API key id (LiteLLM: the key's hash; Envoy: the trusted key-id header)."""
    users: dict[str, SubjectBudget] = Field(default_factory=dict)
    """Per user id."""
    defaults: BudgetDefaults = Field(default_factory=BudgetDefaults)
    """Limits for a team, key or user without its own entry (``team``, ``key``, ``user``: lists of limits), each
    counted on its own counters of that size."""
    anonymous: list[LimitConfig] | None = None
    """Limits of the requests that have no team (team ``-``), all of them together in one pool. Unset:
    ``defaults.team`` applies to that pool; neither set: requests without a team meet no team limit."""

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}: use an IANA name such as UTC or Europe/Paris") from None
        return value

    @model_validator(mode="after")
    def _no_priority_outside_teams(self) -> BudgetsConfig:
        for kind, table in (("keys", self.keys), ("users", self.users)):
            for name, entry in table.items():
                if entry.priority is not None:
                    raise ValueError(f"{kind}.{name}.priority: only teams map to a priority class")
        return self

    def subjects(self, kind: SubjectKind) -> dict[str, SubjectBudget]:
        return {SubjectKind.TEAM: self.teams, SubjectKind.KEY: self.keys, SubjectKind.USER: self.users}[kind]

    def limits_for(self, kind: SubjectKind, name: str) -> tuple[str, list[LimitConfig]]:
        """The limits that apply to ``name`` and the config path they are at (for messages)."""
        if kind is SubjectKind.TEAM and name == ANONYMOUS_TEAM and self.anonymous is not None:
            return "budgets.anonymous", list(self.anonymous)
        entry = self.subjects(kind).get(name)
        if entry is not None:
            return f"budgets.{kind.value}s.{name}", entry.limits
        return f"budgets.defaults.{kind.value}", list(getattr(self.defaults, kind.value))
