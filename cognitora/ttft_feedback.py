"""TTFT feedback: each endpoint's predicted time to first token, corrected online by what its requests achieved.

The cost model's coefficients are priors and learned rates; whatever it still misses on one engine (hardware unlike
its prior, traffic from elsewhere, a rate learned at another load) shows up as achieved TTFTs that are
systematically above or below the predictions. Each streamed attempt (its first token timed by the gateway,
``Attempt.first_token``) gives one sample of

    r = (achieved + floor) / (raw predicted + floor)

where *raw* is the model's prediction before any correction, so the factor never chases its own tail, and
``floor`` (``cost_model.feedback.floor_s``) keeps network and step overhead the model does not price from making
every short request look many times late. Per endpoint an EWMA of ``log r`` gives the factor ``exp(mean)``,
bounded to ``[1 / max_factor, max_factor]``, and it decays toward 1 (its log halves every ``half_life_s`` without
a sample): an endpoint no longer picked is not held to an old verdict. The corrected prediction is
``(raw + floor) x factor - floor`` for a factor above 1, and ``raw x factor`` below 1: subtracting the floor there
could bring a short positive prediction to 0, and a 0 s prediction "meets" any SLO (a sheddable class whose SLO no
engine can meet was then placed instead of shed).

By default (``feedback.relative``) the factor applied is the endpoint's divided by the median of its peers' (the
model's endpoints that have one): what is corrected is how much more an endpoint is off than the others. A bias
the whole fleet shares (the gateway's network time, which the model does not price; a simulator whose clock runs
slower than the gateway's) then moves no prediction. With ``relative: false`` the absolute factor is applied.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from cognitora.config import TtftFeedbackConfig

__all__ = ["TtftFeedback", "corrected_ttft_s", "raw_ttft_s"]


def corrected_ttft_s(raw_s: float, factor: float, floor_s: float) -> float:
    """The prediction after the feedback factor: ``(raw + floor) x factor - floor`` when the endpoint is late
    (factor >= 1), ``raw x factor`` when it is early, so a positive prediction stays positive."""
    if factor < 1.0:
        return max(0.0, raw_s * factor)
    return max(0.0, (raw_s + floor_s) * factor - floor_s)


def raw_ttft_s(corrected_s: float, factor: float, floor_s: float) -> float:
    """Inverse of ``corrected_ttft_s``."""
    if factor < 1.0:
        return max(0.0, corrected_s / factor)
    return max(0.0, (corrected_s + floor_s) / factor - floor_s)


@dataclass
class _EndpointBias:
    log_factor: float = 0.0
    samples: int = 0
    updated_at: float = 0.0


class TtftFeedback:
    """Per-endpoint bias factors of the predicted TTFT. Not thread-safe: the router's loop owns it."""

    def __init__(self, params: TtftFeedbackConfig) -> None:
        self.params = params
        self._bias: dict[str, _EndpointBias] = {}

    def observe(self, endpoint: str, raw_predicted_s: float, achieved_s: float, now: float) -> None:
        """One streamed attempt on ``endpoint``: the model predicted ``raw_predicted_s`` (before correction), the
        first token came after ``achieved_s``."""
        p = self.params
        if not p.enabled or not (math.isfinite(raw_predicted_s) and math.isfinite(achieved_s)):
            return
        if raw_predicted_s < 0 or achieved_s < 0:
            return
        bound = math.log(p.max_factor)
        if achieved_s + p.floor_s <= 0 or raw_predicted_s + p.floor_s <= 0:
            return  # floor 0 and an instant prediction or answer: no ratio to learn from
        sample = math.log((achieved_s + p.floor_s) / (raw_predicted_s + p.floor_s))
        sample = min(bound, max(-bound, sample))
        entry = self._bias.get(endpoint)
        if entry is None:
            entry = self._bias[endpoint] = _EndpointBias(updated_at=now)
        current = self._decayed(entry, now)
        entry.log_factor = min(bound, max(-bound, current + p.alpha * (sample - current)))
        entry.samples += 1
        entry.updated_at = now

    def factor(self, endpoint: str, now: float) -> float:
        """The factor to apply to ``endpoint``'s prediction now (1 until ``min_samples`` were seen)."""
        entry = self._bias.get(endpoint)
        if entry is None or not self.params.enabled or entry.samples < self.params.min_samples:
            return 1.0
        return math.exp(self._decayed(entry, now))

    def factors(self, endpoints: list[str], now: float) -> dict[str, float]:
        """The factors to apply, by endpoint, those different from 1 only (empty until samples arrive). With
        ``relative``, each is divided by the median of the endpoints' factors that were learned."""
        learned = {e: self.factor(e, now) for e in endpoints if self._applies(e)}
        if not learned:
            return {}
        if self.params.relative:
            if len(learned) < 2:
                return {}  # nothing to compare with
            median = statistics.median(learned.values())
            learned = {e: f / median for e, f in learned.items()}
        return {e: f for e, f in learned.items() if f != 1.0}

    def _applies(self, endpoint: str) -> bool:
        entry = self._bias.get(endpoint)
        return entry is not None and self.params.enabled and entry.samples >= self.params.min_samples

    def known(self) -> dict[str, float]:
        """Every endpoint's current factor as last updated (for metrics; undecayed)."""
        return {e: math.exp(b.log_factor) for e, b in self._bias.items() if b.samples >= self.params.min_samples}

    def _decayed(self, entry: _EndpointBias, now: float) -> float:
        age = max(0.0, now - entry.updated_at)
        return entry.log_factor * 0.5 ** (age / self.params.half_life_s)
