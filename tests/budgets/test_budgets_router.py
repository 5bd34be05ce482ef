"""Budgets through the core, the one seam both gateways call (``Router.admit`` -> ``Attempt.finish``), on the
in-process store and on Redis: refusals that name the limit and its reset, settles from each kind of outcome,
a rerouted request settled once, a team's priority class, and bad budget config named by key."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, ConfigError, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.identity import Identity
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import Store

MODEL = "smollm2"
A, B = "127.0.0.1:18001", "127.0.0.1:18002"


def make_config(smollm2_dir: Path, budgets: dict[str, Any], **top: Any) -> CognitoraConfig:
    return config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0},
            **top,
            "budgets": budgets,
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": f"http://{A}"}, {"url": f"http://{B}"}],
                }
            ],
        }
    )


def ask(team: str | None, max_tokens: int | None = 100, **extra: Any) -> RouteRequest:
    messages = [{"role": "user", "content": "What is a KV cache, in one line?"}]
    return RouteRequest(model=MODEL, messages=messages, team=team, max_tokens=max_tokens, **extra)


async def team_usage(router: Router, team: str) -> int:
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    r = gate.planner.plan("-", Identity(team=team), MODEL, gate.planner.usage(MODEL, 0, 0))
    [value] = await gate.ledger.counter_values(list(r.counters), int(time.time() * 1000))
    return value


async def test_a_team_runs_out_the_other_is_untouched(smollm2_dir: Path, store: Store, key_prefix: str) -> None:
    limit = {"limits": [{"window": "day", "total_tokens": 500}]}
    config = make_config(smollm2_dir, {"teams": {"alpha": limit, "beta": limit}}, key_prefix=key_prefix)
    router = Router(config, store)
    decision, attempt = await router.admit(ask("alpha"))
    assert attempt is not None and decision.prompt_tokens > 0
    estimate = decision.prompt_tokens + 100
    assert await team_usage(router, "alpha") == estimate  # reserved at placement
    admitted = 1
    while True:
        decision, attempt = await router.admit(ask("alpha"))
        if attempt is None:
            break
        admitted += 1
    assert admitted == 500 // estimate
    refusal = decision.rejection
    assert refusal is not None and refusal.status == 429
    assert "budgets.teams.alpha.limits[0].total_tokens" in refusal.message
    assert "day (UTC)" in refusal.message
    midnight = (int(time.time()) // 86400 + 1) * 86400
    assert refusal.retry_after_s is not None and abs(refusal.retry_after_s - (midnight - time.time())) <= 2
    _, other = await router.admit(ask("beta"))  # the other team is untouched
    assert other is not None
    await router.close()


async def test_settles_follow_the_outcome(smollm2_dir: Path, store: Store, key_prefix: str) -> None:
    config = make_config(
        smollm2_dir,
        {"teams": {"alpha": {"limits": [{"window": "hour", "total_tokens": 100_000}]}}},
        key_prefix=key_prefix,
    )
    router = Router(config, store)

    async def settled_as(outcome: Outcome, max_tokens: int | None = 100) -> tuple[int, int]:
        before = await team_usage(router, "alpha")
        decision, attempt = await router.admit(ask("alpha", max_tokens))
        assert attempt is not None
        attempt.finish(outcome)
        return await team_usage(router, "alpha") - before, decision.prompt_tokens

    used, _ = await settled_as(Outcome(OutcomeKind.COMPLETED, prompt_tokens=30, completion_tokens=7))
    assert used == 37
    used, prompt = await settled_as(Outcome(OutcomeKind.CLIENT_CANCELLED, completion_tokens=12))
    assert used == prompt + 12  # an abandoned stream settles what it streamed
    used, prompt = await settled_as(Outcome(OutcomeKind.ABANDONED), max_tokens=None)
    assert used == prompt + 1024  # no end reported: the estimate (budgets.default_max_tokens)
    used, _ = await settled_as(Outcome(OutcomeKind.CONNECT_FAILED))
    assert used == 0  # nothing served, nothing charged

    decision, attempt = await router.admit(ask("alpha"))
    assert attempt is not None
    before = await team_usage(router, "alpha")
    other = B if attempt.endpoint == A else A
    moved = attempt.rerouted(other, Outcome(OutcomeKind.CONNECT_FAILED))  # Envoy retried on a fallback
    assert await team_usage(router, "alpha") == before  # the reservation moved with the request
    moved.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=40, completion_tokens=2))
    moved.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=40, completion_tokens=2))
    assert await team_usage(router, "alpha") == before - (decision.prompt_tokens + 100) + 42
    await router.close()


async def test_a_team_maps_to_its_priority_class(smollm2_dir: Path, key_prefix: str) -> None:
    config = make_config(
        smollm2_dir,
        {"teams": {"nightly": {"priority": "batch", "limits": [{"window": "day", "total_tokens": 100_000}]}}},
        placement={"priorities": {"default": {"ttft_slo_s": 5}, "batch": {"ttft_slo_s": 1e-9, "sheddable": True}}},
    )
    router = Router(config, MemoryStore())
    shed, _ = await router.admit(ask("nightly"))
    assert shed.rejection is not None and shed.rejection.status == 429 and "budget" not in shed.rejection.message
    assert await team_usage(router, "nightly") == 0  # reserved beside the fleet read, given back when shed
    gate = router.budgets
    assert gate is not None
    day = gate.planner.plan("-", Identity(), MODEL, gate.planner.usage(MODEL, 0, 0)).day
    rows = (await gate.ledger.days([day]))[day]
    assert rows.get(f"team\tnightly\t{MODEL}\trequests", 0) == 0
    _, placed = await router.admit(ask("nightly", priority="default_explicit_is_the_default"))
    assert placed is None  # an unknown class named by a trusted source is that source's (placement refuses it)
    _, kept = await router.admit(ask("others"))
    assert kept is not None
    await router.close()


def test_request_that_can_never_fit_is_told_so(smollm2_dir: Path) -> None:
    import asyncio

    config = make_config(smollm2_dir, {"teams": {"alpha": {"limits": [{"window": "minute", "output_tokens": 50}]}}})

    async def main() -> None:
        router = Router(config, MemoryStore())
        decision, _ = await router.admit(ask("alpha", max_tokens=None))
        assert decision.rejection is not None and decision.rejection.status == 400
        assert "lower max_tokens" in decision.rejection.message and "1,024 output_tokens" in decision.rejection.message
        await router.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("budgets", "named"),
    [
        (
            {"teams": {"alpha": {"limits": [{"window": "weekly", "total_tokens": 5}]}}},
            "budgets.teams.alpha.limits[0].window",
        ),
        ({"teams": {"alpha": {"limits": [{"window": "day"}]}}}, "budgets.teams.alpha.limits[0]"),
        ({"teams": {"alpha": {"limits": [{"window": "rolling", "total_tokens": 5}]}}}, "rolling_s"),
        ({"teams": {"alpha": {"limit": []}}}, "budgets.teams.alpha: unknown key 'limit'; did you mean 'limits'"),
        ({"teams": {"alpha": {"priority": "gold"}}}, "budgets.teams.alpha.priority"),
        ({"time_zone": "Mars/Olympus"}, "budgets.time_zone"),
        ({"on_store_error": "shrug"}, "budgets.on_store_error"),
        ({"defaults": {"team": [{"window": "day", "total_tokens": -1}]}}, "budgets.defaults.team[0].total_tokens"),
    ],
)
def test_bad_budget_config_names_the_key(smollm2_dir: Path, budgets: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(smollm2_dir, budgets)
    assert named in str(caught.value)


async def test_concurrent_admits_never_overshoot_and_metrics_say_so(
    smollm2_dir: Path, store: Store, key_prefix: str
) -> None:
    """N=64 concurrent requests through the core against a budget for N/4: N/4 admitted, usage <= limit, and the
    exporter's families show the limit, the usage and the refusals."""
    import asyncio

    from cognitora.metrics.families import RouterFamilies

    probe = Router(make_config(smollm2_dir, {}, key_prefix=key_prefix), MemoryStore())
    one, _ = await probe.admit(ask("alpha"))
    await probe.close()
    estimate = one.prompt_tokens + 100
    n = 64
    limit = estimate * n // 4
    config = make_config(
        smollm2_dir, {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": limit}]}}}, key_prefix=key_prefix
    )
    router = Router(config, store)
    results = await asyncio.gather(*(router.admit(ask("alpha")) for _ in range(n)))
    admitted = [a for _, a in results if a is not None]
    assert len(admitted) == n // 4
    assert await team_usage(router, "alpha") == limit
    for attempt in admitted:
        attempt.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=10, completion_tokens=5))
    assert await team_usage(router, "alpha") == 15 * n // 4
    gate = router.budgets
    assert gate is not None
    gate.last_usage = await gate.usage_gauges()
    samples = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in RouterFamilies(router).collect()
        for s in m.samples
        if m.name.startswith("cognitora_budget")
    }
    labels = (("metric", "total_tokens"), ("team", "alpha"), ("window", "day"))
    assert samples[("cognitora_budget_limit", labels)] == limit
    assert samples[("cognitora_budget_usage", labels)] == 15 * n // 4
    assert samples[("cognitora_budget_rejections", (("reason", "total_tokens"), ("team", "alpha")))] == n - n // 4
    assert samples[("cognitora_budget_fail_open", ())] == 0  # Redis up: never admitted unchecked
    counts = [
        s.value
        for m in RouterFamilies(router).collect()
        for s in m.samples
        if s.name == "cognitora_budget_reserve_duration_seconds_count"
    ]
    assert counts == [n]  # each reservation's latency observed
    await router.close()


