"""The attention term against a learned prefill rate (cognitora/placement/long_context.py, kvstate/rates.py).

A rate learned from an engine's counters holds the attention of the prompts it was learned on; placement adds the
attention of the request's prompt on top. Without dividing the first back out, the attention was counted twice: an
engine learned on 22k-token prompts was predicted 1.46x the prefill of a 22k-token prompt (the shipped prior)."""

from __future__ import annotations

from typing import Any

import pytest

from cognitora.config import config_from_dict
from cognitora.placement import FleetState, place
from cognitora.request import RouteRequest
from kvstate.engines import EngineLoad
from kvstate.prompt import PromptKeys
from kvstate.rates import RateEstimator
from kvstate.store import EndpointSnapshot

NOW = 1_000_000.0
BLOCK = 16
A, B = "127.0.0.1:8001", "127.0.0.1:8002"
LINEAR_RATE = 13_000.0
"""The engine's linear-layer prefill rate (tokens/s), free of attention (h100x2's in the simulator)."""
L = 24_000.0
"""The shipped ``cost_model.priors.attention_context_tokens``: the engine below follows the model's own shape."""


def prefill_s(prompt: float, cached: float = 0.0) -> float:
    """What the engine takes to prefill offsets ``cached`` .. ``prompt``: linear layers plus causal attention."""
    return (prompt - cached) / LINEAR_RATE + (prompt**2 - cached**2) / (2 * L) / LINEAR_RATE


def learned(prompt: int, cached: int = 0, windows: int = 6) -> RateEstimator:
    """An estimator fed an engine serving prompts of ``prompt`` tokens (``cached`` of them hits), one a window,
    through the TTFT and queue-time histograms (SGLang's and TRT-LLM's path; no finish-observed pairing)."""
    est = RateEstimator()
    for i in range(windows):
        est.observe(
            EngineLoad(
                prompt_tokens_total=float(i * prompt),
                prefix_cache_hits_total=float(i * cached),
                ttft_seconds_sum=i * prefill_s(prompt, cached),
                ttft_count=float(i),
                queue_seconds_sum=0.0,
            ),
            now=float(i),
        )
    return est


def snap_of(endpoint: str, est: RateEstimator) -> EndpointSnapshot:
    """What the scraper writes (kvstate/scrape.py) from what ``est`` learned."""
    return EndpointSnapshot(
        endpoint=endpoint,
        last_seen=NOW - 0.5,
        prefill_tokens_per_s=est.prefill_tokens_per_s,
        prefill_rate_from_short_prompts=est.prefill_rate_from_short_prompts,
        prefill_rate_prompt_tokens=est.prefill_rate_prompt_tokens,
    )


def fleet(*ports: int, **top: Any) -> Any:
    endpoints = [{"url": f"http://127.0.0.1:{p}"} for p in ports]
    return config_from_dict({"models": [{"name": "m", "block_size": BLOCK, "endpoints": endpoints}], **top})


def keys(tokens: int) -> PromptKeys:
    return PromptKeys(keys=list(range(1, tokens // BLOCK + 1)), prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK)


def ttft_on(endpoint: str, prompt: int, config: Any, *snaps: EndpointSnapshot) -> float:
    state = FleetState(NOW, snapshots={s.endpoint: s for s in snaps})
    decision = place(RouteRequest(model="m", prompt="x", request_id="r"), keys(prompt), config, state)
    return next(c.predicted_ttft_s for c in decision.candidates if c.endpoint == endpoint)


def test_the_estimator_says_what_context_its_rate_was_learned_at() -> None:
    est = learned(22_000)
    # The learned rate is the effective one: linear layers and the attention of 22k-token prompts together.
    assert est.prefill_tokens_per_s == pytest.approx(22_000 / prefill_s(22_000))
    assert est.prefill_rate_prompt_tokens == pytest.approx(22_000)
    # A prefill from a cached prefix: its tokens attend to (prompt + cached) / 2 on average.
    assert learned(30_000, cached=10_000).prefill_rate_prompt_tokens == pytest.approx(40_000)


@pytest.mark.parametrize("prompt", [22_000, 44_000, 4_000])
def test_a_rate_learned_on_long_prompts_is_not_charged_their_attention_twice(prompt: int) -> None:
    # Learned on 22k-token prompts; the same prompt length is predicted at what it takes (it was 1.46x), and a
    # longer or shorter one by the attention difference only.
    predicted = ttft_on(A, prompt, fleet(8001), snap_of(A, learned(22_000)))
    assert predicted == pytest.approx(prefill_s(prompt), rel=0.01)


def test_a_cached_prefix_is_priced_from_the_same_attention_free_rate() -> None:
    predicted_cold = ttft_on(A, 30_000, fleet(8001), snap_of(A, learned(30_000, cached=10_000)))
    assert predicted_cold == pytest.approx(prefill_s(30_000), rel=0.01)


def test_identical_engines_learned_on_different_contexts_are_priced_alike() -> None:
    # One engine served 4k-token prompts, its twin 30k: learned 1.5x apart (13k x 1/1.083 vs 1/1.625), beyond
    # the pooling band, so the twin looked slower for the prompts it happened to serve.
    short, long = learned(4_000), learned(30_000)
    assert short.prefill_tokens_per_s / long.prefill_tokens_per_s > 1.45
    config = fleet(8001, 8002)
    snaps = (snap_of(A, short), snap_of(B, long))
    assert ttft_on(A, 16_000, config, *snaps) == pytest.approx(ttft_on(B, 16_000, config, *snaps), rel=1e-6)
    assert ttft_on(A, 16_000, config, *snaps) == pytest.approx(prefill_s(16_000), rel=0.01)


def test_without_an_attention_prior_the_learned_rate_is_used_as_it_is() -> None:
    # No attention term is added, so none is divided out: the prefill is priced at the learned rate.
    est = learned(22_000)
    config = fleet(8001, cost_model={"priors": {"max_num_batched_tokens": 8192, "attention_context_tokens": None}})
    predicted = ttft_on(A, 22_000, config, snap_of(A, est))
    assert predicted == pytest.approx(22_000 / est.prefill_tokens_per_s, rel=0.01)
