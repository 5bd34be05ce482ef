"""Burst to a cloud in the core: the hysteresis, the rules that keep a request local, the cloud's 429 and health
state, spend per team, and what a decision says. The Router over the in-process store (the policy is the
Router's own state; the end-to-end tests run both gateways against a real cloud simulator)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cognitora.burst.credentials import cloud_api_keys
from cognitora.burst.policy import BurstPolicy
from cognitora.burst.saturation import SaturationDetector
from cognitora.config import CognitoraConfig, ConfigError, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.metrics.exporter import Exporter
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot

A = "127.0.0.1:8001"
MODEL = "smollm2"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_config(
    prefill_tokens_per_s: float = 10.0, classes: dict[str, Any] | None = None, **burst: Any
) -> CognitoraConfig:
    """One engine so slow (10 tokens/s) that any prompt misses a 2 s SLO: every decision is saturated."""
    settings: dict[str, Any] = {
        "targets": [
            {
                "name": "cloud",
                "base_url": "https://cloud.example/v1",
                "models": {MODEL: "big-model"},
                "input_usd_per_mtok": 1_000_000.0,  # a dollar a token: spend limits are easy to reach
                "output_usd_per_mtok": 2_000_000.0,
                "max_concurrency": 2,
            }
        ],
        "teams": ["research"],
        "priorities": ["default", "batch"],
        "min_dwell_s": 5.0,
        **burst,
    }
    return config_from_dict(
        {
            "placement": {
                "store_timeout_s": 5.0,
                "priorities": {
                    "default": {"ttft_slo_s": 2.0},
                    "batch": {"ttft_slo_s": 2.0, "sheddable": True},
                    **(classes or {}),
                },
            },
            "models": [
                {"name": MODEL, "endpoints": [{"url": f"http://{A}", "prefill_tokens_per_s": prefill_tokens_per_s}]}
            ],
            "burst": settings,
        }
    )


def request(team: str | None = "research", priority: str = "default", **extra: Any) -> RouteRequest:
    return RouteRequest(model=MODEL, prompt="a prompt of a few words " * 8, team=team, priority=priority, **extra)


def router_for(config: CognitoraConfig) -> tuple[Router, Clock]:
    router = Router(config, MemoryStore())
    clock = Clock()
    router.burst = BurstPolicy(config, clock=clock)
    return router, clock


# -- the hysteresis ------------------------------------------------------------------------------------------


def test_enters_at_once_stays_above_the_exit_threshold_and_leaves_after_the_dwell() -> None:
    # The input is the best local endpoint's load ratio: its predicted TTFT (or ITL) over the class's SLO.
    d = SaturationDetector(enter_ratio=1.0, exit_ratio=0.5, min_dwell_s=5.0)
    assert not d.observe("m", "c", 0.95, 0.0).burst  # under the SLO: local
    assert d.observe("m", "c", 1.05, 1.0).burst  # over it: burst at once
    assert d.observe("m", "c", 0.75, 2.0).burst  # in burst, over the exit threshold (half the SLO): still out
    calm = d.observe("m", "c", 0.45, 3.0)
    assert not calm.burst and calm.bursting  # local, but the class stays in burst during the dwell
    assert d.observe("m", "c", 0.6, 4.0).burst  # back over the exit threshold: out again, the dwell restarts
    assert d.observe("m", "c", 0.45, 5.0).bursting
    left = d.observe("m", "c", 0.45, 10.5)
    assert not left.burst and not left.bursting  # calm for 5.5 s: left
    assert not d.observe("m", "c", 0.95, 11.0).burst  # out of burst, the enter threshold applies again


def test_the_exit_threshold_may_not_exceed_the_enter_one() -> None:
    with pytest.raises(ConfigError, match="exit_ratio"):
        make_config(exit_ratio=1.2)


def test_burst_names_only_known_classes_and_models() -> None:
    with pytest.raises(ConfigError, match=r"burst\.priorities: 'urgent'"):
        make_config(priorities=["urgent"])
    with pytest.raises(ConfigError, match=r"burst.targets\[0\].models: 'other'"):
        make_config(targets=[{"name": "cloud", "models": {"other": "x"}}])


# -- who bursts --------------------------------------------------------------------------------------------------


async def test_a_saturated_request_of_an_allowed_team_bursts_and_says_why() -> None:
    router, _ = router_for(make_config())
    decision, attempt = await router.admit(request())
    assert decision.cloud is not None and attempt is not None
    assert (decision.endpoint, decision.cloud.model, decision.cloud.url) == (
        "cloud:cloud",
        "big-model",
        "https://cloud.example/v1",
    )
    assert decision.cloud.local_fallbacks == (A,)
    assert decision.reason.startswith("burst to cloud: saturated: best local predicted TTFT")
    assert "burst to cloud target cloud as model big-model" in decision.explain()
    assert router.recent_decisions()[-1] is decision  # explain and the decision log show the burst
    assert router.burst.decisions == {(MODEL, "default", "cloud", "saturated"): 1}


async def test_a_class_over_its_itl_objective_bursts_instead_of_429_and_says_why() -> None:
    # A fast engine (TTFT far under the class's SLO) whose measured decode step (100 ms: 10 tokens/s a sequence,
    # 4 running) is over the class's 50 ms ITL objective. Without burst the class is refused with 429; with it the
    # request goes to the cloud, under its own reason.
    streaming = {"streaming": {"ttft_slo_s": 60.0, "itl_slo_s": 0.05, "sheddable": True}}
    config = make_config(prefill_tokens_per_s=1e6, classes=streaming, priorities=["streaming"])
    router, _ = router_for(config)
    await router.store.put_snapshot(EndpointSnapshot(A, last_seen=time.time(), running=4, decode_tokens_per_s=10.0))
    decision, attempt = await router.admit(request(priority="streaming"))
    assert decision.cloud is not None and attempt is not None, decision.reason
    assert decision.reason.startswith(
        "burst to cloud: itl_saturated: best local predicted inter-token latency 100 ms over the burst threshold "
        "50 ms (class 'streaming', ITL SLO 50 ms)"
    ), decision.reason
    assert router.burst.decisions == {(MODEL, "streaming", "cloud", "itl_saturated"): 1}
    # A team that may not burst gets what the class gets without burst: 429 and the ITL in the message.
    local, _ = await router.admit(request(team="ops", priority="streaming"))
    assert local.rejection is not None and local.rejection.status == 429
    assert "best predicted inter-token latency 100 ms" in local.rejection.message


async def test_by_default_nothing_bursts() -> None:
    config = config_from_dict(
        {"models": [{"name": MODEL, "endpoints": [{"url": f"http://{A}", "prefill_tokens_per_s": 10}]}]}
    )
    router = Router(config, MemoryStore())
    decision, _ = await router.admit(request())
    assert decision.cloud is None and decision.endpoint == A and decision.saturated


@pytest.mark.parametrize(
    ("req", "why"),
    [
        (request(team="ops"), "team_not_allowed"),
        (request(team=None), "team_not_allowed"),
        (request(burst_targets=()), "no_target_for_model"),  # LiteLLM: no healthy cloud deployment in the group
    ],
)
async def test_a_request_that_may_not_burst_is_placed_exactly_as_without_burst(req: RouteRequest, why: str) -> None:
    router, _ = router_for(make_config())
    decision, _ = await router.admit(req)
    assert decision.cloud is None and decision.endpoint == A and decision.saturated
    assert f"stays local: {why.replace('_', ' ')}" in decision.reason
    assert router.burst.denied == {(MODEL, "default", why): 1}


async def test_a_sheddable_class_bursts_instead_of_429_or_is_shed_as_today() -> None:
    router, _ = router_for(make_config())
    burst, attempt = await router.admit(request(priority="batch"))
    assert burst.cloud is not None and burst.rejection is None and attempt is not None
    shed, none = await router.admit(request(team="ops", priority="batch"))
    assert shed.rejection is not None and shed.rejection.status == 429 and none is None


# -- the cloud's state, learned from outcomes -----------------------------------------------------------------------


async def test_a_429_holds_the_target_off_for_its_retry_after_and_the_retry_goes_local() -> None:
    router, clock = router_for(make_config())
    decision, attempt = await router.admit(request(), group="trace-1")
    assert decision.cloud is not None and attempt is not None
    attempt.finish(Outcome(OutcomeKind.REJECTED, status=429, retry_after_s=7, detail="rate limited"))
    retry, _ = await router.admit(request(), group="trace-1")
    assert retry.cloud is None and retry.endpoint == A  # LiteLLM's retry of the same request: local
    other, _ = await router.admit(request(), group="trace-2")
    assert other.cloud is None and "cloud rate limited" in other.reason
    clock.now += 7.5
    later, _ = await router.admit(request(), group="trace-3")
    assert later.cloud is not None


async def test_an_unreachable_cloud_is_left_alone_for_unhealthy_s() -> None:
    router, clock = router_for(make_config(unhealthy_s=10))
    _, attempt = await router.admit(request())
    assert attempt is not None
    attempt.finish(Outcome(OutcomeKind.CONNECT_FAILED, detail="connection refused"))
    assert (await router.admit(request()))[0].cloud is None
    clock.now += 11
    assert (await router.admit(request()))[0].cloud is not None


async def test_at_max_concurrency_requests_stay_local_until_one_finishes() -> None:
    router, _ = router_for(make_config())
    first, second = (await router.admit(request()))[1], (await router.admit(request()))[1]
    assert first is not None and second is not None
    third, _ = await router.admit(request())
    assert third.cloud is None and "cloud at capacity" in third.reason
    first.finish(Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=1, completion_tokens=1))
    assert (await router.admit(request()))[0].cloud is not None


async def test_spend_is_recorded_per_team_and_a_spent_team_stays_local() -> None:
    probe, _ = await router_for(make_config())[0].admit(request(max_tokens=2))
    estimate = probe.prompt_tokens + 2 * 2  # $1 a prompt token, $2 a completion token, max_tokens 2
    # The limit holds one request's estimate, and less than the spend below plus a second one's.
    router, _ = router_for(make_config(team_spend_limit_usd={"research": estimate + 1.0}))
    _, attempt = await router.admit(request(max_tokens=2))
    assert attempt is not None
    attempt.finish(Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=2, completion_tokens=2))  # $2 + $4
    row = router.burst.ledger.rows[("research", "cloud")]
    assert (row.requests, row.input_tokens, row.output_tokens, row.cost_usd) == (1, 2, 2, 6.0)
    decision, _ = await router.admit(request(max_tokens=2))
    assert decision.cloud is None and "spend exhausted" in decision.reason
    page = Exporter(router.config, "extproc", router=router).render().decode()
    assert 'cognitora_cloud_cost_usd_total{target="cloud",team="research"} 6.0' in page
    assert 'cognitora_cloud_tokens_total{kind="completion",target="cloud",team="research"} 2.0' in page
    assert 'cognitora_burst_denied_total{model="smollm2",priority="default",why="spend_exhausted"} 1.0' in page


async def test_a_cloud_attempt_rerouted_locally_becomes_a_local_attempt() -> None:
    router, _ = router_for(make_config())
    decision, attempt = await router.admit(request())
    assert decision.cloud is not None and attempt is not None
    local = attempt.rerouted(A, Outcome(OutcomeKind.UPSTREAM_ERROR, status=503, detail="Envoy retried"))
    assert local.endpoint == A and local.decision.cloud is None
    assert [a.endpoint for a in router.open_attempts()] == [A]
    assert router.burst.cloud.inflight("cloud") == 0


def test_the_api_key_comes_from_the_named_variable_and_a_missing_one_is_a_clear_error() -> None:
    config = make_config(targets=[{"name": "cloud", "credential_env": "CLOUD_KEY", "models": {MODEL: "m"}}])
    assert cloud_api_keys(config.burst, {"CLOUD_KEY": "sk-123"}) == {"cloud": "sk-123"}
    with pytest.raises(ConfigError, match="CLOUD_KEY is not set"):
        cloud_api_keys(config.burst, {})
