"""Flow control by the classes' TTFT objectives, through ``Router.admit``: by default a request waits in the
gateway while leaving could still meet its class's objective, and gets 429 with Retry-After once it could not
(an explicit ``max_wait_s`` overrides that); and a lower band is committed to an engine only where a higher band's
next request would still find room within its objective (docs/flow_control.md, "Leaving the queue" and "Strict
priority at admission")."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from cognitora.config import config_from_dict
from cognitora.core.lifecycle import Attempt
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.decision import Decision
from cognitora.identity import Identity, IdentitySource
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot
from tests.support.flow_core import take_seats, until, waiting

A, B = "127.0.0.1:8001", "127.0.0.1:8002"
RATE = 10_000.0
"""Prefill tokens/s of both engines."""


def req(rid: str, priority: str, words: int = 0) -> RouteRequest:
    who = Identity(priority=priority, source=IdentitySource.CALLER)
    prompt = f"prompt of {rid} " + "word " * words  # unique: nothing cached
    return RouteRequest(model="m", prompt=prompt, request_id=rid, identity=who)


async def seats_taken(
    priorities: dict[str, Any], flow: dict[str, Any], clock_rate: float | None = None
) -> tuple[Router, list[Attempt]]:
    """Two engines of one seat each, both taken by the router's own dispatches (10 s of service each).
    ``clock_rate``: engine seconds per gateway second the engine declares (a time-scaled simulator's)."""
    endpoints = [{"url": f"http://{e}", "cost": {"max_num_seqs": 1}} for e in (A, B)]
    model = {"name": "m", "endpoints": endpoints}
    config = config_from_dict({"models": [model], "placement": {"priorities": priorities}, "flow_control": flow})
    store = MemoryStore()
    for e in (A, B):
        snap = EndpointSnapshot(
            endpoint=e,
            last_seen=time.time(),
            mean_service_s=10.0,
            prefill_tokens_per_s=RATE,
            clock_rate=clock_rate,
            clock_declared=clock_rate is not None,
        )
        await store.put_snapshot(snap)
    router = Router(config, store)
    return router, await take_seats(router, 2)


LAX = {"default": {"ttft_slo_s": 0.5}, "batch": {"ttft_slo_s": 0.8, "sheddable": True}}


async def admit_timed(router: Router, request: RouteRequest) -> tuple[Decision, Attempt | None, float, float]:
    """``router.admit`` with the wait bound the core gave the request (what Envoy extends its timeout by) and the
    seconds it took. The bound is asserted exactly; the wall time only loosely (a loaded machine stretches it)."""
    bounds: list[float] = []

    async def on_wait(max_wait_s: float) -> None:
        bounds.append(max_wait_s)

    started = time.monotonic()
    decision, attempt = await asyncio.wait_for(router.admit(request, on_wait=on_wait), 10)
    assert len(bounds) == 1, bounds
    return decision, attempt, bounds[0], time.monotonic() - started


async def test_by_default_a_request_waits_while_it_could_meet_its_objective_then_gets_429() -> None:
    """Every seat stays taken: a short `batch` request (its own TTFT a few ms) waits ~its 0.8 s objective, not a
    fixed 10 s, then gets 429 with Retry-After saying why."""
    router, _ = await seats_taken(LAX, {})
    decision, attempt, bound, waited = await admit_timed(router, req("r", "batch"))
    assert attempt is None and decision.rejection is not None
    assert decision.rejection.status == 429 and (decision.rejection.retry_after_s or 0) >= 1
    assert "would miss class 'batch''s 0.8 s TTFT objective" in decision.rejection.message, decision.explain()
    assert 0.6 <= bound < 0.8, bound
    assert bound <= waited < 5, waited  # not the old fixed 10 s
    assert router.flow is not None
    assert router.flow.telemetry.waits["batch", "anonymous", "timeout"].count == 1


async def test_a_request_that_can_still_make_it_is_placed_when_a_seat_frees() -> None:
    router, holders = await seats_taken(LAX, {})
    task = asyncio.ensure_future(router.admit(req("r", "batch")))
    await until(lambda: waiting(router) == 1)
    holders[0].finish(Outcome(OutcomeKind.COMPLETED))
    decision, attempt = await asyncio.wait_for(task, 2)
    assert attempt is not None and decision.endpoint == holders[0].endpoint, decision.explain()


async def test_the_wait_is_shorter_by_the_requests_own_predicted_ttft() -> None:
    """A 5,000-word `batch` prompt (~0.7 s of its own prefill) may wait only what its 0.8 s objective leaves."""
    router, _ = await seats_taken(LAX, {})
    decision, attempt, bound, waited = await admit_timed(router, req("r", "batch", words=5_000))
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 429
    own = min(c.predicted_ttft_s - c.slot_wait_s - c.queued_prefill_tokens / RATE for c in decision.candidates)
    assert 0.3 < own < 0.78, decision.explain()
    assert bound == pytest.approx(0.8 - own, abs=0.05), (bound, own)
    assert bound <= waited < 5, waited


async def test_a_prompt_too_long_for_its_objective_waits_at_most_the_objective() -> None:
    """Its own prefill (~2 s) misses the 0.8 s objective on any engine: the objective bounds its wait."""
    router, _ = await seats_taken(LAX, {})
    decision, attempt, bound, waited = await admit_timed(router, req("r", "batch", words=20_000))
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 429
    assert bound == pytest.approx(0.8), bound
    assert bound <= waited < 5, waited


async def test_an_explicit_max_wait_overrides_the_objective() -> None:
    router, _ = await seats_taken(LAX, {"classes": {"batch": {"max_wait_s": 0.2}}})
    decision, attempt, bound, waited = await admit_timed(router, req("r", "batch"))
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 429
    assert "max_wait_s of class 'batch'" in decision.rejection.message
    assert bound == 0.2
    assert bound <= waited < 5, waited


async def test_on_a_slower_engine_clock_the_wait_follows_the_objective_in_engine_seconds() -> None:
    """A time-scaled simulator runs 4 gateway seconds per engine second (``clock_rate`` 0.25): the objective and
    the predictions are engine seconds, so the queue may hold the request 4x its bound in gateway seconds (0.8 s
    of objective: ~3.2 s), and a seat freed after 0.6 s of wall time (0.15 engine seconds of the objective used)
    still places it. On the gateway's clock it would have been shed at 0.8 s, or held as too late at 0.6."""
    router, holders = await seats_taken(LAX, {}, clock_rate=0.25)
    bounds: list[float] = []

    async def on_wait(max_wait_s: float) -> None:
        bounds.append(max_wait_s)

    task = asyncio.ensure_future(router.admit(req("r", "batch"), on_wait=on_wait))
    await until(lambda: waiting(router) == 1)
    assert len(bounds) == 1 and 2.4 <= bounds[0] < 3.2, bounds
    started = time.monotonic()
    await until(lambda: time.monotonic() - started >= 0.6)  # past 0.8 s of gateway time since it queued
    holders[0].finish(Outcome(OutcomeKind.COMPLETED))
    decision, attempt = await asyncio.wait_for(task, 3)
    assert attempt is not None and decision.endpoint == holders[0].endpoint, decision.explain()


async def test_on_a_slower_engine_clock_the_margin_compares_engine_seconds() -> None:
    """First tokens 4 gateway seconds after dispatch on a 0.25 clock are 1 engine second: against a prediction of
    1 s that is on time (margin 1), not 4x late."""
    router, holders = await seats_taken(TIERED, {"margin": {"min_samples": 2, "min_predicted_s": 0}}, 0.25)
    assert router.flow is not None
    flow = router.flow
    for holder in holders:
        holder.decision = replace(holder.decision, predicted_ttft_s=1.0)
        holder.dispatched_at -= 4.0
        holder.first_token()
    await until(lambda: flow.margin.samples == 2)
    assert flow.margin.factor == pytest.approx(1.0, abs=0.01)


TIERED = {"default": {"ttft_slo_s": 2}, "batch": {"ttft_slo_s": 30, "sheddable": True}}
"""A strict class and a lax one, as in bench/flow_bench.py's priority stage."""


async def test_a_lower_band_is_held_where_it_would_leave_the_higher_band_no_room() -> None:
    """`default` sends ~1.1 s prompts. Each engine holds ~1 s of scraped queued prefill (under `default`'s 2 s, so
    the rule before placed `batch` there): a `batch` request there would leave no engine where `default`'s next
    request makes 2 s, so it waits at the gateway; once an engine's prefill drains it is placed."""
    endpoints = [{"url": f"http://{e}"} for e in (A, B)]
    config = config_from_dict(
        {"models": [{"name": "m", "endpoints": endpoints}], "placement": {"priorities": TIERED}, "flow_control": {}}
    )
    store = MemoryStore()

    async def scraped(waiting_requests: int) -> None:  # x ~500 tokens each (placement's prior): 20 are ~1 s
        for e in (A, B):
            snap = EndpointSnapshot(
                endpoint=e, last_seen=time.time(), waiting=waiting_requests, prefill_tokens_per_s=RATE
            )
            await store.put_snapshot(snap)

    await scraped(0)
    router = Router(config, store)
    decision, strict = await router.admit(req("strict", "default", words=11_000))
    assert strict is not None, decision.explain()
    strict.first_token()  # its prefill is done: its engine holds only what is scraped
    await scraped(20)
    lax = asyncio.ensure_future(router.admit(req("lax", "batch")))
    await until(lambda: waiting(router) == 1)
    assert router.flow is not None
    asked = req("asked", "batch")
    why = router.flow.should_wait(asked, await router.place(asked))
    assert why is not None and why.saturation is not None and why.saturation.kind == "priority"
    assert "it would leave no engine where that band's next request" in why.saturation.detail
    assert not lax.done()
    await scraped(0)
    decision, attempt = await asyncio.wait_for(lax, 3)  # the periodic re-check finds an idle engine
    assert attempt is not None, decision.explain()
    strict.finish(Outcome(OutcomeKind.COMPLETED))


async def test_without_an_active_higher_band_the_lower_band_is_placed_on_the_loaded_fleet() -> None:
    """Nothing of `default` seen: `batch` is judged by its own 30 s objective alone."""
    endpoints = [{"url": f"http://{e}"} for e in (A, B)]
    config = config_from_dict(
        {"models": [{"name": "m", "endpoints": endpoints}], "placement": {"priorities": TIERED}, "flow_control": {}}
    )
    store = MemoryStore()
    for e in (A, B):
        snap = EndpointSnapshot(endpoint=e, last_seen=time.time(), waiting=20, prefill_tokens_per_s=RATE)
        await store.put_snapshot(snap)
    router = Router(config, store)
    decision, attempt = await asyncio.wait_for(router.admit(req("lax", "batch")), 2)
    assert attempt is not None, decision.explain()


async def test_the_wait_bound_leaves_room_for_the_measured_prediction_margin() -> None:
    """The engines' first tokens came far later than predicted: the margin (clamped to its 1.5 bound) is what a
    request's own predicted TTFT is multiplied by in its wait bound, 2 s - 1.5 x own instead of 2 s - own (waiting
    that long it would be served late)."""
    router, holders = await seats_taken(TIERED, {"margin": {"min_samples": 2, "min_predicted_s": 0}})
    assert router.flow is not None
    for holder in holders:
        holder.dispatched_at -= 10.0  # its first token 10 s after dispatch, against a prediction of milliseconds
        holder.first_token()
    flow = router.flow
    await until(lambda: flow.margin.samples == 2)
    assert flow.margin.factor == 1.5
    decision, attempt, bound, _ = await admit_timed(router, req("r", "default", words=5_000))
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 429
    own = min(c.predicted_ttft_s - c.slot_wait_s - c.queued_prefill_tokens / RATE for c in decision.candidates)
    assert 0.3 < own < 1.2, decision.explain()
    assert bound == pytest.approx(2.0 - 1.5 * own, abs=0.05), (bound, own)
