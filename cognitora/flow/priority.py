"""Strict priority at admission, not only in the queue's order: while a higher band is active, a lower band's
request is committed to an engine only if a request of that band arriving next could still meet its objective.

Why: the hold rule (``cognitora.flow.saturation``) holds a request when every engine misses *its own* class's
objective. A lax class (``batch``, 30 s) is then placed until the engines hold ~30 s of work, and a strict class
(``default``, 2 s) that arrives finds no engine under 2 s: it waits behind that backlog, which the queue's band
order cannot undo (it is already inside the engines). So a request of band k is also held, while a band above it
with a stricter objective S is *active*, unless one of these holds for the engine placement chose:

- **room**: once this request is committed there, some eligible engine still has room for the higher band's
  next request: its load (``load_s``; on the chosen engine, this request's predicted TTFT: its load and its own
  prefill) plus that band's own TTFT (the most of its recent requests' predicted TTFT with the load taken away,
  ``BandActivity.room_s``) is within S; and (``flow_control.priority_arrivals_quantile``, 0.9 by default, once
  the band's rate is known) **room for its arrivals**: this request takes its engine for T (its predicted TTFT
  there), in which the higher band sends ``rate x T`` requests on average (its rate: its requests of the last
  ``RATE_WINDOW_S`` (10 s) over the span they cover); the other engines can start n of its
  requests each within S, n the 0.9 quantile of a Poisson count of that mean (``poisson_quantile``):
  ``sum over the other engines of (T + S - own - load) >= n x own``;
- **no room possible**: the chosen engine has no prefill queued or running (no queued prefill tokens, no seat or
  KV wait) and no engine could keep room anyway: it is the only eligible engine, or the higher band's own
  TTFT alone is over S. Then the rule would only starve the lower band beside an idle engine.

Every predicted time here is multiplied by the prediction margin (``cognitora.flow.margin``).

Why room for the arrivals: room for the next request alone let ``batch`` (2 s prefills) take one of two engines
whenever the other had up to 0.8 s of load, so ``default`` (1 request a second of 1.2 s, 2 s objective: 1.2
engines of work) had one engine for most of the stage, and it was ``default`` that was shed (29% on the flow
bench, docs/flow_control.md). On that bench it keeps ``batch`` out while ``default`` is active (in batch's 2 s,
2 requests are expected and 4 cover 9 times in 10; two engines cannot keep room for 4), and lets it in beside a
light higher band (at 0.1 requests a second, 0.2 expected, 1 covers 98%: 1.2 s of work against 2.8 s of
room).

So on a fleet of several engines, one may idle for the higher band's requests while the lower band waits; that
idle time is the price of the higher band's objective, and it lasts only while that band is active. A band is
active while it has waiters in this process's queue, or while its next request is likely: within ``LIKELY_GAPS``
(5) of its mean gap between requests after its last one (a Poisson stream is that quiet once in ~150 gaps), and
never longer than ``flow_control.priority_window_s`` (60 s). Its mean gap is the plain mean of its last
``GAPS_KEPT`` (16) gaps, trusted from ``MIN_GAPS`` (8) on; before that it is active the whole window. (It was an
average weighted to its last ~5 gaps, trusted from the first: two requests 0.15 s apart gave a 0.75 s horizon, the
next request a second later found ``batch``'s 28 s of work committed to both engines, and ``default`` was shed for
the rest of the stage.) A steady stream of ``default`` at one request a second keeps room between its arrivals;
~5 s after it stops, ``batch`` uses the engines as its own 30 s allows. The lower band waits at the gateway
instead, where it is placed on whichever engine frees first, or shed when its own objective can no longer be met
(``Band.wait_bound_s``).

Bounds: the room is for the longest of the higher band's requests of the last 10 s: one longer still may
miss S, and so may more arrivals than the quantile's (1 time in 10 at 0.9); a burst
of the higher band after a quiet spell longer than 5 of its mean gaps finds the lower band's work in the engines
(up to the higher band's objective of it per engine while that band was seen within the window: ``depth_hold``).
A request dispatched by the anti-starvation rule (``Ticket.aged``) is not held by it, so the documented aged share
still reaches the lower bands.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cognitora.decision import CandidateScore, Decision
from cognitora.flow.config import HoldReason
from cognitora.flow.saturation import Saturation, load_s

__all__ = ["BandActivity", "BandRate", "Ceiling", "depth_hold", "poisson_quantile", "priority_hold"]


OWN_TTFT_WEIGHT = 0.2
"""Weight of a band's newest request in its average own TTFT: ~the last 5 requests count."""
LIKELY_GAPS = 5.0
"""A band with a known mean gap between its requests stays active this many mean gaps after its last one (if
shorter than ``priority_window_s``): a Poisson stream goes that long without a request once in ~150 gaps."""
RATE_WINDOW_S = 10.0
"""A band's rate (the arrivals room is kept for) is its requests in the last this many seconds over the span they
cover (at least 1 s): a quiet spell before them, or another stream's rate long ago, does not count."""
GAPS_KEPT = 16
"""A band's mean gap is the plain mean of its last this many gaps."""
MIN_GAPS = 8
"""Below this many gaps a band's mean gap is not trusted: it stays active ``priority_window_s`` after its last
request. The mean of a few exponential gaps is often half the true one (of 2, one time in 4), and a horizon of 5
such gaps lapses between two ordinary requests: the lower band then filled the engines with its own objective's
worth of work (28 s of ``batch``) ahead of the higher band's next request. The mean of 8 is under half the true
mean about one time in 100, of 16 one in 1,000."""


