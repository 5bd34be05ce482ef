"""How fast the queue drains, for the Retry-After of a request that timed out or found the queue full.

An exponentially decaying count of dispatches: ``rate = sum(exp(-(now - t_i) / tau)) / tau`` over past dispatches
``t_i``, updated in O(1) per dispatch. ``tau`` (10 s) is long enough to span the gaps of a saturated fleet, short
enough to follow a fleet that slows down.
"""

from __future__ import annotations

import math

__all__ = ["DrainRate", "retry_after_s"]

TAU_S = 10.0
MAX_RETRY_AFTER_S = 60
"""The same ceiling as placement's shed (``cognitora.placement.picker``)."""


class DrainRate:
    __slots__ = ("_at", "_level")

    def __init__(self) -> None:
        self._level = 0.0
        self._at = 0.0

    def tick(self, now: float) -> None:
        self._level = self._level * math.exp(-(now - self._at) / TAU_S) + 1.0 if self._at else 1.0
        self._at = now

    def per_s(self, now: float) -> float:
        """Dispatches per second lately (0 before the first)."""
        if not self._at:
            return 0.0
        return self._level * math.exp(-max(0.0, now - self._at) / TAU_S) / TAU_S


def retry_after_s(ahead: int, per_s: float, fallback_s: float) -> int:
    """Whole seconds until ``ahead`` waiters have drained at ``per_s`` (``fallback_s`` when nothing drains),
    between 1 and ``MAX_RETRY_AFTER_S``."""
    seconds = (ahead + 1) / per_s if per_s > 0 else fallback_s
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds)))
