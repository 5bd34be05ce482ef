"""Who reaches the cloud, and how a failing cloud and a drained fleet are handled, in the core (issue 39): the Router
over the in-process store with the burst policy on a test clock. The end-to-end tests run the same rules through the
real Envoy and the real LiteLLM proxy against the simulated cloud failing each way (tests/test_cloud_faults_*_e2e.py).

- a request naming a cloud target goes there only for a team the operator listed (``named_teams``);
- the breaker: a failure holds the target off, then ONE request tests it (half-open); its failure doubles the
  hold-off, its success closes the breaker; a first token later than the class's SLO counts as a failure;
- a cloud slot and a spend hold are given back on every way a request ends, including one nobody reports (the
  Router ends it after the target's ``timeout_s``) and a decision the budget refused;
- concurrent requests never pass a team's cloud-spend limit together (their estimates are held while in flight);
- a burst whose fleet went idle lets go: a local probe measures the idle endpoint, and its answer ends the burst.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from cognitora.burst.cloud_state import Breaker
from cognitora.burst.policy import BurstPolicy
from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.metrics.exporter import Exporter
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot
from tests.burst.test_burst import MODEL, A, Clock, make_config, request

OK = Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=1, completion_tokens=1)
FAILED = Outcome(OutcomeKind.UPSTREAM_ERROR, status=500, detail="HTTP 500")


def target(**extra: Any) -> dict[str, Any]:
    """The cloud target of ``make_config`` ($1 a prompt token, $2 a completion token), with ``extra``."""
    return {
        "name": "cloud",
        "models": {MODEL: "big"},
        "input_usd_per_mtok": 1e6,
        "output_usd_per_mtok": 2e6,
        "max_concurrency": 100,
        **extra,
    }


def router_for(config: CognitoraConfig) -> tuple[Router, Clock]:
    router = Router(config, MemoryStore())
    clock = Clock()
    router.burst = BurstPolicy(config, clock=clock)
    return router, clock


def breaker(router: Router, clock: Clock) -> Breaker:
    return router.burst.cloud.state("cloud", clock.now)


# -- who may name a cloud target ---------------------------------------------------------------------------------


def fast_config(**burst: Any) -> CognitoraConfig:
    """An engine fast enough that nothing is saturated: only naming the target could send a request out."""
    return make_config(prefill_tokens_per_s=1e6, **burst)


@pytest.mark.parametrize("team", [None, "ops", "research"])
async def test_naming_a_cloud_target_is_placed_like_its_model_unless_the_team_may(team: str | None) -> None:
    # research may burst (burst.teams) but is not in named_teams: naming the target is not a way around saturation.
    router, _ = router_for(fast_config(targets=[target(named_teams=["direct"])]))
    decision, attempt = await router.admit(request(team=team, named_cloud="cloud"))
    assert decision.cloud is None and decision.endpoint == A and attempt is not None
    assert "the request named cloud target 'cloud': placed like its model" in decision.reason
    assert "named not allowed" in decision.reason
    assert router.burst.denied == {(MODEL, "default", "named_not_allowed"): 1}
    assert router.burst.cloud.inflight("cloud") == 0


async def test_a_team_the_operator_lists_may_name_a_target_and_it_is_counted_like_a_burst() -> None:
    router, _ = router_for(fast_config(targets=[target(named_teams=["direct"])]))
    decision, attempt = await router.admit(request(team="direct", named_cloud="cloud", max_tokens=1))
    assert decision.cloud is not None and attempt is not None, decision.reason
    assert decision.reason.startswith("named to cloud: named: the request named it and team 'direct' may")
    assert router.burst.decisions == {(MODEL, "default", "cloud", "named"): 1}
    attempt.finish(OK)
    await asyncio.sleep(0)
    page = Exporter(router.config, "extproc", router=router).render().decode()
    assert 'cognitora_cloud_cost_usd_total{target="cloud",team="(other)"} 3.0' in page  # in the spend, like a burst
    assert 'cognitora_cloud_attempts_total{result="ok",target="cloud"} 1.0' in page


async def test_a_named_target_of_another_model_or_unknown_is_refused() -> None:
    router, _ = router_for(fast_config(targets=[target(named_teams=["*"])]))
    unknown, _ = await router.admit(request(team="direct", named_cloud="elsewhere"))
    assert unknown.cloud is None and "named not allowed" in unknown.reason
    gone, _ = await router.admit(request(team="direct", named_cloud="cloud", burst_targets=()))
    assert gone.cloud is None and "no target for model" in gone.reason  # LiteLLM cooled the deployment down


# -- the breaker ---------------------------------------------------------------------------------------------------


async def test_a_failing_cloud_is_held_off_then_tested_by_one_request_and_the_hold_off_doubles() -> None:
    router, clock = router_for(make_config(unhealthy_s=10, unhealthy_max_s=25))
    _, attempt = await router.admit(request())
    assert attempt is not None
    attempt.finish(FAILED)
    assert breaker(router, clock) is Breaker.OPEN
    held, _ = await router.admit(request())
    assert held.cloud is None and "cloud unhealthy" in held.reason

    clock.now += 10.5  # the hold-off is over: one request tests the target, the next waits for it
    probe, probe_attempt = await router.admit(request())
    assert probe.cloud is not None and probe_attempt is not None
    assert breaker(router, clock) is Breaker.HALF_OPEN
    waiting, _ = await router.admit(request())
    assert waiting.cloud is None and "cloud unhealthy" in waiting.reason
    probe_attempt.finish(FAILED)
    clock.now += 19  # twice the hold-off: still open
    assert (await router.admit(request()))[0].cloud is None
    clock.now += 1.5
    second_probe, second = await router.admit(request())
    assert second_probe.cloud is not None and second is not None
    second.finish(FAILED)
    clock.now += 24  # capped at unhealthy_max_s (25), not 40
    assert (await router.admit(request()))[0].cloud is None
    clock.now += 1.5
    third_probe, third = await router.admit(request())
    assert third_probe.cloud is not None and third is not None
    third.finish(OK)  # the probe's success closes the breaker: everyone goes again
    assert breaker(router, clock) is Breaker.CLOSED
    assert (await router.admit(request()))[0].cloud is not None
    assert (await router.admit(request()))[0].cloud is not None
    state = router.burst.cloud.summary(clock.now)["cloud"]
    assert (state.opened, state.probes) == (3, 3)


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(OutcomeKind.UPSTREAM_ERROR, status=500),
        Outcome(OutcomeKind.UPSTREAM_ERROR, status=503),
        Outcome(OutcomeKind.CONNECT_FAILED, detail="connection reset"),
        Outcome(OutcomeKind.TIMEOUT, detail="no answer"),
        Outcome(OutcomeKind.REJECTED, status=401),
    ],
    ids=["500", "503", "reset", "timeout", "401"],
)
async def test_each_way_a_cloud_fails_opens_the_breaker(outcome: Outcome) -> None:
    router, clock = router_for(make_config())
    _, attempt = await router.admit(request())
    assert attempt is not None
    attempt.finish(outcome)
    assert breaker(router, clock) is Breaker.OPEN


@pytest.mark.parametrize(
    "outcome",
    [Outcome(OutcomeKind.CLIENT_CANCELLED), Outcome(OutcomeKind.REJECTED, status=400)],
    ids=["client_gone", "bad_request"],
)
async def test_an_end_that_says_nothing_of_the_cloud_leaves_it_closed(outcome: Outcome) -> None:
    router, clock = router_for(make_config())
    _, attempt = await router.admit(request())
    assert attempt is not None
    attempt.finish(outcome)
    assert breaker(router, clock) is Breaker.CLOSED and router.burst.cloud.inflight("cloud") == 0


async def test_a_slow_answer_is_an_answer() -> None:
    # A cloud slower than the SLO may still be faster than the saturated fleet it relieves: not held off.
    router, clock = router_for(make_config())
    _, attempt = await router.admit(request())
    assert attempt is not None
    attempt.dispatched_at -= 3.0  # its first token 3 s after dispatch: the class's SLO is 2 s
    attempt.first_token()
    await asyncio.sleep(0)
    attempt.finish(OK)
    assert breaker(router, clock) is Breaker.CLOSED
    assert router.burst.cloud.results == {("cloud", "ok"): 1}


# -- slots and holds are given back on every end ------------------------------------------------------------------


async def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_cloud_attempt_nobody_reports_ends_after_the_targets_timeout() -> None:
    # A hung cloud whose gateway never reports the end: its slot was held for the route's 600 s, and at
    # max_concurrency every later burst was refused as cloud_at_capacity.
    router, _ = router_for(make_config(targets=[target(timeout_s=0.2)]))
    _, attempt = await router.admit(request())
    assert attempt is not None
    assert router.burst.cloud.inflight("cloud") == 1
    await wait_for(lambda: router.burst.cloud.inflight("cloud") == 0, 5.0, "the cloud slot to be released")
    assert attempt.outcome is not None and attempt.outcome.kind is OutcomeKind.TIMEOUT
    assert router.burst.cloud.results == {("cloud", "failed"): 1} and router.open_attempts() == []


async def test_a_cloud_decision_the_budget_refuses_gives_its_slot_and_hold_back() -> None:
    config = config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0, "priorities": {"default": {"ttft_slo_s": 2.0}}},
            "models": [{"name": MODEL, "endpoints": [{"url": f"http://{A}", "prefill_tokens_per_s": 10.0}]}],
            "budgets": {"teams": {"research": {"limits": [{"window": "day", "input_tokens": 1}]}}},
            "burst": {
                "targets": [target(max_concurrency=1)],
                "teams": ["research"],
                "priorities": ["default"],
                "team_spend_limit_usd": {"research": 1e9},
            },
        }
    )
    router, _ = router_for(config)
    for _ in range(2):  # the second would find the only slot taken if the first had kept it
        refused, attempt = await router.admit(request())
        assert refused.rejection is not None and attempt is None  # the budget's (48 prompt tokens, a limit of 1)
        assert "input_tokens" in refused.rejection.message
    assert router.burst.cloud.inflight("cloud") == 0
    assert router.burst.denied == {}
    assert router.burst.spend.within_limit("research")


# -- spend: concurrent requests never pass the limit together ----------------------------------------------------


async def test_concurrent_bursts_never_pass_the_teams_spend_limit_together() -> None:
    # One request is estimated at prompt + 2 x max_tokens dollars. The limit holds three estimates; ten requests
    # are in flight at once before any finishes. Before, every one of them burst (the spend was known only at each
    # one's end): a $0.0003 limit became $0.0005 of spend.
    probe, _ = await router_for(make_config())[0].admit(request(max_tokens=4))
    estimate = probe.prompt_tokens + 2 * 4
    limit = 3 * estimate + 0.5
    router, _ = router_for(make_config(team_spend_limit_usd={"research": limit}, targets=[target()]))
    admitted = [await router.admit(request(max_tokens=4)) for _ in range(10)]
    out = [attempt for decision, attempt in admitted if decision.cloud is not None]
    assert len(out) == 3, [d.reason for d, _ in admitted]
    assert all("spend exhausted" in d.reason for d, _ in admitted if d.cloud is None)
    used = Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=probe.prompt_tokens, completion_tokens=4)
    for attempt in out:
        assert attempt is not None
        attempt.finish(used)
    spent = sum(row.cost_usd for row in router.burst.ledger.rows.values())
    assert spent == 3 * estimate <= limit
    assert (await router.admit(request(max_tokens=4)))[0].cloud is None  # spent: no room for a fourth


# -- burst lets go --------------------------------------------------------------------------------------------------


async def stale_idle_engine(router: Router, floor_s: float) -> None:
    """The engine idle (nothing running or waiting) but its short-prompt prefill learned at ``floor_s`` under a load
    that is gone: every request is predicted at least that late there, and nothing corrects it while none runs."""
    await router.store.put_snapshot(
        EndpointSnapshot(A, last_seen=time.time(), running=0, waiting=0, short_prompt_prefill_s=floor_s)
    )


async def load_step(router: Router) -> None:
    """A load step on the engine, and a short-prompt prefill learned under it at 3 s: any request is predicted at
    least 3 s late there (1.5 x the 2 s SLO): the class enters burst."""
    await router.store.put_snapshot(
        EndpointSnapshot(A, last_seen=time.time(), running=4, waiting=8, short_prompt_prefill_s=3.0)
    )
    loaded, _ = await router.admit(request())
    assert loaded.cloud is not None, loaded.reason


async def test_a_burst_whose_fleet_went_idle_lets_go_after_one_local_probe() -> None:
    # The load is gone (nothing running, nothing waiting), but the floor it taught is still 1.7 s: over the exit
    # threshold (0.8 x 2 s), under the enter one. Nothing runs locally to correct it: before, the class stayed in
    # burst for good (every request to the paid cloud, the fleet idle).
    router, _ = router_for(fast_config(exit_ratio=0.8, probe_interval_s=1.0))
    await load_step(router)
    await stale_idle_engine(router, 1.7)
    probe, attempt = await router.admit(request())
    assert probe.cloud is None and probe.endpoint == A and attempt is not None
    assert "burst probe: 127.0.0.1:8001 is idle (nothing running or queued) although predicted at 1.70 s" in (
        probe.reason
    )
    out, _ = await router.admit(request())  # one probe at a time (the engine is busy with it now, anyway)
    assert out.cloud is not None
    attempt.first_token()
    await asyncio.sleep(0)
    attempt.finish(OK)
    assert router.burst.probes.results == {(MODEL, "default", "released"): 1}
    assert router.burst.detector.states()[(MODEL, "default")] is False
    for _ in range(5):
        local, _ = await router.admit(request())
        assert local.cloud is None and local.endpoint == A, local.reason
    page = Exporter(router.config, "extproc", router=router).render().decode()
    assert 'cognitora_burst_probes_total{model="smollm2",priority="default",result="released"} 1.0' in page


async def test_a_probe_that_misses_the_exit_threshold_keeps_the_burst_and_the_next_waits_its_turn() -> None:
    router, clock = router_for(fast_config(exit_ratio=0.8, probe_interval_s=5.0))
    await load_step(router)
    await stale_idle_engine(router, 1.7)
    _, attempt = await router.admit(request())
    assert attempt is not None and attempt.decision.cloud is None
    attempt.dispatched_at -= 2.0  # its first token 2 s after dispatch: over the exit threshold (1.6 s)
    attempt.first_token()
    await asyncio.sleep(0)
    attempt.finish(OK)
    assert router.burst.probes.results == {(MODEL, "default", "too_slow"): 1}
    assert (await router.admit(request()))[0].cloud is not None  # still in burst; the next probe in 5 s
    clock.now += 5.0
    assert (await router.admit(request()))[0].cloud is None


async def test_a_busy_engine_is_not_probed() -> None:
    router, _ = router_for(fast_config(exit_ratio=0.8))
    await load_step(router)
    busy, _ = await router.admit(request())  # still running and waiting: the prediction stands
    assert busy.cloud is not None and "probe" not in busy.reason


async def test_a_probe_never_takes_a_prompt_whose_own_prefill_misses_the_exit_threshold() -> None:
    router, _ = router_for(make_config(exit_ratio=0.8))  # 10 tokens/s: the prompt's own prefill takes ~5 s
    first, _ = await router.admit(request())
    assert first.cloud is not None
    idle, _ = await router.admit(request())  # the engine is idle, and truly slow for this prompt: no probe
    assert idle.cloud is not None and "probe" not in idle.reason


# -- an intent rewrite is one more way to a model, not to the cloud --------------------------------------------------


def intent_config() -> CognitoraConfig:
    return config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0, "priorities": {"default": {"ttft_slo_s": 2.0}}},
            "models": [
                {"name": "code", "endpoints": [{"url": "http://127.0.0.1:9101", "prefill_tokens_per_s": 2}]},
                {"name": "small", "endpoints": [{"url": "http://127.0.0.1:9201", "prefill_tokens_per_s": 1e6}]},
            ],
            "intent": {
                "rewrite": ["auto"],
                "default": "small",
                "intents": [{"name": "code", "target": "code", "rules": [{"last_user_regex": r"\bdef "}]}],
            },
            "burst": {
                "targets": [target(models={"code": "big-code"})],
                "teams": ["research"],
                "priorities": ["default"],
            },
        }
    )


@pytest.mark.parametrize(("team", "out"), [("research", True), ("ops", False), (None, False)])
async def test_a_rewritten_request_bursts_by_the_same_rules_as_any_other(team: str | None, out: bool) -> None:
    # "auto" rewritten to "code", whose engine is saturated: the burst rules apply to the model that serves it (before,
    # they looked up "auto", found no model, and a rewritten request never burst for anyone).
    router, _ = router_for(intent_config())
    ask = RouteRequest(model="auto", messages=[{"role": "user", "content": "def f(): pass " * 4}], team=team)
    decision, attempt = await router.admit(ask)
    assert decision.model == "code" and attempt is not None
    assert (decision.cloud is not None) is out, decision.reason
    if not out:
        assert "stays local: team not allowed" in decision.reason
