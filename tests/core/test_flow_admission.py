"""Flow control wired into ``Router.admit`` (cognitora/core/flow_gate.py, docs/flow_control.md): a request the
saturated fleet cannot seat waits in the gateway, is placed when it leaves on the fleet as it is then, leaves at
once when its client goes away, times out with 429 and Retry-After, and its budget reservation is held meanwhile
and given back when it leaves unplaced. Two engines of one seat each; their seats are taken by the router's own
dispatches, so the seat wait is what the hold rule reads."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, ConfigError, config_from_dict
from cognitora.core.lifecycle import Attempt
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.identity import Identity, IdentitySource
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot
from tests.support.flow_core import take_seats, until, waiting

A, B = "127.0.0.1:8001", "127.0.0.1:8002"
PRIORITIES = {
    "interactive": {"ttft_slo_s": 60},
    "default": {"ttft_slo_s": 90},
    "batch": {"ttft_slo_s": 120, "sheddable": True},
}


def fleet(flow: dict[str, Any] | None, **top: Any) -> CognitoraConfig:
    endpoints = [{"url": f"http://{e}", "cost": {"max_num_seqs": 1}} for e in (A, B)]
    data: dict[str, Any] = {
        "models": [{"name": "m", "endpoints": endpoints}],
        "placement": {"priorities": PRIORITIES},
        **top,
    }
    if flow is not None:
        data["flow_control"] = flow
    return config_from_dict(data)


async def saturated(config: CognitoraConfig) -> tuple[Router, list[Attempt]]:
    """A router whose two engines each run one request it dispatched (both seats taken)."""
    store = MemoryStore()
    router = Router(config, store)
    for e in (A, B):
        await store.put_snapshot(EndpointSnapshot(endpoint=e, last_seen=time.time(), mean_service_s=10.0))
    return router, await take_seats(router, 2)


def req(rid: str, priority: str = "default", team: str | None = None) -> RouteRequest:
    who = Identity(team=team, priority=priority, source=IdentitySource.CALLER)
    return RouteRequest(model="m", prompt=f"prompt of {rid}", request_id=rid, identity=who)


async def test_without_the_section_a_saturated_request_is_placed_at_once_as_before() -> None:
    router, _ = await saturated(fleet(None))
    assert router.flow is None
    decision, attempt = await router.admit(req("r"))
    assert attempt is not None and decision.endpoint in (A, B)


async def test_a_request_waits_for_a_seat_and_is_placed_where_one_frees() -> None:
    router, holders = await saturated(fleet({}))
    task = asyncio.ensure_future(router.admit(req("r")))
    await until(lambda: waiting(router) == 1)
    assert not task.done()
    freed = holders[1].endpoint
    holders[1].finish(Outcome(OutcomeKind.COMPLETED))
    decision, attempt = await asyncio.wait_for(task, 2)
    assert attempt is not None and decision.endpoint == freed, decision.explain()
    assert waiting(router) == 0
    assert router.flow is not None
    band = next(b for b in router.flow.controller.snapshot().bands if b.band == "default")
    assert sum(band.dispatched.values()) == 1


async def test_bands_leave_in_priority_order_and_teams_share_within_a_band() -> None:
    router, holders = await saturated(fleet({}))
    order: list[str] = []

    async def one(r: RouteRequest) -> None:
        decision, attempt = await router.admit(r)
        assert attempt is not None, decision.explain()
        order.append(r.request_id)
        attempt.finish(Outcome(OutcomeKind.COMPLETED))  # its seat frees for the next

    arrivals = [req("b1", "batch"), req("d1", "default", "x"), req("d2", "default", "x"), req("d3", "default", "y")]
    arrivals.append(req("i1", "interactive"))
    tasks = []
    for r in arrivals:
        tasks.append(asyncio.ensure_future(one(r)))
        queued = len(tasks)
        await until(lambda: waiting(router) == queued)  # noqa: B023 (awaited before the loop moves on)
    holders[0].finish(Outcome(OutcomeKind.COMPLETED))
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    # interactive first; within default, team y's one request goes before team x's second; batch last.
    assert order == ["i1", "d1", "d3", "d2", "b1"]


async def test_past_its_max_wait_a_request_gets_429_with_retry_after() -> None:
    router, _ = await saturated(fleet({"classes": {"batch": {"max_wait_s": 0.3}}}))
    started = time.monotonic()
    decision, attempt = await router.admit(req("r", "batch"))
    assert attempt is None and decision.rejection is not None
    retry = decision.rejection.retry_after_s
    assert decision.rejection.status == 429 and retry is not None and retry >= 1
    assert "max_wait_s of class 'batch'" in decision.rejection.message
    assert time.monotonic() - started >= 0.3
    assert router.flow is not None
    assert router.flow.telemetry.waits["batch", "anonymous", "timeout"].count == 1


async def test_a_client_that_goes_away_leaves_the_queue_at_once() -> None:
    router, holders = await saturated(fleet({}))
    task = asyncio.ensure_future(router.admit(req("gone")))
    await until(lambda: waiting(router) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiting(router) == 0
    holders[0].finish(Outcome(OutcomeKind.COMPLETED))
    await asyncio.sleep(0.05)
    assert router.attempt("gone") is None  # never dispatched


async def test_a_queued_request_holds_its_budget_reservation_and_gives_it_back_on_timeout() -> None:
    budgets = {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": 10_000_000}]}}}
    router, _ = await saturated(fleet({"default_max_wait_s": 0.5}, budgets=budgets))
    gate = router.budgets
    assert gate is not None
    task = asyncio.ensure_future(router.admit(req("r", team="alpha")))
    await until(lambda: waiting(router) == 1)
    await asyncio.sleep(0.05)
    before = await gate.ledger.open_reservations()
    decision, attempt = await asyncio.wait_for(task, 3)
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 429
    await gate.drain()
    assert before >= 1

    async def given_back() -> bool:
        return await gate.ledger.open_reservations() == before - 1

    await until(given_back)


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"flow_control.classes.gold: 'gold' is not a class of placement"):
        fleet({"classes": {"gold": {"max_wait_s": 5}}})
    with pytest.raises(ConfigError, match=r"flow_control.leases.enabled: leases are shared through Redis"):
        fleet({"leases": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"flow_control.classes.default.*aged_after_s \(30 s\) must be shorter"):
        fleet({"classes": {"default": {"max_wait_s": 30, "aged_after_s": 30}}})


async def test_the_metrics_page_shows_depth_waits_dispatches_and_timeouts() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from cognitora.metrics.families import RouterFamilies

    router, holders = await saturated(fleet({"classes": {"batch": {"max_wait_s": 0.2}}}))
    registry = CollectorRegistry()
    registry.register(RouterFamilies(router))
    task = asyncio.ensure_future(router.admit(req("r", team="alpha")))
    await until(lambda: waiting(router) == 1)
    page = generate_latest(registry).decode()
    assert 'cognitora_flow_queue_depth{band="default",flow="team:alpha"} 1.0' in page, page
    decision, _ = await router.admit(req("late", "batch"))
    assert decision.rejection is not None and decision.rejection.status == 429
    holders[0].finish(Outcome(OutcomeKind.COMPLETED))
    await asyncio.wait_for(task, 2)
    page = generate_latest(registry).decode()
    assert 'cognitora_flow_departures_total{band="batch",how="timeout"} 1.0' in page, page
    assert 'cognitora_flow_dispatches_total{band="default",reason="finished"} 1.0' in page, page
    assert 'cognitora_flow_wait_seconds_count{band="default",flow="team:alpha",how="dispatched"} 1.0' in page, page
    assert 'cognitora_flow_queue_depth{band="default",flow=""} 0.0' in page, page


async def test_the_metrics_page_shows_the_margin_and_band_rates_flow_control_learned() -> None:
    """What flow control decides with and learned at run time: the prediction margin and its samples, each band's
    recent arrival rate and mean gap (once trusted), as the gate holds them."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from cognitora.flow.priority import BandActivity
    from cognitora.metrics.families import RouterFamilies

    router = Router(fleet({}), MemoryStore())
    gate = router.flow
    assert gate is not None
    now = [100.0]
    gate.activity = BandActivity([(n, p["ttft_slo_s"]) for n, p in PRIORITIES.items()], 60.0, clock=lambda: now[0])
    for i in range(3):  # batch: 3 requests 1 s apart, at 100-102 (2 gaps: its mean gap is not trusted yet)
        now[0] = 100.0 + i
        gate.activity.saw("batch")
    for i in range(9):  # interactive: 9 requests 0.5 s apart, at 102.5-106.5 (8 gaps: trusted)
        now[0] = 102.5 + i / 2
        gate.activity.saw("interactive")
    gate.margin.observe(0.1, 1.0)  # predicted under min_predicted_s: not a sample
    for i in range(10):
        gate.margin.observe(1.0, 1.0 + i / 50)  # 1.00 .. 1.18: the 0.9 quantile of ten is the ninth, 1.16
    registry = CollectorRegistry()
    registry.register(RouterFamilies(router))
    page = generate_latest(registry).decode()
    found = {
        (s.name, s.labels.get("band", "")): s.value
        for f in text_string_to_metric_families(page)
        if f.name.startswith(("cognitora_flow_prediction", "cognitora_flow_band"))
        for s in f.samples
    }
    assert found[("cognitora_flow_prediction_margin", "")] == pytest.approx(1.16) == gate.margin.factor
    assert found[("cognitora_flow_prediction_margin_samples", "")] == 10
    rates = {r.band: r for r in gate.activity.rates()}
    # the rate: its requests of the last 10 s over the span from the first of them to now (106.5)
    assert found[("cognitora_flow_band_arrival_rate", "interactive")] == pytest.approx(9 / 4.0)
    assert rates["interactive"].rate_per_s == pytest.approx(9 / 4.0)
    assert found[("cognitora_flow_band_gaps", "interactive")] == 8
    assert found[("cognitora_flow_band_mean_gap_seconds", "interactive")] == pytest.approx(0.5)
    assert found[("cognitora_flow_band_arrival_rate", "batch")] == pytest.approx(3 / 6.5)
    assert found[("cognitora_flow_band_gaps", "batch")] == 2
    assert ("cognitora_flow_band_mean_gap_seconds", "batch") not in found  # 2 gaps: not trusted
    assert found[("cognitora_flow_band_arrival_rate", "default")] == 0  # none came
    assert found[("cognitora_flow_band_gaps", "default")] == 0
    await router.close()


