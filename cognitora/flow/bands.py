"""Priority bands: the classes of ``placement.priorities`` in dispatch order, each with its queue limits.

A band is one priority class. Bands are strict: a lower band is dispatched only when no higher band has a waiter,
except for the anti-starvation rule (``aged_after_s`` and ``aged_share``, ``cognitora.flow.fair_queue``); and a lower
band is not committed to engines loaded past an active higher band's objective (``cognitora.flow.priority``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cognitora.flow.config import FlowControlConfig

__all__ = ["Band", "plan_bands"]


@dataclass(frozen=True)
class Band:
    name: str
    """The priority class."""
    max_wait_s: float | None
    """The operator's fixed bound on a wait; None: it follows ``ttft_slo_s`` (``wait_bound_s``)."""
    aged_after_s: float | None
    """None: never ahead of a higher band."""
    ttft_slo_s: float | None = None
    """The class's TTFT objective (``placement.priorities``)."""

    def __post_init__(self) -> None:
        if self.max_wait_s is None and self.ttft_slo_s is None:
            raise ValueError(f"band {self.name!r}: give max_wait_s or ttft_slo_s")

    @property
    def longest_wait_s(self) -> float:
        """The most any of its requests waits: ``max_wait_s``, else the objective."""
        return self.wait_bound_s(None)

    def wait_bound_s(self, own_ttft_s: float | None) -> float:
        """How long a request of this band may wait in the queue. ``max_wait_s`` when the operator set one. Else
        while leaving could still meet the objective: ``ttft_slo_s`` less ``own_ttft_s``, the request's predicted
        TTFT on the best eligible engine with its load taken away (what it takes once it leaves; waiting longer
        makes it miss). A request that misses the objective even so (``own_ttft_s`` >= the objective: a prompt too
        long for it), or whose own TTFT is unknown (None), waits at most the objective itself: its objective cannot
        decide, and that bounds the delay a wait adds to it."""
        if self.max_wait_s is not None:
            return self.max_wait_s
        assert self.ttft_slo_s is not None
        if own_ttft_s is None or own_ttft_s >= self.ttft_slo_s:
            return self.ttft_slo_s
        return self.ttft_slo_s - max(0.0, own_ttft_s)


def plan_bands(config: FlowControlConfig, ttft_slo_s: Mapping[str, float]) -> tuple[Band, ...]:
    """The bands, highest first: ``config.bands``, else the classes of ``ttft_slo_s`` (class -> its TTFT
    objective, ``placement.priorities``) tightest objective first, ties by name. Raises ``ValueError`` with the
    config's own sentences when ``config`` names classes ``ttft_slo_s`` lacks (``FlowControlConfig.problems``)."""
    problems = config.problems(ttft_slo_s)
    if problems:
        raise ValueError("; ".join(problems))
    names = config.bands if config.bands is not None else sorted(ttft_slo_s, key=lambda n: (ttft_slo_s[n], n))
    out = []
    for name in names:
        limits = config.class_config(name)
        out.append(Band(name, limits.max_wait_s, limits.aged_after_s, ttft_slo_s[name]))
    return tuple(out)