@dataclass(frozen=True)
class Ceiling:
    """The objective a lower band's request must leave room for: the strictest active band above it."""

    band: str
    slo_s: float
    own_ttft_s: float = 0.0
    """The predicted TTFT of that band's requests on an unloaded engine, the most of its recent ones
    (``BandActivity.room_s``): the room its next one needs."""
    rate_per_s: float | None = field(default=None, compare=False)
    """Its recent request rate (``BandActivity.rate_per_s``); None: none lately (room for its next request only)."""


@dataclass(frozen=True)
class BandRate:
    """What ``BandActivity`` has learned of one band's arrivals (for metrics: ``cognitora_flow_band_*``)."""

    band: str
    rate_per_s: float | None
    """``BandActivity.rate_per_s``: the rate a lower band keeps room for; None when none arrived lately."""
    gaps: int
    """Gaps between its requests kept (at most ``GAPS_KEPT``); its mean gap is trusted from ``MIN_GAPS``."""
    mean_gap_s: float | None
    """``BandActivity.mean_gap_s``: None until ``MIN_GAPS`` gaps are in."""


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
        self._own: dict[str, float] = {}
        """Band -> the moving average of its requests' own TTFT (``own_ttft_s``)."""
        self._gaps: dict[str, deque[float]] = {}
        """Band -> its last ``GAPS_KEPT`` gaps between requests."""
        self._recent: dict[str, deque[tuple[float, float | None]]] = {}
        """Band -> when its requests of the last ``RATE_WINDOW_S`` arrived, and their own TTFT."""

    def saw(self, band: str, own_ttft_s: float | None = None) -> None:
        """A request of ``band`` arrived (placed at once or queued); ``own_ttft_s``: its predicted TTFT with the
        load taken away (None: unknown, not averaged)."""
        now = self._clock()
        before_at = self._seen.get(band)
        self._seen[band] = now
        if before_at is not None:
            self._gaps.setdefault(band, deque(maxlen=GAPS_KEPT)).append(now - before_at)
        recent = self._recent.setdefault(band, deque())
        recent.append((now, own_ttft_s))
        self._trim(recent, now)
        if own_ttft_s is not None:
            before = self._own.get(band)
            self._own[band] = own_ttft_s if before is None else before + OWN_TTFT_WEIGHT * (own_ttft_s - before)

    def mean_gap_s(self, band: str) -> float | None:
        """The mean of ``band``'s last gaps between requests, once it has ``MIN_GAPS`` of them; else None."""
        gaps = self._gaps.get(band)
        if gaps is None or len(gaps) < MIN_GAPS:
            return None
        return sum(gaps) / len(gaps)

    def rate_per_s(self, band: str) -> float | None:
        """``band``'s requests in the last ``RATE_WINDOW_S`` over the span they cover (at least 1 s); None when it
        sent none in that time."""
        recent = self._recent.get(band)
        if not recent:
            return None
        now = self._clock()
        self._trim(recent, now)
        if not recent:
            return None
        return len(recent) / max(1.0, now - recent[0][0])

    def rates(self) -> tuple[BandRate, ...]:
        """Every band's learned arrivals, highest band first (read for metrics; nothing here changes a decision)."""
        return tuple(
            BandRate(name, self.rate_per_s(name), len(self._gaps.get(name, ())), self.mean_gap_s(name))
            for name, _ in self._bands
        )

    def room_s(self, band: str) -> float:
        """The own TTFT a request of ``band`` needs room for: the most of its requests of the last
        ``RATE_WINDOW_S``, else the moving average of its last ones (0 when none is known). The most, not the
        average: after a stream of short prompts (another team's) the average said a 13,000-token prompt needed
        0.1 s, and ``batch`` took both engines ahead of it."""
        recent = self._recent.get(band)
        if recent:
            self._trim(recent, self._clock())
            known = [own for _, own in recent if own is not None]
            if known:
                return max(known)
        return self._own.get(band, 0.0)

    @staticmethod
    def _trim(recent: deque[tuple[float, float | None]], now: float) -> None:
        while recent and now - recent[0][0] > RATE_WINDOW_S:
            recent.popleft()

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
            active = waiting.get(name, 0) > 0 or self._likely(name, now)
            if active and slo < own and (best is None or slo < best.slo_s):
                best = Ceiling(name, slo, self.room_s(name), self.rate_per_s(name))
        return best

    def recent(self, band: str) -> Ceiling | None:
        """The strictest band above ``band`` seen within the window, active or quiet, when its objective is
        stricter than ``band``'s own (``depth_hold``); None otherwise."""
        now = self._clock()
        own = next((slo for name, slo in self._bands if name == band), None)
        best: Ceiling | None = None
        for name, slo in self._bands:
            if name == band or own is None:
                break
            seen = self._seen.get(name)
            if seen is not None and now - seen <= self._window_s and slo < own and (best is None or slo < best.slo_s):
                best = Ceiling(name, slo, self._own.get(name, 0.0))
        return best

    def _likely(self, band: str, now: float) -> bool:
        """``band``'s next request is likely soon: within ``LIKELY_GAPS`` of its mean gap (once it has one), and
        never longer than the window after its last request."""
        seen = self._seen.get(band)
        if seen is None:
            return False
        gap = self.mean_gap_s(band)
        horizon = self._window_s if gap is None else min(self._window_s, LIKELY_GAPS * gap)
        return now - seen <= horizon


