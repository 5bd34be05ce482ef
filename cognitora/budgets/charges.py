"""Spend recorded outside placement, through the same ledger: ``charge`` a team (key, user) N tokens, or a cost,
for model M on target T. For the cloud burst (a request served by a cloud provider, not by a local engine), or for
an operator's correction. Counted against the same limits and in the same report rows as placed requests; exact
and once per ``charge_id`` (a repeated charge is a no-op).

    await record_charge(gate.ledger, gate.planner, Charge("burst-123", team="alpha", model="gpt-4o", target="openai",
                                                         input_tokens=812, output_tokens=96, cost_usd=0.0031))
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cognitora.budgets.ledger import BudgetLedger, SettleResult
from cognitora.budgets.plan import MICRO, Planner, Reservation, Usage
from cognitora.identity import Identity

__all__ = ["Charge", "charge_reservation", "record_charge"]


@dataclass(frozen=True)
class Charge:
    charge_id: str
    """Unique per charge (the request id): the ledger counts it once."""
    model: str
    """The model as the report shows it."""
    target: str
    """Where it was served (a cloud target's name): the report's model column reads ``<model>@<target>``."""
    team: str | None = None
    key: str | None = None
    user: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None
    """What the provider billed; None: priced from ``budgets.prices`` for ``model``."""


def charge_reservation(planner: Planner, charge: Charge, now: float) -> tuple[Reservation, Usage]:
    """The reservation (never sent to the store: its settle adds the usage in full, once) and the usage of
    ``charge``."""
    if charge.cost_usd is None:
        usage = planner.usage(charge.model, charge.input_tokens, charge.output_tokens, charge.cached_tokens)
    else:
        usage = Usage(charge.input_tokens, charge.output_tokens, charge.cached_tokens, round(charge.cost_usd * MICRO))
    identity = Identity(charge.team, charge.key, charge.user)
    return planner.plan(charge.charge_id, identity, f"{charge.model}@{charge.target}", Usage(), now), usage


async def record_charge(
    ledger: BudgetLedger, planner: Planner, charge: Charge, now: float | None = None
) -> SettleResult:
    """Add ``charge`` to every counter its team/key/user has, and to the report. Limits are not checked (the
    spend already happened: the next request sees it); raises ``StoreUnavailable`` when the store is down."""
    reservation, usage = charge_reservation(planner, charge, time.time() if now is None else now)
    # A settle of a reservation the store never saw adds the usage in full, once per id: exactly a charge.
    return await ledger.settle(reservation, usage)
