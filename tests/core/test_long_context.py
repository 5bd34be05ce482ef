"""The cost model's long-context terms (cognitora/placement/long_context.py) and the TTFT feedback
(cognitora/ttft_feedback.py): as placement decides with them, and through the Router's lifecycle."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, TtftFeedbackConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.metrics.families import RouterFamilies
from cognitora.placement import FleetState, place
from cognitora.request import RouteRequest
from cognitora.ttft_feedback import TtftFeedback, corrected_ttft_s, raw_ttft_s
from kvstate.memory_store import MemoryStore
from kvstate.prompt import PromptKeys
from kvstate.store import EndpointSnapshot, InFlight, PrefixMatch

NOW = 1_000_000.0
BLOCK = 16
A, B, C, D = (f"127.0.0.1:{p}" for p in (8001, 8002, 8003, 8004))
RATE = 10_000.0
ATTENTION_CONTEXT = 24_000.0  # the shipped cost_model.priors.attention_context_tokens
KV_READ = 4.7e-8  # the shipped cost_model.priors.kv_read_s_per_token


def fleet(*endpoints: dict[str, Any], **top: Any) -> CognitoraConfig:
    data: dict[str, Any] = {"models": [{"name": "m", "block_size": BLOCK, "endpoints": list(endpoints)}], **top}
    return config_from_dict(data)


def ep(port: int, **extra: Any) -> dict[str, Any]:
    return {"url": f"http://127.0.0.1:{port}", **extra}


TWO = fleet(ep(8001), ep(8002))


def keys(tokens: int, first_key: int = 1) -> PromptKeys:
    return PromptKeys(
        keys=list(range(first_key, first_key + tokens // BLOCK)), prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK
    )


def snap(endpoint: str, **fields: Any) -> EndpointSnapshot:
    return EndpointSnapshot(endpoint=endpoint, last_seen=NOW - 0.5, **fields)


def req(max_tokens: int | None = None, request_id: str = "r") -> RouteRequest:
    return RouteRequest(model="m", prompt="x", max_tokens=max_tokens, request_id=request_id)


def score(decision: Any, endpoint: str) -> Any:
    return next(c for c in decision.candidates if c.endpoint == endpoint)


# -- attention ------------------------------------------------------------------------------------------------------


def test_prefill_grows_faster_than_linearly_in_context() -> None:
    short = place(req(), keys(2_000), TWO, FleetState(NOW))
    long = place(req(), keys(32_000), TWO, FleetState(NOW))
    # 16x the tokens costs more than 16x the time: the attention term, as documented.
    assert long.predicted_ttft_s > 16 * short.predicted_ttft_s
    expected = 32_000 / RATE + 32_000**2 / (2 * ATTENTION_CONTEXT) / RATE
    assert long.predicted_ttft_s == pytest.approx(expected, rel=1e-3)
    assert score(long, long.endpoint).attention_s == pytest.approx(32_000**2 / (2 * ATTENTION_CONTEXT) / RATE)


def test_a_cached_prefix_saves_its_attention_too() -> None:
    state = FleetState(NOW, matches={A: PrefixMatch(1000, 1000.0)})  # 16,000 tokens cached on A
    decision = place(req(), keys(32_000), TWO, state)
    hit, cold = score(decision, A), score(decision, B)
    assert hit.attention_s == pytest.approx((32_000**2 - 16_000**2) / (2 * ATTENTION_CONTEXT) / RATE)
    assert cold.attention_s > hit.attention_s and decision.endpoint == A


# -- decode interference by resident context, not by count ----------------------------------------------------------


LAX = {"priorities": {"default": {"ttft_slo_s": 60}}}  # no SLO in the way: the reason names the winning terms
CAPACITY = fleet(
    ep(8001, cost={"kv_capacity_tokens": 400_000}), ep(8002, cost={"kv_capacity_tokens": 400_000}), placement=LAX
)


def test_resident_context_not_running_count_prices_the_prefill_steps() -> None:
    # A runs 4 requests holding 300k context tokens; B runs 40 short ones holding 40k. The count term alone
    # preferred A; every prefill step on A reads 300k tokens of KV.
    state = FleetState(NOW, snapshots={A: snap(A, running=4, kv_usage=0.75), B: snap(B, running=40, kv_usage=0.10)})
    decision = place(req(), keys(16_000), CAPACITY, state)
    heavy, light = score(decision, A), score(decision, B)
    assert heavy.resident_tokens == pytest.approx(300_000) and light.resident_tokens == pytest.approx(40_000)
    assert heavy.interference_s == pytest.approx(2 * 300_000 * KV_READ)  # the prefill's 2 steps each read it
    assert light.interference_s == pytest.approx(2 * 40_000 * KV_READ)
    # A few ms in a 2 s prefill: ranked ahead, though within the tie band.
    assert decision.candidates[0].endpoint == B and light.predicted_ttft_s < heavy.predicted_ttft_s


def test_decode_interference_charges_the_requests_own_decode_and_the_running_ones() -> None:
    state = FleetState(NOW, snapshots={A: snap(A, running=8, kv_usage=0.75), B: snap(B, running=8, kv_usage=0.10)})
    decision = place(req(max_tokens=200), keys(16_000), CAPACITY, state)
    assert decision.endpoint == B, decision.explain()
    # Its 200 decode steps read the resident context; its 16k context slows each of the 8 running requests' steps.
    assert score(decision, A).decode_interference_s == pytest.approx(200 * KV_READ * (300_000 + 8 * 16_000))
    assert score(decision, B).decode_interference_s == pytest.approx(200 * KV_READ * (40_000 + 8 * 16_000))
    assert "decode interference" in decision.reason, decision.reason


def test_a_cache_miss_is_charged_for_stalling_the_running_requests() -> None:
    # B2B SaaS in small: A holds the request's 6,000-token system prompt and runs 30 requests; B holds nothing and
    # runs 26. The decode charge alone moves the request to B (4 fewer neighbours to slow, less context to read),
    # recomputing 6,000 tokens there; every one of B's 26 running requests then waits ~0.6 s for that prefix.
    state = FleetState(
        NOW,
        matches={A: PrefixMatch(375, 375.0)},
        snapshots={A: snap(A, running=30, kv_usage=0.60), B: snap(B, running=26, kv_usage=0.50)},
    )
    decision = place(req(max_tokens=1_000), keys(7_200), CAPACITY, state)
    assert decision.endpoint == A, decision.explain()
    hit, miss = score(decision, A), score(decision, B)
    # The 1,200-token question is prefilled wherever the request goes: only the recomputed prefix is charged.
    assert hit.prefill_stall_s == 0.0
    assert miss.prefill_stall_s == pytest.approx(26 * (6_000 / RATE + miss.attention_s - hit.attention_s))
    assert "prefill stall of running requests" in decision.reason, decision.reason

    without = fleet(
        ep(8001, cost={"kv_capacity_tokens": 400_000}),
        ep(8002, cost={"kv_capacity_tokens": 400_000}),
        placement=LAX,
        cost_model={"prefill_stall_weight": 0.0},
    )
    assert place(req(max_tokens=1_000), keys(7_200), without, state).endpoint == B


def test_the_routers_own_count_of_resident_context_is_a_floor() -> None:
    # No KV capacity known (no metric, no prior): the context of what the routers have in flight still counts.
    state = FleetState(NOW, inflight={A: InFlight(3, 0, 600)}, context_tokens={A: 90_000.0})
    decision = place(req(max_tokens=100), keys(8_000), TWO, state)
    assert decision.endpoint == B
    assert score(decision, A).resident_tokens == 90_000.0


def test_a_prompt_no_engine_holds_is_not_charged_for_stalling() -> None:
    # Long context with no reuse: the whole prompt is prefilled wherever it goes, so the prefill-stall charge is 0
    # everywhere and cannot draw it from the engine with the shortest queue to the one with the fewest decoders.
    state = FleetState(NOW, inflight={A: InFlight(2, 30_000, 0), B: InFlight(12, 0, 0)})
    decision = place(req(), keys(20_000), TWO, state)
    assert all(c.prefill_stall_s == 0.0 for c in decision.candidates)
    assert decision.endpoint == B, decision.explain()


def test_no_max_tokens_no_decode_charge() -> None:
    state = FleetState(NOW, context_tokens={A: 90_000.0})
    decision = place(req(), keys(8_000), TWO, state)
    assert all(c.decode_interference_s == 0.0 for c in decision.candidates)


# -- KV capacity ----------------------------------------------------------------------------------------------------


def test_a_placement_that_overflows_the_kv_cache_waits_for_room() -> None:
    # A holds the prompt's first 24k tokens but has room for only 10k more; its 6k-token suffix + 4k decode fit,
    # a 20k suffix would not. B is empty.
    config = fleet(
        ep(8001, cost={"kv_capacity_tokens": 100_000}),
        ep(8002, cost={"kv_capacity_tokens": 100_000}),
        placement=LAX,
        cost_model={"decode_interference_weight": 0.0},  # this case isolates the KV term
    )
    state = FleetState(
        NOW,
        matches={A: PrefixMatch(1500, 1500.0)},
        snapshots={A: snap(A, running=5, kv_usage=0.87, mean_service_s=60.0), B: snap(B)},
    )
    fits = place(req(max_tokens=4_000), keys(30_000), config, state)
    assert score(fits, A).kv_pressure_s == 0.0 and fits.endpoint == A, fits.explain()
    overflow = place(req(max_tokens=4_000), keys(44_000), config, state)
    pressed = score(overflow, A)
    room = 100_000 * 0.97 - 87_000
    expected = (44_000 - 24_000 + 4_000 - room) * 60.0 / 87_000  # resident leaves at 87k tokens per 60 s
    assert pressed.kv_pressure_s == pytest.approx(expected)
    assert overflow.endpoint == B, overflow.explain()
    assert "less wait for KV room" in overflow.reason, overflow.reason


def test_kv_capacity_is_learned_from_the_engines_metrics() -> None:
    state = FleetState(NOW, snapshots={A: snap(A, kv_usage=0.5, kv_capacity_tokens=200_000)})
    decision = place(req(), keys(4_000), TWO, state)
    assert score(decision, A).resident_tokens == pytest.approx(100_000)


# -- mixed hardware ------------------------------------------------------------------------------------------------


def test_per_endpoint_priors_price_hardware_unlike_the_fleet() -> None:
    # B is an M2 Ultra: 2,048-token steps and ~5x the KV-read time per resident token. Same load on both.
    mixed = fleet(
        ep(8001, prefill_tokens_per_s=10_000),
        ep(8002, prefill_tokens_per_s=10_000, cost={"max_num_batched_tokens": 2048, "kv_read_s_per_token": 2.2e-7}),
    )
    state = FleetState(NOW, context_tokens={A: 40_000.0, B: 40_000.0})
    decision = place(req(max_tokens=200), keys(16_000), mixed, state)
    assert decision.endpoint == A
    mac = score(decision, B)
    assert mac.interference_s == pytest.approx(math.ceil(16_000 / 2048) * 40_000 * 2.2e-7)


# -- the tie-break key ----------------------------------------------------------------------------------------------


def test_long_prompts_sharing_only_a_system_prompt_spread_over_the_fleet() -> None:
    four = fleet(ep(8001), ep(8002), ep(8003), ep(8004))
    picks = []
    for i in range(40):
        # One 256-token system prompt, then a 20k-token document of its own.
        doc = PromptKeys(
            keys=[*range(1, 17), *range(10_000 + i * 2000, 10_000 + i * 2000 + 1250)],
            prompt_tokens=20_256,
            exact=True,
            tokens_per_key=BLOCK,
        )
        picks.append(place(req(request_id=f"r{i}"), doc, four, FleetState(NOW)).endpoint)
    counts = {e: picks.count(e) for e in (A, B, C, D)}
    assert all(n >= 4 for n in counts.values()), counts


def test_over_the_slo_everywhere_ties_still_spread() -> None:
    # A 30k-token prompt is over the 2 s SLO on every idle engine: the fastest is taken, ties broken by the hash,
    # not by the endpoints' names.
    four = fleet(ep(8001), ep(8002), ep(8003), ep(8004))
    picks = [place(req(request_id=f"r{i}"), keys(30_000, 1 + i * 5000), four, FleetState(NOW)) for i in range(40)]
    assert all(d.saturated for d in picks)
    counts = {e: [d.endpoint for d in picks].count(e) for e in (A, B, C, D)}
    assert all(n >= 4 for n in counts.values()), counts


# -- feedback -------------------------------------------------------------------------------------------------------


def test_feedback_factor_is_learned_bounded_and_decays() -> None:
    fb = TtftFeedback(TtftFeedbackConfig(alpha=0.5, max_factor=2.0, floor_s=0.0, half_life_s=60.0, min_samples=3))
    fb.observe(A, 1.0, 1.5, NOW)
    fb.observe(A, 1.0, 1.5, NOW)
    assert fb.factor(A, NOW) == 1.0  # under min_samples: not applied yet
    fb.observe(A, 1.0, 1.5, NOW)
    assert 1.2 < fb.factor(A, NOW) < 1.5
    for _ in range(50):
        fb.observe(A, 1.0, 100.0, NOW)  # absurdly late: bounded
    assert fb.factor(A, NOW) == pytest.approx(2.0)
    assert fb.factor(A, NOW + 60.0) == pytest.approx(2.0**0.5)  # one half-life later, half the log
    assert fb.factor(B, NOW) == 1.0


def test_feedback_comes_back_to_one_from_either_side() -> None:
    """Late or early, a verdict is undone by on-time answers, and by time alone where none come (the endpoint no
    longer picked, or its traffic gone elsewhere)."""
    params = TtftFeedbackConfig(alpha=0.3, max_factor=2.0, floor_s=0.0, half_life_s=60.0, min_samples=3)
    for achieved in (1.8, 0.6):  # late, then early
        fb = TtftFeedback(params)
        for _ in range(20):
            fb.observe(A, 1.0, achieved, NOW)
        assert fb.factor(A, NOW) == pytest.approx(achieved, rel=0.02)
        assert fb.factor(A, NOW + 600.0) == pytest.approx(1.0, abs=0.01)  # ten half-lives without a sample
        for _ in range(20):
            fb.observe(A, 1.0, 1.0, NOW)  # on time again
        assert fb.factor(A, NOW) == pytest.approx(1.0, abs=0.01)


def test_feedback_compares_endpoints_on_predictions_of_the_same_size() -> None:
    # The model over-predicts long prompts (achieved 0.7x of an 8 s prediction) and is right on short ones. A, B
    # and C are identical. A drew mostly long prompts, so over all its samples it looks early (its absolute factor
    # is below its peers'); against its peers on the same sizes it is not, and no relative factor is applied. D is
    # 1.5x slower than the others at every size: it alone gets a factor.
    fb = TtftFeedback(TtftFeedbackConfig(alpha=0.3, max_factor=2.0, floor_s=0.0, half_life_s=600.0, min_samples=3))
    for i in range(20):
        t = NOW + i
        for e, slow in ((A, 1.0), (B, 1.0), (C, 1.0), (D, 1.5)):
            longs = 4 if e == A else 1
            for _ in range(longs):
                fb.observe(e, 8.0, 8.0 * 0.7 * slow, t)
            for _ in range(5 - longs):
                fb.observe(e, 0.5, 0.5 * slow, t)
    assert fb.factor(A, NOW + 20) < fb.factor(B, NOW + 20) / 1.15  # absolute: A looks early over all its samples
    relative = fb.factors([A, B, C, D], NOW + 20)
    assert all(relative.get(e, 1.0) == pytest.approx(1.0, abs=0.01) for e in (A, B, C)), relative
    assert relative[D] == pytest.approx(1.5, rel=0.05)


def test_feedback_ignores_what_cannot_be_a_measurement() -> None:
    fb = TtftFeedback(TtftFeedbackConfig(min_samples=1))
    for bad in (float("nan"), float("inf"), -1.0):
        fb.observe(A, 1.0, bad, NOW)
    assert fb.factor(A, NOW) == 1.0


def test_corrected_prediction_keeps_the_floor_out_of_the_ratio() -> None:
    assert corrected_ttft_s(0.0, 2.0, 0.05) == pytest.approx(0.05)
    assert corrected_ttft_s(1.0, 0.5, 0.05) == pytest.approx(0.5)


def test_an_early_endpoint_never_gets_a_zero_prediction() -> None:
    """A factor below 1 scales the prediction; subtracting the floor brought 5 ms to 0 s, and a 0 s prediction meets
    any SLO: a sheddable class whose SLO no engine can meet was placed instead of shed (seen in test_litellm_e2e)."""
    early = corrected_ttft_s(0.005, 0.5, 0.05)
    assert early == pytest.approx(0.0025)
    assert early > 1e-9
    for factor in (0.25, 0.5, 1.0, 2.0):
        assert raw_ttft_s(corrected_ttft_s(0.3, factor, 0.05), factor, 0.05) == pytest.approx(0.3)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


async def _teach(router: Router, clock: Clock, endpoint: str, lateness: float, n: int, base: int) -> None:
    """``n`` streamed attempts on ``endpoint`` whose first token came ``lateness`` x the model's own (uncorrected)
    prediction: an engine that is that much slower than the model thinks, whatever the feedback did."""
    for i in range(n):
        ids = list(range(base + i * 10_000, base + 8_000 + i * 10_000))  # a new prompt each time: nothing cached
        req = RouteRequest(model="m", prompt=ids, candidates=(endpoint,), request_id=f"{endpoint}-{base}-{i}")
        decision, attempt = await router.admit(req)
        assert attempt is not None and decision.endpoint == endpoint
        raw = decision.predicted_ttft_s / score(decision, endpoint).ttft_bias_factor
        attempt.finish(Outcome(OutcomeKind.COMPLETED, ttft_s=lateness * raw))
        await attempt.settled()
        clock.now += 1.0


def feedback_fleet(**feedback: Any) -> CognitoraConfig:
    return fleet(
        ep(8001),
        ep(8002),
        cost_model={"feedback": {"alpha": 0.5, "min_samples": 3, "floor_s": 0.0, **feedback}},
        placement={"recompute_weight": 0.0},
    )


async def test_an_endpoint_slower_than_its_peers_is_corrected_and_exported() -> None:
    """Through the Router's lifecycle: A's streamed attempts take twice what was predicted, B's what was predicted;
    A's factor is learned, its predictions rise against B's, traffic they tied on goes to B, and the factors are on
    the metrics page."""
    clock = Clock()
    router = Router(feedback_fleet(), MemoryStore(), clock=clock)
    await _teach(router, clock, A, 2.0, 6, 1)
    await _teach(router, clock, B, 1.0, 6, 1_000_000)
    learned = router.ttft_bias_factors()
    assert 1.7 < learned[A] <= 2.0 and learned[B] == pytest.approx(1.0, abs=0.01)
    again = await router.place(RouteRequest(model="m", prompt=list(range(100_001, 108_001)), request_id="next"))
    slow, fresh = score(again, A), score(again, B)
    # Relative to the peers' median on predictions of the same size (here the geometric mean of the two: the median
    # is taken over log factors), decayed a little since (half-life 120 s).
    median = (learned[A] * learned[B]) ** 0.5
    assert slow.ttft_bias_factor == pytest.approx(learned[A] / median, rel=0.05)
    assert fresh.ttft_bias_factor == pytest.approx(learned[B] / median, rel=0.05)
    assert slow.predicted_ttft_s / fresh.predicted_ttft_s == pytest.approx(
        slow.ttft_bias_factor / fresh.ttft_bias_factor, rel=1e-6
    )
    assert again.endpoint == B
    page = {m.name: m for m in RouterFamilies(router).collect()}
    exported = {s.labels["endpoint"]: s.value for s in page["cognitora_ttft_bias_factor"].samples}
    assert exported == pytest.approx(learned)
    await router.close()


async def test_a_bias_the_whole_fleet_shares_moves_no_prediction_unless_absolute() -> None:
    # Both engines answer 2x later than predicted (the gateway's clock runs at another rate than the engines').
    for relative in (True, False):
        clock = Clock()
        router = Router(feedback_fleet(relative=relative), MemoryStore(), clock=clock)
        await _teach(router, clock, A, 2.0, 4, 1)
        await _teach(router, clock, B, 2.0, 4, 1_000_000)
        again = await router.place(RouteRequest(model="m", prompt=list(range(100_001, 108_001)), request_id="n"))
        factors = {c.endpoint: c.ttft_bias_factor for c in again.candidates}
        if relative:  # equal but for the decay of the few seconds between A's samples and B's
            assert factors == pytest.approx({A: 1.0, B: 1.0}, abs=0.01)
        else:
            assert all(1.7 < f <= 2.0 for f in factors.values()), factors
        await router.close()


async def test_feedback_off_leaves_predictions_alone(tmp_path: Path) -> None:
    config = fleet(ep(8001), ep(8002), cost_model={"feedback": {"enabled": False, "min_samples": 1}})
    router = Router(config, MemoryStore())
    decision, attempt = await router.admit(RouteRequest(model="m", prompt=list(range(1, 4001)), candidates=(A,)))
    assert attempt is not None
    attempt.finish(Outcome(OutcomeKind.COMPLETED, ttft_s=10 * decision.predicted_ttft_s))
    await attempt.settled()
    assert router.ttft_bias_factors() == {}
    await router.close()


def test_bad_cost_settings_are_refused_with_the_key() -> None:
    from cognitora.config import ConfigError

    with pytest.raises(ConfigError, match=r"cost_model\.feedback\.max_factor"):
        fleet(ep(8001), cost_model={"feedback": {"max_factor": 0.5}})
    with pytest.raises(ConfigError, match="kv_read_s_per_tokn"):
        fleet(ep(8001, cost={"kv_read_s_per_tokn": 1e-7}))


def test_context_dispatched_since_the_snapshot_counts_on_top_of_it() -> None:
    # Both engines showed 50% of 400k at the last scrape; since then this router sent A two 16k-token requests
    # (prefills done). A is fuller now, though its snapshot cannot show it yet.
    state = FleetState(
        NOW,
        snapshots={e: snap(e, running=4, kv_usage=0.5) for e in (A, B)},
        context_tokens={A: 32_200.0},
        context_since_snapshot={A: 32_200.0},
    )
    decision = place(req(max_tokens=200), keys(16_000), CAPACITY, state)
    assert score(decision, A).resident_tokens == pytest.approx(232_200)
    assert score(decision, B).resident_tokens == pytest.approx(200_000)
    assert decision.endpoint == B, decision.explain()


def test_a_prefix_the_running_requests_share_is_held_once_not_per_request() -> None:
    # The 32 x 32 ladder's engine: 140 requests of one group in flight, each a 2,048-token shared system prompt,
    # 256 question tokens and 256 output tokens; the engine reads 33% of its 300k tokens of KV. Their steps read
    # 140 x 2,432 = 340k tokens of context (the interference), but they hold the system prompt's blocks once: the
    # next request of the group (its 256 new tokens and 256 output) fits, with no wait for KV room. Counted per
    # request, 340k > 97% of 300k, and flow control held every request of the 150-rps stage "for KV room".
    shared = fleet(ep(8001, cost={"kv_capacity_tokens": 300_000}), ep(8002, cost={"kv_capacity_tokens": 300_000}))
    in_flight = 140
    state = FleetState(
        NOW,
        matches={A: PrefixMatch(128, 128.0)},
        snapshots={A: snap(A, running=in_flight, kv_usage=0.33, mean_service_s=13.0), B: snap(B)},
        context_tokens={A: in_flight * 2_432.0},
        kv_tokens={A: in_flight * 384.0},
    )
    decision = place(req(max_tokens=256), keys(2_304), shared, state)
    a = score(decision, A)
    assert a.resident_tokens == pytest.approx(in_flight * 2_432.0)  # the steps still read every request's context
    assert a.kv_pressure_s == 0.0, decision.explain()


def test_kv_usage_is_priced_not_filtered_when_the_capacity_is_known() -> None:
    # Every engine of a KV-bound fleet reads 95-100%: as a filter, whichever read under 97% took every request.
    full = {
        A: snap(A, kv_usage=0.99, kv_capacity_tokens=300_000),
        B: snap(B, kv_usage=0.96, kv_capacity_tokens=300_000),
    }
    decision = place(req(max_tokens=200), keys(12_000), TWO, FleetState(NOW, snapshots=full))
    assert not any(c.excluded for c in decision.candidates)
    assert score(decision, A).kv_pressure_s > score(decision, B).kv_pressure_s > 0
    # Without a known capacity the filter still applies, as before.
    blind = {A: snap(A, kv_usage=0.99), B: snap(B, kv_usage=0.5)}
    decision = place(req(), keys(12_000), TWO, FleetState(NOW, snapshots=blind))
    assert decision.endpoint == B and "KV cache 99% full" in (score(decision, A).excluded or "")
