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

By default (``feedback.relative``) what is corrected is how much more an endpoint is off than its peers **on
predictions of the same size**. Samples are also kept per endpoint and *size*, the raw prediction's power of two
(``size_class``); in each size that two or more endpoints have samples of, an endpoint's log factor there is
compared with the median of theirs; the endpoint's relative log factor is the mean of those differences, weighted
by its samples in each size. A bias the whole fleet shares (the gateway's network time, which the model does not
price; a simulator whose clock runs slower than the gateway's) then moves no prediction, and neither does an error
the model makes on one kind of request: when it over-predicts long prompts more than short ones, an engine that
drew long prompts looked early beside its peers, was then offered more of them, and looked earlier still (on the
Mooncake trace identical engines settled at 0.8 and 1.25 of the median, and drew 1.1M against 0.3M prompt tokens).
With ``relative: false`` the endpoint's absolute factor, over all its samples, is applied.
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


SIZE_WEIGHT_CAP = 10
"""An endpoint's samples in one size count at most this many times in its relative factor: a size it was offered
often does not outweigh the others it was measured in."""
RELATIVE_CACHE_S = 1.0
"""Relative factors are recomputed at most this often while no sample arrives (they change only by decay then)."""


def size_class(raw_predicted_s: float, floor_s: float) -> int:
    """The power of two of the raw prediction (floor included): predictions within a factor 2 compare."""
    return math.floor(math.log2(max(raw_predicted_s + floor_s, 1e-6)))


@dataclass
class _EndpointBias:
    log_factor: float = 0.0
    samples: int = 0
    updated_at: float = 0.0


@dataclass(frozen=True)
class _RelativeFactors:
    version: int
    """``TtftFeedback._version`` (samples taken) when they were computed."""
    computed_at: float
    endpoints: tuple[str, ...]
    factors: dict[str, float]


class TtftFeedback:
    """Per-endpoint bias factors of the predicted TTFT. Not thread-safe: the router's loop owns it."""

    def __init__(self, params: TtftFeedbackConfig) -> None:
        self.params = params
        self._bias: dict[str, _EndpointBias] = {}
        self._by_size: dict[str, dict[int, _EndpointBias]] = {}
        self._version = 0
        self._relative_cache: _RelativeFactors | None = None

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
        self._learn(entry, sample, now)
        sizes = self._by_size.setdefault(endpoint, {})
        size = size_class(raw_predicted_s, p.floor_s)
        sized = sizes.get(size)
        if sized is None:
            sized = sizes[size] = _EndpointBias(updated_at=now)
        self._learn(sized, sample, now)
        self._version += 1

    def _learn(self, entry: _EndpointBias, sample: float, now: float) -> None:
        bound = math.log(self.params.max_factor)
        current = self._decayed(entry, now)
        entry.log_factor = min(bound, max(-bound, current + self.params.alpha * (sample - current)))
        entry.samples += 1
        entry.updated_at = now

    def factor(self, endpoint: str, now: float) -> float:
        """The endpoint's absolute factor now, over all its samples (1 until ``min_samples`` were seen)."""
        entry = self._bias.get(endpoint)
        if entry is None or not self.params.enabled or entry.samples < self.params.min_samples:
            return 1.0
        return math.exp(self._decayed(entry, now))

    def factors(self, endpoints: list[str], now: float) -> dict[str, float]:
        """The factors to apply, by endpoint, those different from 1 only (empty until samples arrive): absolute,
        or with ``relative`` each endpoint's against its peers' on predictions of the same size."""
        learned = [e for e in endpoints if self._applies(e)]
        if not learned:
            return {}
        if not self.params.relative:
            absolute = {e: self.factor(e, now) for e in learned}
            return {e: f for e, f in absolute.items() if f != 1.0}
        if len(learned) < 2:
            return {}  # nothing to compare with
        endpoints_key = tuple(learned)
        cached = self._relative_cache
        if (
            cached is not None
            and (cached.version, cached.endpoints) == (self._version, endpoints_key)
            and now - cached.computed_at < RELATIVE_CACHE_S
        ):
            return cached.factors
        result = self._relative(learned, now)
        self._relative_cache = _RelativeFactors(self._version, now, endpoints_key, result)
        return result

    def _relative(self, learned: list[str], now: float) -> dict[str, float]:
        by_size: dict[int, dict[str, _EndpointBias]] = {}
        for e in learned:
            for size, entry in self._by_size.get(e, {}).items():
                by_size.setdefault(size, {})[e] = entry
        offsets: dict[str, float] = {}
        weights: dict[str, float] = {}
        for entries in by_size.values():
            if len(entries) < 2:
                continue  # one endpoint alone in a size has nothing to be compared with there
            logs = {e: self._decayed(entry, now) for e, entry in entries.items()}
            median = statistics.median(logs.values())
            for e, log_factor in logs.items():
                w = min(entries[e].samples, SIZE_WEIGHT_CAP)
                offsets[e] = offsets.get(e, 0.0) + w * (log_factor - median)
                weights[e] = weights.get(e, 0.0) + w
        bound = math.log(self.params.max_factor)
        result = {}
        for e, total in offsets.items():
            log_factor = min(bound, max(-bound, total / weights[e]))
            if log_factor != 0.0:
                result[e] = math.exp(log_factor)
        return result

    def _applies(self, endpoint: str) -> bool:
        entry = self._bias.get(endpoint)
        return entry is not None and self.params.enabled and entry.samples >= self.params.min_samples

    def known(self) -> dict[str, float]:
        """Every endpoint's current absolute factor as last updated (for metrics; undecayed)."""
        return {e: math.exp(b.log_factor) for e, b in self._bias.items() if b.samples >= self.params.min_samples}

    def _decayed(self, entry: _EndpointBias, now: float) -> float:
        age = max(0.0, now - entry.updated_at)
        return entry.log_factor * math.pow(0.5, age / self.params.half_life_s)
