"""Team isolation within a band: while another team is active in the same band, a team's request is held if
committing it would leave no eligible engine free of that team's in-flight prefill, unless no active team could
use that engine.

Why: the fair queue orders what leaves the gateway, not what is inside an engine. Once team A's long prompts are
committed to every engine, team B's short prompt waits behind an A prefill wherever it lands (an engine runs the
chunks of the prefills it started before a request that arrives meanwhile): B's TTFT is A's prefill, whatever the
queue order (docs/flow_control.md, "Measured: which order"). Keeping one engine free of A's prefill while B is
active gives B an engine where it waits for nobody's long prompt, and placement sends it there (that engine's
predicted TTFT is the lowest).

- ``TeamPrefill``: per engine, per team, the prefills this process placed that are not done yet. A prefill counts
  from its dispatch until the core learns its first token or its end (``FlowGate.freed``: both gateways report
  them; LiteLLM's SDK streams report no first token, so there the end), and at most ``prefill_margin`` x the
  decision's predicted TTFT on the engine it chose (an estimate: a report lost, a gateway without a first-token
  hook). The bound: a prefill that runs longer than that (the prediction short by more than the margin) frees
  its engine for its team early, and the rule fails open, never shut (the team is placed, as without the rule).
- ``TeamActivity``: which teams were seen lately per band (``window_s``), for "another team is active".
- ``isolation_hold``: the rule on one decision; pure.

**Same band only.** Across bands the priority hold (``cognitora.flow.priority``) is the rule: a lower band commits
only what leaves an active higher band's next request room within its objective. Isolation across bands kept a
whole engine free of a lower band's prefill for a higher band whose next request could be a second away, while
the lower band waited and timed out at the gateway (on the flow bench's overload stage, with a fixed 10 s wait,
dropping it served 45% of ``batch`` instead of 28%, for ``default``'s p99 5.6 s instead of 4.1 s;
docs/flow_control.md, "Team isolation").

**Work-conserving.** The engine kept free is kept for the other teams; it is not kept when none of them could
take it: when every other active team has requests waiting here (it is backlogged, the fair queue decides whose
turn it is) and would itself be held from that engine (its own prefill is on every other eligible engine). Else
two backlogged teams, each holding its prefill on one engine, would each keep the idle other engine for the other,
and nobody would take it. A team that is active but not waiting (a light team, placed as its requests come) keeps
the hold: its next request is the one the free engine is for.

The rule never holds on a fleet of one eligible engine (nothing to keep free), nor a request the anti-starvation
rule dispatches (the caller skips it, as for ``cognitora.flow.priority``). What it costs: the busy team's
throughput while a light team is active (its prefills take every engine but one), and, below saturation, a team's
second concurrent long prefill may wait for its first (one prefill) when placement would have put it on the one
free engine.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from cognitora.decision import Decision
from cognitora.flow.config import HoldReason
from cognitora.flow.saturation import Saturation

__all__ = ["Busy", "Rival", "TeamActivity", "TeamPrefill", "isolation_hold", "prefill_endpoint"]


@dataclass(frozen=True)
class Busy:
    """One team's in-flight prefill on one engine."""

    prefills: int
    until: float
    """When the last of them is expected done (clock seconds): its estimate, unless a report comes first."""


@dataclass(frozen=True)
class Rival:
    """Another team active in the same band: why a team's request may keep an engine free."""

    band: str
    flow: str
    waiting: bool
    """It has waiters (else: it was seen within the window)."""


def prefill_endpoint(decision: Decision) -> str | None:
    """Where ``decision``'s prefill runs: its prefill leg's engine when split, else the engine it chose."""
    return decision.prefill.endpoint if decision.prefill is not None else decision.endpoint