async def test_explain_says_how_many_wait_ahead_across_replicas(redis_server_url: str, key_prefix: str) -> None:
    """``cognitora explain`` has no queue of its own: with Redis it counts what every live replica published."""
    from cognitora.explain import wait_line
    from cognitora.flow.redis_leases import RedisLeases
    from kvstate.redis_store import RedisStore

    config = fleet({}, redis_url=redis_server_url, key_prefix=key_prefix)
    store = RedisStore.from_url(redis_server_url, key_prefix)
    assert config.flow_control is not None
    replica = RedisLeases(store.client, key_prefix, config.flow_control.leases)
    await replica.publish_depth({"default": 3, "interactive": 1})
    await replica.heartbeat()
    explainer = Router(config, store)
    for e in (A, B):  # the router's own dispatches are in its process; the explainer reads the engines' gauges
        await store.put_snapshot(EndpointSnapshot(endpoint=e, last_seen=time.time(), running=1, mean_service_s=10.0))
    request = req("asked")
    decision = await explainer.place(request)
    line = await wait_line(explainer, request, decision)
    assert line is not None and line.startswith("would wait: 3 ahead in band 'default' (1 in higher bands); "), line
    # the wait follows the class's 90 s objective (less its own predicted TTFT, a few ms here)
    assert "seats are taken" in line and "at most 90 s, then 429 with Retry-After" in line, line
    await replica.close()
    await explainer.close()


