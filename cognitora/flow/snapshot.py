"""What the gateway queue shows: a typed snapshot for metrics (depth and oldest wait per band and flow, dispatches
by reason, timeouts) and the sentence ``cognitora explain`` prints for a request that would wait.

Counters only grow (Prometheus counters); depths and waits are read when the snapshot is taken. Flow names are
trusted identities (``team:<name>``, ``key:<id>``): the exporter bounds their cardinality as it does for budgets'
team labels.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from cognitora.flow.config import HoldReason
from cognitora.flow.outcome import Departure, Left, WakeReason
from cognitora.flow.saturation import Saturation

__all__ = ["BandView", "FlowCounters", "FlowView", "QueueSnapshot", "wait_explanation"]


@dataclass
class FlowCounters:
    """Running totals by band (mutable; the controller's own)."""

    queued: Counter[str] = field(default_factory=Counter)
    left: Counter[tuple[str, Left]] = field(default_factory=Counter)
    dispatched: Counter[tuple[str, WakeReason]] = field(default_factory=Counter)
    aged: Counter[str] = field(default_factory=Counter)
    """Dispatches ahead of a higher band (anti-starvation)."""
    held_tries: int = 0
    """Placements of a queued request that found the fleet still saturated."""
    placer_errors: int = 0
    waited_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Sum of the waits of requests that left the queue, by band (with ``left``: the mean wait)."""

    def record(self, d: Departure) -> None:
        self.left[d.band, d.how] += 1
        self.waited_s[d.band] += d.waited_s
        if d.how is Left.DISPATCHED and d.wake is not None:
            self.dispatched[d.band, d.wake] += 1
            if d.aged:
                self.aged[d.band] += 1


@dataclass(frozen=True)
class FlowView:
    flow: str
    waiting: int
    oldest_wait_s: float


@dataclass(frozen=True)
class BandView:
    band: str
    waiting: int
    oldest_wait_s: float
    """0 when nobody waits."""
    max_wait_s: float
    flows: tuple[FlowView, ...]
    queued: int
    """Requests that entered this band's queue, ever."""
    left: dict[Left, int]
    dispatched: dict[WakeReason, int]
    aged: int
    waited_s_sum: float


@dataclass(frozen=True)
class QueueSnapshot:
    bands: tuple[BandView, ...]
    drain_per_s: float
    """Dispatches per second lately (``cognitora.flow.drain_rate``)."""
    held_tries: int
    placer_errors: int

    @property
    def waiting(self) -> int:
        return sum(b.waiting for b in self.bands)


_MARGIN_HOLDS = (HoldReason.SLO.value, "priority")
"""The holds decided with the prediction margin (team isolation's ``slo`` hold is not)."""


def wait_explanation(
    band: str,
    ahead_in_band: int,
    ahead_above: int,
    saturation: Saturation | None,
    max_wait_s: float,
    *,
    margin: float | None = None,
    margin_samples: int = 0,
    margin_replicas: int = 0,
) -> str:
    """``would wait: 3 ahead in band 'batch' (1 in higher bands); <why>; at most 30 s, then 429 with
    Retry-After (or a cloud target, where the burst policy allows)``. ``margin``: the prediction margin the
    decision used and the samples it is from, named after the reason of a hold it decides (``slo``, ``priority``).
    ``margin_replicas``: 0 when it is this process's own (``cognitora explain``'s, which times no request, is 1);
    else it is the largest of that many gateway replicas' shared margins (``cognitora.flow.margin.most_cautious``)."""
    above = f" ({ahead_above} in higher bands)" if ahead_above else ""
    why = saturation.detail if saturation is not None else "requests of its band or higher are already waiting"
    if margin is not None and saturation is not None and saturation.kind in _MARGIN_HOLDS:
        if margin_replicas:
            whose = "replica" if margin_replicas == 1 else "replicas"
            why += (
                f" (predicted times x prediction margin {margin:.2f}, learned by {margin_replicas} gateway {whose}, "
                f"the largest, from {margin_samples} requests: the most cautious gateway decides; each holds with "
                "its own, cognitora_flow_prediction_margin on its /metrics)"
            )
        else:
            why += (
                f" (predicted times x prediction margin {margin:.2f}, learned from {margin_samples} requests in "
                "this process; a gateway's own is cognitora_flow_prediction_margin on its /metrics)"
            )
    return (
        f"would wait: {ahead_in_band} ahead in band {band!r}{above}; {why}; at most {max_wait_s:.3g} s, then 429 "
        "with Retry-After (or a cloud target, where the burst policy allows)"
    )