async def test_concurrent_admits_with_budgets_see_each_others_load(
    smollm2_dir: Path, store: Store, key_prefix: str
) -> None:
    """The reservation is sent beside the fleet read; placement then reads this process's in-flight counts only
    after both are back, with nothing awaited from there to the dispatch. Were the reservation awaited between the
    pick and its count, every concurrent request would see the same idle fleet and pile onto the faster engine."""
    config = config_from_dict(
        {
            "key_prefix": key_prefix,
            "placement": {"store_timeout_s": 5.0},
            "budgets": {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": 10_000_000}]}}},
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [
                        {"url": f"http://{A}", "prefill_tokens_per_s": 20_000},
                        {"url": f"http://{B}", "prefill_tokens_per_s": 10_000},
                    ],
                }
            ],
        }
    )
    router = Router(config, store)
    gate = router.budgets
    assert gate is not None
    reserve = gate.reserve

    async def slow_reserve(*args: Any, **kwargs: Any) -> Any:  # a budget store slower than the fleet read
        await asyncio.sleep(0.05)
        return await reserve(*args, **kwargs)

    gate.reserve = slow_reserve  # type: ignore[method-assign]

    def long_ask(i: int) -> RouteRequest:
        text = f"request {i}: " + " ".join(f"word{(i * 7919 + j) % 5000}" for j in range(1500))
        return RouteRequest(model=MODEL, messages=[{"role": "user", "content": text}], team="alpha", max_tokens=10)

    placed = await asyncio.gather(*(router.admit(long_ask(i)) for i in range(8)))
    picks = [decision.endpoint for decision, attempt in placed if attempt is not None]
    assert len(picks) == 8
    on_slower = sum(1 for p in picks if p is not None and p.endswith("18002"))
    assert on_slower >= 2, f"every request saw an idle fleet: {picks}"
    await router.close()
