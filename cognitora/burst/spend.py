"""Cloud spend per team: the ``SpendGate`` protocol the burst policy asks, and an in-process implementation.

The per-team token budgets (``cognitora.budgets``) are the place a shared, durable ledger belongs; this protocol is
what burst needs of one, so the two meet in one adapter: ``may_burst(team)`` before a request bursts,
``record(...)`` when it finished. ``InProcessSpend`` keeps the sums in this process, since it started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class SpendGate(Protocol):
    """What the burst policy needs of a spend ledger."""

    def may_burst(self, team: str) -> bool:
        """Whether ``team`` may spend more on the cloud (its limit, if any, is not reached)."""
        ...

    def record(self, team: str, target: str, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        """A request of ``team`` was served by ``target``: its tokens and what they cost."""
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

    def record(self, team: str, target: str, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        row = self.rows.get((team, target))
        if row is None:
            row = self.rows[(team, target)] = SpendRow()
        row.requests += 1
        row.input_tokens += input_tokens
        row.output_tokens += output_tokens
        row.cost_usd += cost_usd
