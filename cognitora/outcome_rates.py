"""``OutcomeRates``: what the router learns from its own finished attempts on engines that report nothing.

MLX-LM's ``mlx_lm.server`` and a plain OpenAI-compatible server (``engine: openai``) have no ``/metrics`` and no
KV events (engines.md 4.4). All a router sees of them is its own traffic: when it dispatched a request, when the
first token came, when the response ended, and the response's ``usage`` (``prompt_tokens_details.cached_tokens``).
From each finished attempt this learns, per endpoint:

- the prefill rate, in the placement model's own terms (docs/placement.md): the router predicted
  ``ttft = (queued + uncached) / rate``, so one attempt measures ``rate = (queued + uncached) / achieved_ttft``,
  where ``queued`` is the prefill the router counted ahead of it at dispatch and ``uncached`` its prompt minus the
  response's ``cached_tokens``;
- the per-sequence decode speed: ``(completion_tokens - 1) / (e2e - ttft)``;
- how much of the predicted prefix reuse the engine delivers: ``achieved cached_tokens / predicted cached`` over
  attempts that predicted some. The routing history (``placement.routing_history_ttl_s``) is such an engine's only
  prefix index, and MLX-LM's prompt cache is a small LRU (10 sequences by default): history outlives it. Placement
  scales the history's match on the endpoint by this ratio (``discount``), never below ``MIN_REUSE_RATIO``, and a
  sample compares what was reused with the prediction *before* that scaling (the scaled one divided back by the
  ratio in force), as the TTFT feedback compares with its raw prediction. Otherwise the ratio only taught itself:
  an engine whose first follow-up found its cache evicted was learned at 0, every later match on it was priced at
  0 cached tokens, no attempt predicted reuse there, and the 0 stayed for good; an engine reusing half its history
  settled at 0.71 (each sample was the reuse over the ratio's own guess).

A rate is the ``RATE_QUANTILE`` quantile of the last ``WINDOW`` samples, not their mean: a TTFT timed at the
gateway also holds the gateway's own delays (its event loop, connection set-up), which only ever make a sample
slower than the engine. On a loaded 2-core test machine LiteLLM's timed TTFTs to an MLX engine read ~10x its
prefill time; the faster samples are the truer ones. Reuse is an EWMA.

``overlay`` puts the learned rates into the snapshots placement reads (where the scraper learned none: it cannot,
for these engines), so the cost model needs no special case. Attempts too small to measure (fewer than
``min_prefill_tokens`` of work, or no timing) teach nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from kvstate.store import EndpointSnapshot, PrefixMatch

__all__ = ["MIN_REUSE_RATIO", "WINDOW", "Learned", "OutcomeRates"]

ALPHA = 0.3
"""EWMA weight of a new reuse sample (the scraper's ``RateEstimator`` uses the same)."""
WINDOW = 16
"""Rate samples kept per endpoint."""
RATE_QUANTILE = 0.8
"""Which of the window's samples is the rate (0.8: faster than 80% of them)."""
MIN_PREFILL_TOKENS = 32
"""An attempt whose prefill work (queued + uncached) is smaller than this is mostly fixed overhead: not a sample."""
MIN_DECODE_S = 1e-3
MIN_REUSE_RATIO = 0.05
"""The least a history match on an engine is scaled by: it keeps predicting some reuse, so the ratio keeps
being measured (an engine learned at 0 would never be again)."""


@dataclass
class Learned:
    """One endpoint's estimates; 0 / None: not learned yet."""

    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    reuse_ratio: float | None = None
    """Achieved over predicted cached tokens (0..1), smoothed."""
    samples: int = 0
    prefill_samples: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_samples: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))


def _applied(reuse_ratio: float | None) -> float:
    """What ``OutcomeRates.discount`` scales a match by for a learned ``reuse_ratio`` (None: not learned, 1)."""
    return 1.0 if reuse_ratio is None else max(MIN_REUSE_RATIO, reuse_ratio)


def _quantile(samples: deque[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(RATE_QUANTILE * len(ordered)))]


