"""Team isolation wired into ``Router.admit`` (cognitora/core/flow_gate.py, cognitora/flow/isolation.py): while
another team is active in the band, a team's request that would take the last engine free of its in-flight prefill
waits at the gateway, and goes when its prefill on the other engine is done (a first token, or its estimate).
Two idle engines at 10,000 prefill tokens/s; a "long" prompt is ~3,750 tokens (~0.4 s), a short one ~5."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cognitora.config import config_from_dict
from cognitora.core.lifecycle import Attempt
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.identity import Identity, IdentitySource
from cognitora.metrics.families import RouterFamilies
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot
from tests.support.flow_core import until, waiting

A, B = "127.0.0.1:8001", "127.0.0.1:8002"
PRIORITIES = {"default": {"ttft_slo_s": 2}, "batch": {"ttft_slo_s": 30, "sheddable": True}}


async def fleet(flow: dict[str, Any], engines: tuple[str, ...] = (A, B)) -> Router:
    config = config_from_dict(
        {
            "models": [{"name": "m", "endpoints": [{"url": f"http://{e}"} for e in engines]}],
            "placement": {"priorities": PRIORITIES},
            "flow_control": flow,
        }
    )
    store = MemoryStore()
    for e in engines:
        await store.put_snapshot(EndpointSnapshot(endpoint=e, last_seen=time.time(), prefill_tokens_per_s=10_000.0))
    return Router(config, store)


def req(rid: str, team: str, words: int = 3_000) -> RouteRequest:
    who = Identity(team=team, priority="default", source=IdentitySource.CALLER)
    return RouteRequest(model="m", prompt=f"{rid} " + "word " * words, request_id=rid, identity=who)  # no shared prefix


def short(rid: str, team: str) -> RouteRequest:
    return replace(req(rid, team), prompt=f"hello from {rid}")


async def placed(router: Router, request: RouteRequest) -> Attempt:
    decision, attempt = await asyncio.wait_for(router.admit(request), 3)
    assert attempt is not None, decision.explain()
    return attempt


async def test_a_teams_second_long_prompt_waits_for_its_first_while_another_team_is_active() -> None:
    router = await fleet({})
    a1 = await placed(router, req("a1", "a"))
    b1 = await placed(router, short("b1", "b"))
    assert b1.endpoint != a1.endpoint  # the engine without a's prefill: the lowest predicted TTFT
    a2 = asyncio.ensure_future(router.admit(req("a2", "a")))
    await until(lambda: waiting(router) == 1, timeout_s=5.0)
    assert router.flow is not None
    asked = req("asked", "a")
    why = router.flow.should_wait(asked, await router.place(asked))
    assert why is not None and why.saturation is not None
    assert why.saturation.detail.startswith(
        f"held for team isolation: team:b sent a request lately in band 'default', and placing this on {b1.endpoint} "
        f"would leave no engine free of team:a's in-flight prefill ({a1.endpoint}: 1 in flight, done in ~"
    )
    await until(lambda: router.flow is not None and router.flow.controller.snapshot().held_tries >= 1, timeout_s=5.0)
    b2 = await placed(router, short("b2", "b"))  # not behind a's held request: placed at once, not queued
    assert b2.endpoint == b1.endpoint and not a2.done()
    a1.first_token()  # a's first prefill is done: its engine is free of a again
    decision, attempt = await asyncio.wait_for(a2, 3)
    assert attempt is not None, decision.explain()
    registry = CollectorRegistry()
    registry.register(RouterFamilies(router))
    page = generate_latest(registry).decode()
    assert 'cognitora_flow_holds_total{at="admission",reason="isolation"} 2.0' in page, page  # a2, and "asked"
    assert 'cognitora_flow_holds_total{at="queue",reason="isolation"}' in page, page
    snap = router.flow.controller.snapshot()
    assert sum(n for b in snap.bands for n in b.dispatched.values()) == 1  # a2 only: b2 went past it


async def test_another_teams_newcomer_goes_past_a_request_held_for_isolation_before_the_queue_tries_it() -> None:
    """a2 is held for isolation at admission and joins the queue; the dispatcher has not tried it since (no
    wake-up: the periodic re-check is 5 s away). b2 goes past it at once, placed without queueing: a2's admission
    was its last try, and it held a2 for a2's own sake. Before, b2 queued behind a2 until the dispatcher's next
    wake-up (its ARRIVAL), then was placed again after a2's try: +3-10 ms on ~15% of the light team's requests on
    the flow bench (docs/flow_control.md, "Team isolation")."""
    router = await fleet({"recheck_interval_s": 5})
    a1 = await placed(router, req("a1", "a"))
    b1 = await placed(router, short("b1", "b"))
    a2 = asyncio.ensure_future(router.admit(req("a2", "a")))
    await until(lambda: waiting(router) == 1, timeout_s=5.0)
    assert router.flow is not None
    b2 = await placed(router, short("b2", "b"))
    assert b2.endpoint == b1.endpoint != a1.endpoint
    controller = router.flow.controller
    assert controller.counters.queued["default"] == 1  # a2 only: b2 never queued
    assert controller.snapshot().held_tries == 0  # nor did it wait for a2 to be tried
    a1.first_token()
    decision, attempt = await asyncio.wait_for(a2, 3)
    assert attempt is not None, decision.explain()


@pytest.mark.parametrize("isolation", [{"enabled": False}, None])
async def test_alone_or_turned_off_a_team_uses_every_engine(isolation: dict[str, Any] | None) -> None:
    """Alone (no other team active): both of a's prompts are placed at once, one per engine. Turned off: the same
    with team b active."""
    router = await fleet({} if isolation is None else {"isolation": isolation})
    a1 = await placed(router, req("a1", "a"))
    if isolation is not None:
        await placed(router, short("b1", "b"))
    a2 = await placed(router, req("a2", "a"))
    assert {a1.endpoint, a2.endpoint} == {A, B}
    assert router.flow is not None and ("admission", "isolation") not in router.flow.telemetry.holds


async def test_a_fleet_of_one_engine_is_never_held() -> None:
    router = await fleet({}, engines=(A,))
    await placed(router, req("a1", "a"))
    await placed(router, short("b1", "b"))
    a2 = await placed(router, req("a2", "a"))
    assert a2.endpoint == A


async def test_an_aged_request_is_not_held_by_isolation() -> None:
    """`aged_after_s: 0.3`: a2 is held for isolation, then placed once it has waited 0.3 s, though a1's prefill is
    still in flight (no first token)."""
    router = await fleet({"classes": {"default": {"max_wait_s": 5, "aged_after_s": 0.3}}})
    a1 = await placed(router, req("a1", "a"))
    await placed(router, short("b1", "b"))
    started = time.monotonic()
    a2 = await placed(router, req("a2", "a"))
    assert time.monotonic() - started >= 0.3
    assert a1.outcome is None and a1.first_token_at is None and a2.endpoint != a1.endpoint


async def test_without_a_first_token_the_prefill_ends_at_its_estimate() -> None:
    """a1 (~1 s predicted) never reports a first token: with `prefill_margin: 1`, its engine is free of a again
    ~1 s after its dispatch, and a2 goes then (the queue's periodic re-check). An explicit wait: a2 must outwait
    a1's estimate (~1 s), longer than what its 2 s objective leaves its own ~1.2 s (0.8 s, then 429)."""
    router = await fleet({"isolation": {"prefill_margin": 1.0}, "default_max_wait_s": 5})
    a1 = await placed(router, req("a1", "a", words=8_000))
    await placed(router, short("b1", "b"))
    started = time.monotonic()
    a2 = asyncio.ensure_future(router.admit(req("a2", "a", words=8_000)))
    await until(lambda: waiting(router) == 1, timeout_s=5.0)
    decision, attempt = await asyncio.wait_for(a2, 4)
    assert attempt is not None, decision.explain()
    assert time.monotonic() - started >= 0.5 * a1.decision.predicted_ttft_s
    assert a1.outcome is None and a1.first_token_at is None


async def test_a_finished_prefill_frees_its_engine_for_its_team() -> None:
    router = await fleet({})
    a1 = await placed(router, req("a1", "a"))
    await placed(router, short("b1", "b"))
    a2 = asyncio.ensure_future(router.admit(req("a2", "a")))
    await until(lambda: waiting(router) == 1, timeout_s=5.0)
    a1.finish(Outcome(OutcomeKind.COMPLETED))
    decision, attempt = await asyncio.wait_for(a2, 3)
    assert attempt is not None, decision.explain()


def in_batch(request: RouteRequest) -> RouteRequest:
    return replace(request, identity=replace(request.identity, priority="batch"))


async def test_a_team_of_a_lower_band_is_not_held_for_an_active_higher_bands_team() -> None:
    """Team c is active in `default`, team d in `batch` has a long prefill in flight on one engine: d's second
    long prompt takes the other engine at once (the engines hold far less than default's 2 s objective, so the
    priority hold lets it go too). Isolation is within a band: across bands an engine kept free of d for c's next
    request would sit idle while d waits."""
    router = await fleet({})
    d1 = await placed(router, in_batch(req("d1", "d")))
    c1 = await placed(router, short("c1", "c"))
    assert c1.endpoint != d1.endpoint
    d2 = await placed(router, in_batch(req("d2", "d")))
    assert d2.endpoint != d1.endpoint and d1.first_token_at is None  # d1's prefill is still in flight
    assert router.flow is not None and ("admission", "isolation") not in router.flow.telemetry.holds


async def test_backlogged_teams_do_not_keep_an_engine_idle_for_each_other() -> None:
    """a and b each have a long prefill in flight on engine A (B was down when they came), B is back and idle. a2
    waits (B is the last engine free of a's prefill, and b is active). b2 would take that same last engine free of
    b's prefill; before, it waited too, each team keeping B free for the other while B sat idle. Now b2 is placed on
    B at once: the one it is held for, a, waits here and would itself be held from B."""
    router = await fleet({})
    assert router.flow is not None
    store = router.store
    await store.put_snapshot(EndpointSnapshot(endpoint=B, last_seen=time.time(), healthy=False))
    a1 = await placed(router, req("a1", "a"))
    b1 = await placed(router, req("b1", "b"))
    assert a1.endpoint == b1.endpoint == A  # one eligible engine: never held
    await store.put_snapshot(EndpointSnapshot(endpoint=B, last_seen=time.time(), prefill_tokens_per_s=10_000.0))
    a2 = asyncio.ensure_future(router.admit(req("a2", "a")))
    await until(lambda: waiting(router) == 1, timeout_s=5.0)
    await until(lambda: router.flow is not None and router.flow.controller.snapshot().held_tries >= 1, timeout_s=5.0)
    b2 = await placed(router, req("b2", "b"))
    assert b2.endpoint == B and not a2.done()  # no engine idle while a waits: b took it
    assert a1.first_token_at is None and b1.first_token_at is None
    a1.first_token()  # a's prefill on A is done: no engine holds a's prefill, and a2 goes
    decision, attempt = await asyncio.wait_for(a2, 3)
    assert attempt is not None, decision.explain()