async def test_explain_decides_with_the_largest_margin_the_gateway_replicas_learned(
    redis_server_url: str, key_prefix: str
) -> None:
    """A gateway replica whose first tokens came far later than predicted learned a margin of 1.5 (its bound) and
    shares it with its heartbeat; another shared 1.2, a third 2.0 from too few requests. ``cognitora explain``
    times no request: it decides with the largest learned one, and a request predicted at 10 s against a 12 s
    objective would wait (10 s x 1.5 is over 12 s). Once no gateway shares one, it decides with its own, 1, and
    the same request would not wait."""
    from cognitora.core.core import open_leases
    from cognitora.explain import wait_line
    from cognitora.flow.leases import SharedMargin
    from cognitora.flow.redis_leases import RedisLeases
    from kvstate.redis_store import RedisStore

    flow = {
        "hold_on": ["slo"],
        "leases": {"enabled": True, "replica_ttl_s": 3},
        "margin": {"min_samples": 2, "min_predicted_s": 0},
    }
    strict = {"priorities": {"default": {"ttft_slo_s": 12}}}
    config = fleet(flow, placement=strict, redis_url=redis_server_url, key_prefix=key_prefix)
    assert config.flow_control is not None
    gateway_store = RedisStore.from_url(redis_server_url, key_prefix)
    gateway = Router(config, gateway_store, leases=open_leases(config, gateway_store))
    for e in (A, B):  # the gateway has scraped its engines: it times first tokens on their clock
        await gateway_store.put_snapshot(EndpointSnapshot(endpoint=e, last_seen=time.time(), running=1))
    for holder in await take_seats(gateway, 2):
        holder.dispatched_at -= 10.0  # its first token 10 s after dispatch, against a prediction of milliseconds
        holder.first_token()
    others = [RedisLeases(gateway_store.client, key_prefix, config.flow_control.leases) for _ in range(2)]
    for other, margin in zip(others, (SharedMargin(1.2, 50), SharedMargin(2.0, 1)), strict=True):
        other.publish_margin(margin)
        await other.heartbeat()

    store = RedisStore.from_url(redis_server_url, key_prefix)
    explainer = Router(config, store)
    for e in (A, B):
        await store.put_snapshot(EndpointSnapshot(endpoint=e, last_seen=time.time(), running=1, mean_service_s=10.0))
    request = req("asked")
    decision = await explainer.place(request)
    assert 9.9 < decision.predicted_ttft_s < 11, decision.explain()

    async def shared_by_all() -> bool:  # the gateway's margin goes with its next heartbeat (every second here)
        return len(await others[0].margins()) == 3

    await until(shared_by_all)
    line = await wait_line(explainer, request, decision)
    assert line is not None and line.startswith("would wait: 0 ahead in band 'default'; "), line
    assert "over the class's 12 s objective (x margin 1.50, " in line, line
    assert (
        "(predicted times x prediction margin 1.50, learned by 2 gateway replicas, the largest, from 2 requests: "
        "the most cautious gateway decides; each holds with its own, cognitora_flow_prediction_margin on its "
        "/metrics)"
    ) in line, line

    await gateway.close()  # a replica that leaves takes its margin with it
    for other in others:
        await other.close()
    assert await wait_line(explainer, request, decision) is None  # none shared: its own margin, 1
    await explainer.close()
    await store.close()
    await gateway_store.close()


