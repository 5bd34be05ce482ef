"""Probes instead of shedding (``cognitora.placement.shed_probe``, docs/placement.md "Probes instead of shedding"): a
sheddable class that misses its objective on an idle engine by learned figures alone is placed there as a probe, and
still shed where the request itself cannot meet it or the engine is busy."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.decision import Decision
from cognitora.placement import FleetState, place
from cognitora.request import RouteRequest
from cognitora.telemetry import DecisionOutcome, decision_outcome
from kvstate.engines import EngineLoad
from kvstate.memory_store import MemoryStore
from kvstate.prompt import PromptKeys
from kvstate.rates import RateEstimator
from kvstate.store import EndpointSnapshot, InFlight, PrefixMatch
from tests.support.engine_loads import short_prompts_finished

NOW = 1_000_000.0
BLOCK = 16
A, B = "127.0.0.1:8001", "127.0.0.1:8002"


def fleet(*endpoints: dict[str, Any], slo_s: float = 1.0, **placement: Any) -> CognitoraConfig:
    """A ``batch`` class that is sheddable with a ``slo_s`` objective."""
    priorities = {"default": {"ttft_slo_s": 2.0}, "batch": {"ttft_slo_s": slo_s, "sheddable": True}}
    return config_from_dict(
        {
            "models": [{"name": "m", "block_size": BLOCK, "endpoints": list(endpoints)}],
            "placement": {"recompute_weight": 0.0, "priorities": priorities, **placement},
        }
    )


def ep(port: int, **extra: Any) -> dict[str, Any]:
    return {"url": f"http://127.0.0.1:{port}", **extra}


def prompt(tokens: int) -> PromptKeys:
    return PromptKeys(keys=list(range(1, 1 + tokens // BLOCK)), prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK)


def snap(endpoint: str, **fields: Any) -> EndpointSnapshot:
    return EndpointSnapshot(endpoint=endpoint, last_seen=NOW - 0.5, **fields)


def batch(tokens: int, config: CognitoraConfig, state: FleetState) -> Decision:
    return place(RouteRequest(model="m", prompt="x", priority="batch"), prompt(tokens), config, state)


TWO = fleet(ep(8001), ep(8002))
# Both engines idle, each with a short-prompt floor learned under load (the simulated mac: 1.96 s for 18 tokens).
FLOORED = FleetState(
    NOW,
    snapshots={A: snap(A, short_prompt_prefill_s=1.96), B: snap(B, short_prompt_prefill_s=2.5)},
)


def test_an_idle_engine_a_learned_floor_puts_over_the_objective_is_probed_not_shed() -> None:
    decision = batch(18, TWO, FLOORED)
    assert decision.rejection is None and decision.endpoint == A, decision.explain()
    assert decision.shed_probe and decision.saturated
    assert decision.reason.startswith(f"probe: {A} is idle"), decision.reason
    assert "short-prompt floor 1960 ms" in decision.reason and "1.8 ms" in decision.reason
    assert "why: probe:" in decision.explain()
    assert decision_outcome(decision) is DecisionOutcome.PROBE


def test_a_learned_ttft_feedback_that_puts_an_idle_engine_over_is_probed() -> None:
    # 4,096 tokens: ~0.42 s at the prior rate, within 0.6 s; the feedback's x2 puts the prediction over it.
    decision = batch(4096, fleet(ep(8001), slo_s=0.6), FleetState(NOW, snapshots={A: snap(A)}, ttft_bias={A: 2.0}))
    assert decision.endpoint == A and decision.shed_probe, decision.explain()
    assert "TTFT feedback x2.00" in decision.reason


def test_a_one_nanosecond_objective_is_still_shed() -> None:
    # Nothing fits it, at any rate: the deterministic 429 the gateways' tests rely on.
    for state in (FLOORED, FleetState(NOW, snapshots={A: snap(A), B: snap(B)})):
        decision = batch(18, fleet(ep(8001), ep(8002), slo_s=1e-9), state)
        assert decision.rejection is not None and decision.rejection.status == 429, decision.explain()
        assert not decision.shed_probe


def test_a_fully_cached_prompt_still_costs_its_last_token_so_a_tinier_objective_is_shed() -> None:
    # 32 tokens, both blocks cached on A: its prefill is the last token (0.1 ms at the 10k prior), never 0, so a
    # 50 us objective is shed and a 1 ms one is probed. (Counted as 0, any objective took a probe: the gateways'
    # reload tests, with a 0.1 ms objective, saw a 200 when their short prompt was cached.)
    state = replace(FLOORED, matches={A: PrefixMatch(2, 2.0), B: PrefixMatch(2, 2.0)})
    shed = batch(32, fleet(ep(8001), ep(8002), slo_s=5e-5), state)
    assert shed.rejection is not None and shed.rejection.status == 429 and not shed.shed_probe, shed.explain()
    probed = batch(32, fleet(ep(8001), ep(8002), slo_s=1e-3), state)
    assert probed.shed_probe and "0.1 ms" in probed.reason, probed.explain()


def test_a_prompt_too_long_for_its_objective_at_the_prior_rate_is_still_shed() -> None:
    # Learned fast (50k tokens/s) but a 5 s floor: predicted 5 s. 30,000 tokens at the 10k prior take 3 s, over 2 s:
    # the request itself is too long, whatever was learned. An engine whose prior is 20k tokens/s fits it (1.5 s).
    state = FleetState(NOW, snapshots={A: snap(A, prefill_tokens_per_s=50_000.0, short_prompt_prefill_s=5.0)})
    shed = batch(30_000, fleet(ep(8001), slo_s=2.0), state)
    assert shed.rejection is not None and shed.rejection.status == 429, shed.explain()
    fast_prior = batch(30_000, fleet(ep(8001, prefill_tokens_per_s=20_000.0), slo_s=2.0), state)
    assert fast_prior.endpoint == A and fast_prior.shed_probe, fast_prior.explain()


@pytest.mark.parametrize(
    "busy",
    [
        FleetState(NOW, snapshots={A: snap(A, short_prompt_prefill_s=1.96, running=1)}),
        FleetState(NOW, snapshots={A: snap(A, short_prompt_prefill_s=1.96, waiting=1)}),
        FleetState(NOW, snapshots={A: snap(A, short_prompt_prefill_s=1.96)}, inflight={A: InFlight(1, 18, 0)}),
        # No fresh snapshot: not measured idle.
        FleetState(NOW, snapshots={A: replace(snap(A, short_prompt_prefill_s=1.96), last_seen=NOW - 60)}),
    ],
    ids=["running", "waiting", "router in flight", "stale snapshot"],
)
def test_an_engine_not_measured_idle_is_not_probed(busy: FleetState) -> None:
    floored = fleet(ep(8001), slo_s=1.0)
    if busy.snapshots[A].last_seen < NOW - 10:  # stale: the floor does not apply either, so load makes it miss
        busy = replace(busy, inflight={A: InFlight(0, 40_000, 0)})
    decision = batch(18, floored, busy)
    assert decision.rejection is not None and decision.rejection.status == 429, decision.explain()
    assert not decision.shed_probe


def test_one_probe_per_engine_per_interval() -> None:
    recent = replace(FLOORED, shed_probes={A: NOW - 1.0})
    other = batch(18, TWO, recent)  # A was probed a second ago: B, idle too, is probed instead
    assert other.endpoint == B and other.shed_probe, other.explain()
    both = replace(FLOORED, shed_probes={A: NOW - 1.0, B: NOW - 4.0})
    assert batch(18, TWO, both).rejection is not None
    due = replace(FLOORED, shed_probes={A: NOW - 5.0, B: NOW - 4.0})
    assert batch(18, TWO, due).endpoint == A
    off = fleet(ep(8001), ep(8002), shed_probe_interval_s=None)
    assert batch(18, off, FLOORED).rejection is not None


def test_the_probe_corrects_the_floor_and_ordinary_placement_takes_over() -> None:
    # The scraper learns a 1.75 s floor under load; idle, the engine is predicted over a 1 s objective and the
    # sheddable class would be refused for good. The probe's one request (16 ms) is a window the learned rate
    # explains: the floor drops to it at once (kvstate.rates), and the next request is placed as usual.
    est = RateEstimator()
    load = short_prompts_finished(EngineLoad(), 0, 0.0)
    est.observe(load, now=0.0)
    est.per_request_prefill = 600.0
    for t in range(1, 4):
        load = short_prompts_finished(load, 6, 1.75)
        est.observe(load, now=float(t))

    def state() -> FleetState:
        rate, floor = est.prefill_tokens_per_s, est.short_prompt_prefill_s
        return FleetState(NOW, snapshots={A: snap(A, prefill_tokens_per_s=rate, short_prompt_prefill_s=floor)})

    one = fleet(ep(8001))
    probe = batch(18, one, state())
    assert probe.endpoint == A and probe.shed_probe, probe.explain()
    load = short_prompts_finished(load, 1, 0.016)  # the probe, on the idle engine
    est.observe(load, now=4.0)
    assert est.short_prompt_prefill_s == pytest.approx(0.016)
    after = batch(18, one, state())  # its rate (the loaded windows' ceiling) still slow, but within the objective
    assert after.endpoint == A and not after.shed_probe and not after.saturated, after.explain()


async def test_the_router_sends_one_probe_at_a_time_and_one_per_interval() -> None:
    clock = [NOW]
    store = MemoryStore()
    router = Router(fleet(ep(8001)), store, clock=lambda: clock[0])

    async def idle_scrape() -> None:
        await store.put_snapshot(EndpointSnapshot(A, last_seen=clock[0], short_prompt_prefill_s=1.96))

    def request() -> RouteRequest:
        return RouteRequest(model="m", prompt="hello there", priority="batch")

    await idle_scrape()
    first, attempt = await router.admit(request())
    assert first.shed_probe and first.endpoint == A and attempt is not None, first.explain()
    while_running, _ = await router.admit(request())  # the probe is in flight: A is not idle
    assert while_running.rejection is not None and while_running.rejection.status == 429
    attempt.first_token()
    attempt.finish(Outcome(OutcomeKind.COMPLETED, status=200))
    await attempt.settled()
    clock[0] += 4.0
    await idle_scrape()
    too_soon, _ = await router.admit(request())  # idle again, but within shed_probe_interval_s (5 s)
    assert too_soon.rejection is not None and not too_soon.shed_probe, too_soon.explain()
    clock[0] += 1.0
    await idle_scrape()
    again, attempt = await router.admit(request())
    assert again.shed_probe and attempt is not None, again.explain()
    attempt.finish(Outcome(OutcomeKind.COMPLETED, status=200))
    await attempt.settled()
    outcomes = {key[3]: n for key, n in router.telemetry.decisions.items()}
    assert outcomes == {"probe": 2, "shed": 2}
    await router.close()


async def test_with_flow_control_a_probe_on_a_fleet_idle_everywhere_is_not_held() -> None:
    # The hold rule holds a saturated request only where an engine without its load would meet the objective: on a
    # fleet idle everywhere none would, so the probe goes at once instead of waiting out its bound and a 429.
    base = fleet(ep(8001), ep(8002))
    config = config_from_dict({**base.model_dump(mode="json", exclude_unset=True), "flow_control": {}})
    store = MemoryStore()
    router = Router(config, store)
    for e, floor in ((A, 1.96), (B, 2.5)):
        await store.put_snapshot(EndpointSnapshot(e, last_seen=time.time(), short_prompt_prefill_s=floor))
    request = RouteRequest(model="m", prompt="hello there", priority="batch")
    decision, attempt = await asyncio.wait_for(router.admit(request), timeout=5.0)
    assert decision.shed_probe and decision.endpoint == A and attempt is not None, decision.explain()
    attempt.finish(Outcome(OutcomeKind.COMPLETED, status=200))
    await attempt.settled()
    await router.close()
