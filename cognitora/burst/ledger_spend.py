"""``LedgerSpend``: the burst's ``SpendGate`` on the budgets ledger (Redis, Redis Cluster or in-process: where
``budgets:`` keeps its counters), so cloud spend and ``burst.team_spend_limit_usd`` are shared by every gateway
replica and shown by ``cognitora budgets report``.

- ``record``: each finished cloud attempt is a budgets charge (``cognitora.budgets.charges``), once per request id,
  under ``<model>@<target>`` at the target's prices, for its team, key and user: it counts against their token
  and cost budgets like a local request, and adds to one more counter, the team's cloud spend this month
  (``burst_spend:<team>:cost_usd:m<YYYY-MM>``, in ``budgets.time_zone``).
- ``hold``/``within_limit``: that counter, plus the estimated cost of this process's cloud requests in flight
  (``spend.Holds``), against the team's limit. It is read only for a request that would burst (the router awaits
  ``refresh`` then), at most once per ``SPEND_FRESH_S`` per team and process; what this process recorded since its
  last read is added, so one gateway never overshoots by its own spend. Other replicas' spend is seen within
  ``SPEND_FRESH_S`` (their requests in flight are not). A read that fails keeps the last value (the limit is
  checked on what is known; the cloud answers meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cognitora.budgets.charges import Charge, charge_reservation
from cognitora.budgets.config import LimitConfig, Metric, SubjectKind, WindowKind
from cognitora.budgets.gate import BudgetGate
from cognitora.budgets.plan import MICRO, CounterPlan, escape
from cognitora.budgets.windows import current_window
from cognitora.burst.spend import CloudSpend, HoldingSpend

if TYPE_CHECKING:
    from cognitora.config import CognitoraConfig

__all__ = ["SPEND_FRESH_S", "LedgerSpend", "ledger_spend_for", "spend_counter"]

log = logging.getLogger(__name__)

SPEND_FRESH_S = 1.0
"""How long a team's cloud spend read from the ledger is used before a bursting request reads it again."""
_MONTH = LimitConfig(window=WindowKind.MONTH, cost_usd=0)


@dataclass
class _Known:
    read_at: float = -1e18
    spent_micro: int = 0
    """The counter as last read."""
    since_read_micro: int = 0
    """Recorded by this process after that read started."""


def spend_counter(gate: BudgetGate, team: str, limit_usd: float, now: float) -> CounterPlan:
    """The team's cloud spend counter for the month ``now`` is in (never a budget limit: nothing reserves on it)."""
    span = current_window(_MONTH, now, gate.planner.zone)
    return CounterPlan(
        name=f"burst_spend:{escape(team)}:cost_usd:{span.id}",
        metric=Metric.COST,
        cap=round(limit_usd * MICRO),
        amount=0,
        expire_at_ms=int(span.expire_at * 1000),
        resets_at_ms=int(span.resets_at * 1000),
        limit_path=f"burst.team_spend_limit_usd.{team}",
        window=f"month ({gate.config.time_zone})",
        subject_kind=SubjectKind.TEAM,
        subject=team,
    )


class LedgerSpend(HoldingSpend):
    def __init__(
        self, gate: BudgetGate, limit_of: Callable[[str], float | None], clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(limit_of)
        self._gate = gate
        self._clock = clock
        self._known: dict[str, _Known] = {}
        self._reading: dict[str, asyncio.Future[None]] = {}
        self.reads = 0
        """Ledger reads made (tests: one per ``SPEND_FRESH_S`` and team, none for local decisions)."""

    def spent_usd(self, team: str) -> float:
        known = self._known.get(team)
        return 0.0 if known is None else (known.spent_micro + known.since_read_micro) / MICRO

    async def refresh(self, team: str) -> None:
        """Read the team's spend from the ledger unless it was read within ``SPEND_FRESH_S`` (or it has no limit)."""
        limit = self.limit_usd(team)
        if limit is None:
            return
        known = self._known.setdefault(team, _Known())
        now = self._clock()
        if now - known.read_at < SPEND_FRESH_S:
            return
        pending = self._reading.get(team)
        if pending is None:
            pending = self._reading[team] = asyncio.ensure_future(self._read(team, known, limit, now))
            pending.add_done_callback(lambda _: self._reading.pop(team, None))
        await asyncio.shield(pending)

    async def _read(self, team: str, known: _Known, limit: float, now: float) -> None:
        before = known.since_read_micro
        try:
            (value,) = await self._gate.counter_values([spend_counter(self._gate, team, limit, now)])
        except Exception as exc:  # a failed read keeps the last value, whatever the store raised
            log.warning("could not read team %r's cloud spend from the budget store (%s): keeping the last", team, exc)
            known.read_at = now  # not again at once: every bursting request would wait on a store that is down
            return
        self.reads += 1
        known.read_at, known.spent_micro = now, value
        known.since_read_micro = max(0, known.since_read_micro - before)

    def record(self, spend: CloudSpend) -> None:
        now = self._clock()
        charge = Charge(
            charge_id=f"burst:{spend.request_id}",
            model=spend.model,
            target=spend.target,
            team=spend.team,
            key=spend.key,
            user=spend.user,
            input_tokens=spend.input_tokens,
            output_tokens=spend.output_tokens,
            cost_usd=spend.cost_usd,
        )
        reservation, usage = charge_reservation(self._gate.planner, charge, now)
        limit = self.limit_usd(spend.team)
        counter = spend_counter(self._gate, spend.team, 0.0 if limit is None else limit, now)
        self._gate.charge_later(replace(reservation, counters=(*reservation.counters, counter)), usage)
        known = self._known.setdefault(spend.team, _Known())
        known.since_read_micro += usage.cost_micro_usd


def ledger_spend_for(config: CognitoraConfig, gate: BudgetGate | None) -> LedgerSpend | None:
    """The burst's spend gate on ``gate``'s ledger, or None (the in-process one) without ``budgets:``."""
    if gate is None:
        return None
    return LedgerSpend(gate, config.burst.spend_limit_usd)