def _idle(c: CandidateScore) -> bool:
    """No prefill queued or running on it, no seat or KV to wait for: it would idle without this request."""
    return c.queued_prefill_tokens <= 0 and c.slot_wait_s <= 0 and c.kv_pressure_s <= 0


def priority_hold(
    decision: Decision, ceiling: Ceiling, margin: float = 1.0, arrivals_quantile: float = 0.0
) -> Saturation | None:
    """Hold ``decision``'s request for the higher band of ``ceiling``: committing it to the engine placement chose
    would leave no eligible engine with room for that band's next request, or (``arrivals_quantile`` > 0, the
    band's rate known) too little room on the other engines for the band's requests that arrive while this one
    holds its engine, as many as that quantile of a Poisson count (see the module doc). ``margin``: the
    prediction margin (``cognitora.flow.margin``), by which every predicted time here is multiplied. None when it
    may go, or the decision is refused for anything but saturation."""
    if decision.rejection is not None and not decision.saturated:
        return None
    eligible = [c for c in decision.candidates if c.excluded is None]
    if not eligible:
        return None
    chosen = next((c for c in eligible if c.endpoint == decision.endpoint), None)
    if chosen is None:
        chosen = min(eligible, key=lambda c: c.predicted_ttft_s)
    own = ceiling.own_ttft_s * margin
    if _idle(chosen) and (len(eligible) == 1 or own >= ceiling.slo_s):
        return None  # no engine could keep room for it: the engine is not left idle
    after = [((c.predicted_ttft_s if c is chosen else load_s(c)) * margin + own, c.endpoint) for c in eligible]
    best, endpoint = min(after)
    if best > ceiling.slo_s:
        return Saturation(
            HoldReason.SLO,
            f"held for band {ceiling.band!r}: placed on {chosen.endpoint}, it would leave no engine where that "
            f"band's next request (~{own:.2f} s of its own) meets its {ceiling.slo_s:g} s objective (the best, "
            f"{endpoint}, {best:.2f} s)",
            label="priority",
        )
    if arrivals_quantile <= 0 or ceiling.rate_per_s is None or len(eligible) == 1:
        return None
    taken_s = chosen.predicted_ttft_s * margin
    expected = ceiling.rate_per_s * taken_s
    n = poisson_quantile(expected, arrivals_quantile)
    demand = n * own
    slack = ceiling.slo_s - own
    supply = sum(max(0.0, taken_s + slack - load_s(c) * margin) for c in eligible if c is not chosen)
    if supply >= demand:
        return None
    return Saturation(
        HoldReason.SLO,
        f"held for band {ceiling.band!r}: placed on {chosen.endpoint}, it takes that engine for {taken_s:.2f} s, "
        f"in which that band sends {expected:.1f} requests on average ({n} at the {arrivals_quantile:g} quantile); "
        f"they need {demand:.2f} s of the other engines within its {ceiling.slo_s:g} s objective and those have "
        f"{supply:.2f} s",
        label="priority",
    )