async def test_a_queued_request_refused_meanwhile_gets_the_refusal_and_its_hold_back() -> None:
    """Both engines go unhealthy while it waits: placement refuses it (not saturation), and its reservation goes
    back, as for any refused request."""
    budgets = {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": 10_000_000}]}}}
    router, _ = await saturated(fleet({}, budgets=budgets))
    gate = router.budgets
    assert gate is not None
    before = await gate.ledger.open_reservations()
    task = asyncio.ensure_future(router.admit(req("r", team="alpha")))
    await until(lambda: waiting(router) == 1)
    for e in (A, B):
        router.note_unhealthy(e, "test: the engine went away")
    decision, attempt = await asyncio.wait_for(task, 3)  # the queue's periodic re-check finds it
    assert attempt is None and decision.rejection is not None and decision.rejection.status != 429, decision.explain()
    await gate.drain()

    async def given_back() -> bool:
        return await gate.ledger.open_reservations() == before

    await until(given_back)


async def test_two_replicas_sharing_redis_release_one_request_per_free_seat(
    redis_server_url: str, key_prefix: str
) -> None:
    """Two gateway replicas (Routers over one Redis) each hold a request while the engine's one seat is taken; when
    the engine shows a free seat, the leases let exactly one of them through, counted across replicas; its finish
    releases the lease and the other goes."""
    from cognitora.core.core import open_leases
    from kvstate.redis_store import RedisStore

    endpoints = [{"url": f"http://{A}", "cost": {"max_num_seqs": 1}}]
    config = config_from_dict(
        {
            "models": [{"name": "m", "endpoints": endpoints}],
            "placement": {"priorities": PRIORITIES},
            "redis_url": redis_server_url,
            "key_prefix": key_prefix,
            "flow_control": {"leases": {"enabled": True, "replica_ttl_s": 2}},
        }
    )
    stores = [RedisStore.from_url(redis_server_url, key_prefix) for _ in range(2)]
    replicas = [Router(config, store, leases=open_leases(config, store)) for store in stores]
    busy = EndpointSnapshot(endpoint=A, last_seen=time.time(), running=1, mean_service_s=10.0)
    await stores[0].put_snapshot(busy)
    tasks = [asyncio.ensure_future(r.admit(req(f"q{i}"))) for i, r in enumerate(replicas)]
    await until(lambda: all(waiting(r) == 1 for r in replicas))
    await stores[0].put_snapshot(EndpointSnapshot(endpoint=A, last_seen=time.time(), running=0, mean_service_s=10.0))
    await until(lambda: sum(t.done() for t in tasks) == 1)
    await asyncio.sleep(0.6)  # two more re-checks of the other replica: still one seat, still held
    assert sum(t.done() for t in tasks) == 1
    first = next(t for t in tasks if t.done())
    decision, attempt = first.result()
    assert attempt is not None and decision.endpoint == A
    leases = replicas[0].flow.leases if replicas[0].flow is not None else None
    assert leases is not None and await leases.held([A]) == {A: 1}
    attempt.finish(Outcome(OutcomeKind.COMPLETED))
    await until(lambda: all(t.done() for t in tasks))
    for r in replicas:
        await r.close()


TIERED = {"default": {"ttft_slo_s": 2}, "batch": {"ttft_slo_s": 30, "sheddable": True}}
"""A strict class and a lax one, as in bench/flow_bench.py's priority stage."""


async def loaded(flow: dict[str, Any], waiting: int) -> tuple[Router, MemoryStore]:
    """A router over two engines without a configured seat count, each scraped with ``waiting`` queued requests
    (x 500 tokens at 10,000 prefill tokens/s: 20 are ~1 s of queued prefill, 100 are ~5 s)."""
    endpoints = [{"url": f"http://{e}"} for e in (A, B)]
    config = config_from_dict(
        {"models": [{"name": "m", "endpoints": endpoints}], "placement": {"priorities": TIERED}, "flow_control": flow}
    )
    store = MemoryStore()
    await scraped(store, waiting)
    return Router(config, store), store


async def scraped(store: MemoryStore, waiting: int) -> None:
    for e in (A, B):
        snap = EndpointSnapshot(endpoint=e, last_seen=time.time(), waiting=waiting, prefill_tokens_per_s=10_000.0)
        await store.put_snapshot(snap)


async def test_a_teams_long_prompt_held_for_its_objective_does_not_block_another_teams_short_one() -> None:
    """~1 s of queued prefill on each engine: team A's 12,500-token prompt would take 2.3 s there (over its 2 s
    objective, because of load: it waits), team B's short request behind it in the band would take ~1 s. B is
    placed at once; A still waits, and is placed when the load drains."""
    router, store = await loaded({}, waiting=20)
    long = asyncio.ensure_future(router.admit(replace(req("a-long", team="a"), prompt="word " * 10_000)))
    await until(lambda: waiting(router) == 1)
    assert router.flow is not None
    asked = replace(req("asked", team="a"), prompt="word " * 10_000)
    why = router.flow.should_wait(asked, await router.place(asked))
    assert why is not None and why.objective_s == pytest.approx(2.0)  # its deadline in the queue: queued + 2 s
    decision, attempt = await asyncio.wait_for(router.admit(req("b-short", team="b")), 2)
    assert attempt is not None, decision.explain()
    assert not long.done() and waiting(router) == 1
    await scraped(store, 0)
    decision, attempt = await asyncio.wait_for(long, 3)  # the periodic re-check sees the drained engines
    assert attempt is not None, decision.explain()


@pytest.mark.parametrize("window_s", [60.0, 0.0])
async def test_a_lax_class_is_held_while_the_engines_hold_more_than_an_active_strict_class_objective(
    window_s: float,
) -> None:
    """~5 s of queued prefill on each engine: over `default`'s 2 s objective, well under `batch`'s 30 s. Before any
    `default` request, `batch` is placed (nothing above it is active). After one `default` request (it waited,
    timed out, and left nobody waiting), a `batch` request is held at the gateway for `priority_window_s` instead
    of adding to the backlog `default` would wait behind; it is placed once the engines drain under 2 s.
    `priority_window_s: 0`: only waiters of the higher band hold it."""
    flow = {"classes": {"default": {"max_wait_s": 0.2}}, "priority_window_s": window_s}
    router, store = await loaded(flow, waiting=100)
    decision, attempt = await router.admit(req("early", "batch"))
    assert attempt is not None, decision.explain()
    decision, attempt = await router.admit(req("strict", "default"))
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 429
    assert waiting(router) == 0
    task = asyncio.ensure_future(router.admit(req("lax", "batch")))
    if window_s == 0:
        decision, attempt = await asyncio.wait_for(task, 2)
        assert attempt is not None, decision.explain()
        return
    await until(lambda: waiting(router) == 1)
    await asyncio.sleep(0.6)  # two periodic re-checks: still held
    assert not task.done()
    assert router.flow is not None
    why = router.flow.should_wait(req("asked", "batch"), await router.place(req("asked", "batch")))
    assert why is not None and why.saturation is not None
    assert why.saturation.detail.startswith("held for band 'default': placed on "), why.saturation.detail
    assert "it would leave no engine where that band's next request" in why.saturation.detail
    await scraped(store, 20)
    decision, attempt = await asyncio.wait_for(task, 3)
    assert attempt is not None, decision.explain()


async def test_the_anti_starvation_rule_still_reaches_a_lax_class_held_for_a_strict_one() -> None:
    """`batch` with `aged_after_s: 0.5`: held for `default` as above, but once it has waited 0.5 s it is placed
    on the loaded fleet (the documented aged share, not starvation until the window closes)."""
    flow = {"classes": {"default": {"max_wait_s": 0.2}, "batch": {"max_wait_s": 5, "aged_after_s": 0.5}}}
    router, _ = await loaded(flow, waiting=100)
    decision, _ = await router.admit(req("strict", "default"))
    assert decision.rejection is not None and decision.rejection.status == 429
    started = time.monotonic()
    decision, attempt = await asyncio.wait_for(router.admit(req("lax", "batch")), 3)
    assert attempt is not None, decision.explain()
    assert time.monotonic() - started >= 0.5
