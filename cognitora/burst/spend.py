"""Cloud spend per team: the ``SpendGate`` protocol the burst policy asks, and an in-process implementation.

The per-team token budgets (``cognitora.budgets``) are the place a shared, durable ledger belongs; this protocol is
what burst needs of one, so the two meet in one adapter: ``hold(...)`` when a request is decided for the cloud (its
estimated cost, refused when spend plus the holds in flight plus it would pass the team's limit), ``release(...)``
when it ended (or was not sent), ``record(...)`` with what it cost. Holds are what keeps concurrent requests from
passing the limit together: the spend of a request is known only at its end. ``InProcessSpend`` keeps the sums in
this process, since it started (the exporter's figures, and the gate when ``budgets:`` is not configured);
``cognitora.burst.ledger_spend`` keeps them in the budgets ledger, shared by every replica.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CloudSpend", "HoldingSpend", "Holds", "InProcessSpend", "SpendGate", "SpendRow"]


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

    def hold(self, request_id: str, team: str, estimate_usd: float) -> bool:
        """Hold ``estimate_usd`` of ``team``'s cloud spend for a request about to go out; False (nothing held) when
        what it spent, plus the holds of its requests in flight, plus this one would pass its limit."""
        ...

    def release(self, request_id: str) -> None:
        """The request's hold is over (it ended, or did not go out). Unknown ids are ignored."""
        ...

    def within_limit(self, team: str) -> bool:
        """Whether ``team``'s spend plus its holds is still within its limit (none: True)."""
        ...

    def record(self, spend: CloudSpend) -> None:
        """A request was served by a cloud target: its tokens and what they cost."""
        ...


class Holds:
    """Estimated spend of the cloud requests in flight, per team, by request id (this process's)."""

    def __init__(self) -> None:
        self._by_request: dict[str, tuple[str, float]] = {}
        self._by_team: dict[str, list[float]] = {}
        """team -> [held USD, requests]."""

    def of(self, team: str) -> float:
        row = self._by_team.get(team)
        return 0.0 if row is None else row[0]

    def add(self, request_id: str, team: str, usd: float) -> None:
        self.remove(request_id)
        self._by_request[request_id] = (team, usd)
        row = self._by_team.setdefault(team, [0.0, 0])
        row[0] += usd
        row[1] += 1

    def remove(self, request_id: str) -> None:
        held = self._by_request.pop(request_id, None)
        if held is None:
            return
        team, usd = held
        row = self._by_team[team]
        row[0] -= usd
        row[1] -= 1
        if row[1] == 0:
            del self._by_team[team]  # no float residue left behind


def fits(spent_usd: float, held_usd: float, estimate_usd: float, limit_usd: float | None) -> bool:
    """Whether a request estimated at ``estimate_usd`` may go out under ``limit_usd`` (None: no limit)."""
    return limit_usd is None or spent_usd + held_usd + estimate_usd <= limit_usd * (1 + 1e-9)


@dataclass
class SpendRow:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class HoldingSpend(ABC):
    """The holds half of a ``SpendGate``, over what a subclass says a team spent; its limit from ``limit_of``."""

    def __init__(self, limit_of: Callable[[str], float | None]) -> None:
        self._limit_of = limit_of
        self.holds = Holds()

    def limit_usd(self, team: str) -> float | None:
        """``team``'s cloud spend limit this month (``burst.team_spend_limit_usd``); None: no limit."""
        return self._limit_of(team)

    @abstractmethod
    def spent_usd(self, team: str) -> float:
        """What ``team`` spent on the cloud, as this gate knows it."""

    def hold(self, request_id: str, team: str, estimate_usd: float) -> bool:
        if not fits(self.spent_usd(team), self.holds.of(team), estimate_usd, self._limit_of(team)):
            return False
        self.holds.add(request_id, team, estimate_usd)
        return True

    def release(self, request_id: str) -> None:
        self.holds.remove(request_id)

    def within_limit(self, team: str) -> bool:
        return fits(self.spent_usd(team), self.holds.of(team), 0.0, self._limit_of(team))


class InProcessSpend(HoldingSpend):
    """Sums per (team, target) in this process; a team's limit comes from ``limit_of`` (None: no limit)."""

    def __init__(self, limit_of: Callable[[str], float | None]) -> None:
        super().__init__(limit_of)
        self.rows: dict[tuple[str, str], SpendRow] = {}

    def spent_usd(self, team: str) -> float:
        return sum(row.cost_usd for (t, _), row in self.rows.items() if t == team)

    def record(self, spend: CloudSpend) -> None:
        row = self.rows.get((spend.team, spend.target))
        if row is None:
            row = self.rows[(spend.team, spend.target)] = SpendRow()
        row.requests += 1
        row.input_tokens += spend.input_tokens
        row.output_tokens += spend.output_tokens
        row.cost_usd += spend.cost_usd