def poisson_quantile(mean: float, q: float) -> int:
    """The smallest n with P(N <= n) >= ``q`` for N Poisson of ``mean``: how many requests of a band arrive in a
    span, ``q`` of the time at most."""
    if mean <= 0:
        return 0
    term = math.exp(-mean)
    cdf, n = term, 0
    limit = mean + 20 * math.sqrt(mean) + 20  # far past any quantile below 0.999
    while cdf < q and n < limit:
        n += 1
        term *= mean / n
        cdf += term
    return n


def depth_hold(decision: Decision, recent: Ceiling, margin: float = 1.0) -> Saturation | None:
    """Hold ``decision``'s request while a stricter band above it is quiet but was seen within the window
    (``BandActivity.recent``): it is committed only where the chosen engine's load (x ``margin``) is within that
    band's objective. Committed deeper, it would gain nothing over waiting here (the gateway places it as an engine
    drains, and an engine with the objective's worth of queued work does not idle meanwhile), and it would be ahead
    of that band's next request: a burst after a quiet spell found up to the lower band's own objective (28 s of
    ``batch``) in every engine. None when it may go."""
    if decision.rejection is not None and not decision.saturated:
        return None
    eligible = [c for c in decision.candidates if c.excluded is None]
    chosen = next((c for c in eligible if c.endpoint == decision.endpoint), None)
    if chosen is None:
        return None
    queued = load_s(chosen) * margin
    if queued <= recent.slo_s:
        return None
    return Saturation(
        HoldReason.SLO,
        f"held for band {recent.band!r} (quiet now, seen lately): placed on {chosen.endpoint}, it would queue behind "
        f"{queued:.2f} s of work, more than that band's {recent.slo_s:g} s objective; it waits here until an engine "
        "drains",
        label="priority",
    )
