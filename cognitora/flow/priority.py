"""Strict priority at admission, not only in the queue's order: while a higher band is active, a lower band's
request is not committed to engines that already hold more queued work than that band's objective.

Why: the hold rule (``cognitora.flow.saturation``) holds a request when every engine misses *its own* class's
objective. A lax class (``batch``, 30 s) is then placed until the engines hold ~30 s of work, and a strict class
(``default``, 2 s) that arrives finds no engine under 2 s: it waits behind that backlog, which the queue's band
order cannot undo (it is already inside the engines). So a request of band k is also held when, for the strictest
objective S among the *active* bands above k, every eligible engine's load (``load_s``: its queued prefill, seat
and KV waits, what it slows by its resident context and decode) is over S. A band is active while it has waiters
in this process's queue, or for ``flow_control.priority_window_s`` after its last request here (a steady stream of
``default`` keeps ``batch`` under the 2 s ceiling even between its arrivals; an hour without ``default`` lets
``batch`` use the 30 s it is allowed). The engines stay busy (S seconds of queued work is enough to keep them
batching); the lower band waits at the gateway instead, where it is shed first (its ``max_wait_s``, then 429).

Bounds: the committed work may exceed S by one lower-band request's prefill (the check reads the load before the
request is added); a request dispatched by the anti-starvation rule (``Ticket.aged``) is not held by it, so the
documented aged share still reaches the lower bands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cognitora.decision import Decision
from cognitora.flow.config import HoldReason
from cognitora.flow.saturation import Saturation, load_s

__all__ = ["BandActivity", "Ceiling", "priority_hold"]


@dataclass(frozen=True)
class Ceiling:
    """The objective a lower band's request must leave room for: the strictest active band above it."""

    band: str
    slo_s: float


class BandActivity:
    """When each band last saw a request here, and so which higher band's objective caps a lower band."""

    def __init__(
        self,
        bands: Sequence[tuple[str, float]],
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``bands``: (class, its TTFT objective), highest band first (``plan_bands``' order)."""
        self._bands = list(bands)
        self._window_s = window_s
        self._clock = clock
        self._seen: dict[str, float] = {}

    def saw(self, band: str) -> None:
        """A request of ``band`` arrived (placed at once or queued)."""
        self._seen[band] = self._clock()

    def ceiling(self, band: str, waiting: Mapping[str, int]) -> Ceiling | None:
        """The strictest objective among the active bands above ``band`` (``waiting``: waiters per band), when it
        is stricter than ``band``'s own; None otherwise (the highest band, or nothing above it is active)."""
        now = self._clock()
        own = next((slo for name, slo in self._bands if name == band), None)
        if own is None:
            return None
        best: Ceiling | None = None
        for name, slo in self._bands:
            if name == band:
                break
            seen = self._seen.get(name)
            active = waiting.get(name, 0) > 0 or (seen is not None and now - seen <= self._window_s)
            if active and slo < own and (best is None or slo < best.slo_s):
                best = Ceiling(name, slo)
        return best


def priority_hold(decision: Decision, ceiling: Ceiling) -> Saturation | None:
    """Hold ``decision``'s request for the higher band of ``ceiling``: every eligible engine's load is over that
    band's objective (see the module doc). None when one engine has room under it, or the decision is refused for
    anything but saturation."""
    if decision.rejection is not None and not decision.saturated:
        return None
    eligible = [c for c in decision.candidates if c.excluded is None]
    if not eligible:
        return None
    loads = [(load_s(c), c.endpoint) for c in eligible]
    least, endpoint = min(loads)
    if least <= ceiling.slo_s:
        return None
    return Saturation(
        HoldReason.SLO,
        f"held for band {ceiling.band!r}: every engine holds more queued work than its {ceiling.slo_s:g} s "
        f"objective (the least, {endpoint}, {least:.2f} s)",
        label="priority",
    )
