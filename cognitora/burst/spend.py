"""Cloud spend per team: the ``SpendGate`` protocol the burst policy asks, and an in-process implementation.

The per-team token budgets (``cognitora.budgets``) are the place a shared, durable ledger belongs; this protocol is
what burst needs of one, so the two meet in one adapter: ``may_burst(team)`` before a request bursts,
``record(...)`` when it finished. ``InProcessSpend`` keeps the sums in this process, since it started (the
exporter's figures, and the gate when ``budgets:`` is not configured); ``cognitora.burst.ledger_spend`` keeps them
in the budgets ledger, shared by every replica.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CloudSpend:
    """One finished cloud attempt: who it was for (from the gateway's authentication), where, and what it cost."""

    request_id: str
    team: str
    target: str
    model: str
    """The local model name the request asked for (the report shows ``<model>@<target>``)."""
    input_tokens: int
    output_tokens: int
    cost_usd: float
    key: str | None = None
    user: str | None = None


class SpendGate(Protocol):
    """What the burst policy needs of a spend ledger."""

    def may_burst(self, team: str) -> bool:
        """Whether ``team`` may spend more on the cloud (its limit, if any, is not reached)."""
        ...

    def record(self, spend: CloudSpend) -> None:
        """A request was served by a cloud target: its tokens and what they cost."""
        ...


@dataclass
class SpendRow:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class InProcessSpend:
    """Sums per (team, target) in this process; a team's limit comes from ``limit_of`` (None: no limit)."""

    def __init__(self, limit_of: Callable[[str], float | None]) -> None:
        self._limit_of = limit_of
        self.rows: dict[tuple[str, str], SpendRow] = {}

    def spent_usd(self, team: str) -> float:
        return sum(row.cost_usd for (t, _), row in self.rows.items() if t == team)

    def may_burst(self, team: str) -> bool:
        limit = self._limit_of(team)
        return limit is None or self.spent_usd(team) < limit

    def record(self, spend: CloudSpend) -> None:
        row = self.rows.get((spend.team, spend.target))
        if row is None:
            row = self.rows[(spend.team, spend.target)] = SpendRow()
        row.requests += 1
        row.input_tokens += spend.input_tokens
        row.output_tokens += spend.output_tokens
        row.cost_usd += spend.cost_usd
