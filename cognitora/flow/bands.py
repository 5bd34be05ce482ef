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
    max_wait_s: float
    aged_after_s: float | None
    """None: never ahead of a higher band."""


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
        out.append(Band(name, limits.max_wait_s, limits.aged_after_s))
    return tuple(out)