class OutcomeRates:
    """Learned estimates for the endpoints in ``endpoints`` (those whose engine kind has no metrics)."""

    def __init__(self, endpoints: Iterable[str]) -> None:
        self._learned: dict[str, Learned] = {e: Learned() for e in endpoints}

    def __contains__(self, endpoint: object) -> bool:
        return endpoint in self._learned

    def learned(self, endpoint: str) -> Learned | None:
        return self._learned.get(endpoint)

    def observe(
        self,
        endpoint: str,
        *,
        queued_prefill_tokens: float,
        prompt_tokens: int,
        predicted_cached_tokens: float,
        cached_tokens: int | None,
        ttft_s: float | None,
        completion_tokens: int | None,
        e2e_s: float | None,
    ) -> None:
        """One finished attempt's timing and usage (only completed attempts are worth learning from)."""
        row = self._learned.get(endpoint)
        if row is None:
            return
        row.samples += 1
        cached = cached_tokens if cached_tokens is not None else round(predicted_cached_tokens)
        work = queued_prefill_tokens + max(0, prompt_tokens - cached)
        decoded = completion_tokens is not None and completion_tokens > 1
        decode_s = None if ttft_s is None or e2e_s is None else e2e_s - ttft_s
        # A "first token" at the very end of a many-token response is the gateway's end time (a non-streamed
        # response): it times prefill and decode together, so it measures neither.
        timed_apart = not decoded or (decode_s is not None and decode_s > MIN_DECODE_S)
        if ttft_s is not None and ttft_s > 0 and work >= MIN_PREFILL_TOKENS and timed_apart:
            row.prefill_samples.append(work / ttft_s)
            row.prefill_tokens_per_s = _quantile(row.prefill_samples)
        if decoded and decode_s is not None and decode_s > MIN_DECODE_S and completion_tokens is not None:
            row.decode_samples.append((completion_tokens - 1) / decode_s)
            row.decode_tokens_per_s = _quantile(row.decode_samples)
        # The prediction was the history's match scaled by the ratio (a moment ago: close enough); undone, capped
        # at the prompt as placement caps it (a capped scaled prediction means a capped raw one).
        history = min(float(prompt_tokens), predicted_cached_tokens / _applied(row.reuse_ratio))
        if cached_tokens is not None and predicted_cached_tokens > 0 and history >= 1:
            ratio = min(1.0, cached_tokens / history)
            row.reuse_ratio = ratio if row.reuse_ratio is None else row.reuse_ratio + ALPHA * (ratio - row.reuse_ratio)

    def overlay(
        self, snapshots: Mapping[str, EndpointSnapshot], endpoints: Iterable[str], now: float
    ) -> dict[str, EndpointSnapshot]:
        """``snapshots`` with the learned rates filled in where the scraper has none. An endpoint the scraper never
        wrote (no collector) gets a snapshot carrying only the rates, seen ``now``, healthy: absence of a scraper
        is not a failure."""
        out = dict(snapshots)
        for endpoint in endpoints:
            row = self._learned.get(endpoint)
            if row is None or (row.prefill_tokens_per_s <= 0 and row.decode_tokens_per_s <= 0):
                continue
            snap = out.get(endpoint)
            if snap is None:
                snap = EndpointSnapshot(endpoint=endpoint, healthy=True, last_seen=now)
            out[endpoint] = replace(
                snap,
                prefill_tokens_per_s=snap.prefill_tokens_per_s or row.prefill_tokens_per_s,
                decode_tokens_per_s=snap.decode_tokens_per_s or row.decode_tokens_per_s,
            )
        return out

    def discount(self, matches: Mapping[str, PrefixMatch]) -> Mapping[str, PrefixMatch]:
        """The prefix matches with each learned endpoint's weight scaled by the reuse it has delivered."""
        if not any(e in self._learned and self._learned[e].reuse_ratio is not None for e in matches):
            return matches
        out = dict(matches)
        for endpoint, match in matches.items():
            row = self._learned.get(endpoint)
            if row is not None and row.reuse_ratio is not None:
                out[endpoint] = replace(match, weighted_blocks=match.weighted_blocks * _applied(row.reuse_ratio))
        return out