class TeamPrefill:
    """In-flight prefill per engine per team, as this process placed it (see the module doc). Memory: one entry
    per prefill in flight, and one heap item per prefill placed within its longest estimate."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[str, str, float]] = {}
        """Request id -> (flow, engine, estimated end)."""
        self._by_flow: dict[str, dict[str, dict[str, float]]] = {}
        """Flow -> engine -> request id -> estimated end."""
        self._expiry: list[tuple[float, str]] = []

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def add(self, request_id: str, flow: str, endpoint: str, duration_s: float) -> None:
        """``request_id`` of ``flow`` was dispatched to ``endpoint`` (its prefill's), expected done within
        ``duration_s``."""
        self._expire()
        self.done(request_id)
        until = self._clock() + max(0.0, duration_s)
        self._entries[request_id] = (flow, endpoint, until)
        self._by_flow.setdefault(flow, {}).setdefault(endpoint, {})[request_id] = until
        heapq.heappush(self._expiry, (until, request_id))

    def done(self, request_id: str) -> None:
        """Its prefill is over (a first token, its end): its engine no longer counts it. Unknown ids are ignored."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return
        flow, endpoint, _ = entry
        engines = self._by_flow[flow]
        ids = engines[endpoint]
        del ids[request_id]
        if not ids:
            del engines[endpoint]
            if not engines:
                del self._by_flow[flow]

    def busy(self, flow: str) -> dict[str, Busy]:
        """The engines holding ``flow``'s in-flight prefill now. O(its prefills in flight)."""
        self._expire()
        engines = self._by_flow.get(flow, {})
        return {e: Busy(len(ids), max(ids.values())) for e, ids in engines.items()}

    def _expire(self) -> None:
        now = self._clock()
        heap = self._expiry
        while heap and heap[0][0] <= now:
            until, request_id = heapq.heappop(heap)
            entry = self._entries.get(request_id)
            if entry is not None and entry[2] == until:  # not re-added meanwhile with a later estimate
                self.done(request_id)


class TeamActivity:
    """When each team last sent a request in each band (see ``IsolationConfig.window_s``)."""

    def __init__(self, bands: Sequence[str], window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``bands``: the bands' names (a class that is not one is not tracked)."""
        self._window_s = window_s
        self._clock = clock
        self._seen: dict[str, OrderedDict[str, float]] = {b: OrderedDict() for b in bands}
        """Band -> flow -> last seen, oldest first (so a read stops at the first stale one)."""

    def saw(self, band: str, flow: str) -> None:
        seen = self._seen.get(band)
        if seen is None:
            return
        now = self._clock()
        seen.pop(flow, None)
        seen[flow] = now
        while seen:  # forget the stale: bounded by the teams seen within the window
            oldest, at = next(iter(seen.items()))
            if now - at <= self._window_s:
                break
            del seen[oldest]

    def rivals(self, band: str, flow: str, waiting: Collection[str]) -> list[Rival]:
        """The other teams than ``flow`` active in ``band``: those with waiters (``waiting``: the flows waiting in
        ``band``) first, then those seen within the window. Empty: ``flow`` is alone. Another band's teams do not
        count (the module doc, "Same band only"). O(teams of the band seen within the window)."""
        out = [Rival(band, f, True) for f in waiting if f != flow]
        seen = self._seen.get(band)
        if seen is None:
            return out
        now = self._clock()
        queued = set(waiting)
        for other, at in reversed(seen.items()):
            if now - at > self._window_s:
                break
            if other != flow and other not in queued:
                out.append(Rival(band, other, False))
        return out


def isolation_hold(
    decision: Decision,
    flow: str,
    busy: Mapping[str, Busy],
    rivals: Sequence[Rival],
    now: float,
    busy_of: Callable[[str], Mapping[str, Busy]],
) -> Saturation | None:
    """Hold ``decision``'s request of ``flow`` when committing it would leave no eligible engine free of ``flow``'s
    in-flight prefill (``busy``: ``TeamPrefill.busy(flow)``) and one of the other active teams (``rivals``) could
    use that engine: it is not waiting (its next request comes and wants a free engine), or it waits and has an
    eligible engine besides that one free of its own prefill (``busy_of(team)``), so this rule would not hold it
    from that engine. None on a fleet of one eligible engine, for a decision placed nowhere or in a cloud, or with
    no rival."""
    if decision.endpoint is None or decision.cloud is not None or not rivals:
        return None
    eligible = list(dict.fromkeys(c.endpoint for c in decision.candidates if c.excluded is None))
    if len(eligible) < 2:
        return None
    chosen = prefill_endpoint(decision)
    others = [e for e in eligible if e != chosen]
    if any(e not in busy for e in others):
        return None
    rival = next((r for r in rivals if not r.waiting or _could_take(others, busy_of(r.flow))), None)
    if rival is None:  # every other team is backlogged here and held from that engine too: the queue's order decides
        return None
    held = sorted((e for e in eligible if e in busy), key=lambda e: busy[e].until)
    where = "; ".join(
        f"{e}: {busy[e].prefills} in flight, done in ~{max(0.0, busy[e].until - now):.2f} s" for e in held[:3]
    )
    because = "has requests waiting" if rival.waiting else "sent a request lately"
    return Saturation(
        HoldReason.SLO,
        f"held for team isolation: {rival.flow} {because} in band {rival.band!r}, and placing this on {chosen} "
        f"would leave no engine free of {flow}'s in-flight prefill ({where})",
        label="isolation",
    )


def _could_take(others: Sequence[str], its_busy: Mapping[str, Busy]) -> bool:
    """A waiting team's request on the engine in question would not be held by this rule: one of the ``others``
    (every eligible engine but that one) is free of its own prefill."""
    return any(e not in its_busy for e in others)
