"""How long requests hold a seat on each endpoint, as this gateway clocks them: from first token to end.

The seat wait (``cognitora.placement.seat_wait``) reads when an engine's seats free up from the ages of the
requests holding them. The engine's own figure for a seat's tenure (``EndpointSnapshot.mean_service_s``) is on the
engine's clock, and ages are on the gateway's: the same seconds in production, not when the engine's clock runs at
another rate (the time-scaled simulator). A share of a tenure measured on the gateway's clock, ``age / tenure``,
is the same on both; before one is measured, the engine's ``clock_rate`` converts the ages. The variability of the
tenures says how much an age tells (``SeatProgress.variability``; a prior until measured).

Per endpoint: EWMA of the tenure and of its square, over attempts that ended well after a first token (an error
cuts a tenure short and says nothing of the next one's). ``MIN_SAMPLES`` before it is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from cognitora.placement.state import SeatProgress

__all__ = ["MIN_SAMPLES", "PRIOR_VARIABILITY", "SeatTenure"]

ALPHA = 0.05
"""EWMA weight of one tenure: about the last 20 requests (a few seconds of a busy engine)."""
MIN_SAMPLES = 8
PRIOR_VARIABILITY = 0.5
"""The squared coefficient of variation assumed before it is measured: between output lengths that are all alike
(0: a benchmark's fixed ``max_tokens``) and exponential ones (1; chat outputs come near it)."""


@dataclass
class _Tenure:
    mean_s: float
    mean_sq: float
    samples: int = 1


class SeatTenure:
    """Learned per endpoint from this gateway's finished attempts (``observe``)."""

    def __init__(self) -> None:
        self._by_endpoint: dict[str, _Tenure] = {}

    def observe(self, endpoint: str, seconds: float) -> None:
        """One attempt held a seat on ``endpoint`` for ``seconds`` (first token to end)."""
        if seconds <= 0:
            return
        t = self._by_endpoint.get(endpoint)
        if t is None:
            self._by_endpoint[endpoint] = _Tenure(seconds, seconds * seconds)
            return
        # The first samples weigh as a plain mean: an EWMA seeded by one sample would keep it for ~1/ALPHA more.
        a = max(ALPHA, 1.0 / (t.samples + 1))
        t.mean_s += a * (seconds - t.mean_s)
        t.mean_sq += a * (seconds * seconds - t.mean_sq)
        t.samples += 1

    def tenure_s(self, endpoint: str) -> float | None:
        """Mean seconds a request holds a seat there (None before ``MIN_SAMPLES``)."""
        t = self._by_endpoint.get(endpoint)
        return t.mean_s if t is not None and t.samples >= MIN_SAMPLES else None

    def variability(self, endpoint: str) -> float:
        """Squared coefficient of variation of the tenure, in [0, 1] (``PRIOR_VARIABILITY`` until learned)."""
        t = self._by_endpoint.get(endpoint)
        if t is None or t.samples < MIN_SAMPLES or t.mean_s <= 0:
            return PRIOR_VARIABILITY
        variance = max(0.0, t.mean_sq - t.mean_s * t.mean_s)
        return min(1.0, variance / (t.mean_s * t.mean_s))

    def progress(self, ages: dict[str, list[float]]) -> dict[str, SeatProgress]:
        """``ages``: seconds since first token of this gateway's seat holders, per endpoint; as placement reads
        them, with the tenure where it is learned."""
        return {
            endpoint: SeatProgress(tuple(held), self.tenure_s(endpoint), self.variability(endpoint))
            for endpoint, held in ages.items()
            if held
        }
