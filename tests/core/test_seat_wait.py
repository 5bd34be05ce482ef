"""The seat wait (cognitora/placement/seat_wait.py): an engine whose seats are all taken admits a new request only
when running ones finish, at the times their ages say; the tenure learned from the lifecycle
(cognitora/seat_tenure.py). llama.cpp's seats from /slots: tests/kvstate/test_engine_pulls.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.placement import FleetState, place
from cognitora.placement.seat_wait import departure_wait_s, engine_clock_rate, seat_wait_s
from cognitora.placement.state import SeatProgress
from cognitora.request import RouteRequest
from cognitora.seat_tenure import MIN_SAMPLES, PRIOR_VARIABILITY, SeatTenure
from kvstate.memory_store import MemoryStore
from kvstate.prompt import PromptKeys
from kvstate.store import EndpointSnapshot, InFlight, PrefixMatch

NOW = 1_000_000.0
BLOCK = 16
A, B = "127.0.0.1:8001", "127.0.0.1:8002"


def fleet(*, seats: int | None = 256, **top: Any) -> CognitoraConfig:
    cost = {} if seats is None else {"cost": {"max_num_seqs": seats}}
    endpoints = [{"url": f"http://{e}", **cost} for e in (A, B)]
    data: dict[str, Any] = {"models": [{"name": "m", "block_size": BLOCK, "endpoints": endpoints}], **top}
    return config_from_dict(data)


def keys(tokens: int, first_key: int = 1) -> PromptKeys:
    return PromptKeys(
        keys=list(range(first_key, first_key + tokens // BLOCK)), prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK
    )


def snap(endpoint: str, **fields: Any) -> EndpointSnapshot:
    return EndpointSnapshot(endpoint=endpoint, last_seen=NOW - 0.5, **fields)


def cohort(n: int, age_s: float, tenure_s: float = 15.0, variability: float = 0.0) -> SeatProgress:
    return SeatProgress(tuple(age_s for _ in range(n)), tenure_s, variability)


def score(decision: Any, endpoint: str) -> Any:
    return next(c for c in decision.candidates if c.endpoint == endpoint)


# -- the departure schedule -----------------------------------------------------------------------------------------


def test_without_ages_departures_follow_littles_law() -> None:
    assert departure_wait_s(4, 40, 30.0, None) == pytest.approx(3.0)


def test_a_cohort_that_took_its_seats_together_leaves_together() -> None:
    # 256 requests took their seats 6 s ago and hold them 15 s: nobody leaves for 9 s. Little's law said 0.06 s.
    assert departure_wait_s(1, 256, 15.0, cohort(256, 6.0)) == pytest.approx(9.0)
    assert departure_wait_s(1, 256, 15.0, None) == pytest.approx(15.0 / 256)


def test_evenly_spread_ages_agree_with_littles_law() -> None:
    ages = SeatProgress(tuple(15.0 * i / 100 for i in range(100)), 15.0, 0.0)
    for k in (1, 10, 50, 100):
        assert departure_wait_s(k, 100, 15.0, ages) == pytest.approx(k * 15.0 / 100, abs=0.16)


def test_beyond_one_round_of_seats_each_round_takes_a_tenure() -> None:
    # 2 seat holders 10 s into a 15 s tenure: the 3rd departure is the first of the next round's.
    assert departure_wait_s(3, 2, 15.0, cohort(2, 10.0)) == pytest.approx(15.0 + 5.0)


def test_ages_say_nothing_when_service_times_are_exponential() -> None:
    # Squared coefficient of variation 1: Poisson departures, Little's law whatever the ages.
    assert departure_wait_s(1, 256, 15.0, cohort(256, 6.0, variability=1.0)) == pytest.approx(15.0 / 256)
    half = departure_wait_s(1, 256, 15.0, cohort(256, 6.0, variability=0.5))
    assert half == pytest.approx(0.5 * 9.0 + 0.5 * 15.0 / 256)


def test_the_gateways_own_holders_stand_for_all_of_them() -> None:
    # The engine runs 200; this gateway holds 2 of the seats (ages 14 and 2 s of 15): the 100th departure is the
    # median residual, the first is the oldest's.
    two = SeatProgress((14.0, 2.0), 15.0, 0.0)
    assert departure_wait_s(1, 200, 15.0, two) == pytest.approx(1.0)
    assert departure_wait_s(150, 200, 15.0, two) == pytest.approx(13.0)


def test_before_a_tenure_is_measured_ages_are_read_on_the_engines_clock() -> None:
    # Nothing has finished yet: the gateway's ages (60 s) are 6 s on an engine whose clock runs at 0.1 of it (the
    # simulator at time scale 0.1), 9 s before the 15 s service ends.
    ramp = SeatProgress(tuple(60.0 for _ in range(256)), None, 0.0)
    assert departure_wait_s(1, 256, 15.0, ramp, clock_rate=0.1) == pytest.approx(9.0)
    # Read as gateway seconds they would be past the service time: the seats would look free at once.
    assert departure_wait_s(1, 256, 15.0, ramp, clock_rate=1.0) == pytest.approx(0.0)


def test_only_a_declared_clock_rate_is_used_a_learned_one_is_not() -> None:
    # The scraper's estimate reads every running request as decoding: under prefill-heavy load a real engine's
    # read 0.4-0.6, which flow control would have turned into waits twice their bound.
    assert engine_clock_rate(snap(A, clock_rate=1.3)) == 1.0
    assert engine_clock_rate(snap(A, clock_rate=None)) == 1.0
    assert engine_clock_rate(snap(A, clock_rate=0.5)) == 1.0
    assert engine_clock_rate(snap(A, clock_rate=0.1, clock_declared=True)) == pytest.approx(0.1)
    assert engine_clock_rate(None) == 1.0


def test_a_declared_clock_rate_is_exact_even_near_one() -> None:
    # The simulator at time scale 0.7 says so (kvstate.engines.declared_clock): not an estimate's noise.
    assert engine_clock_rate(snap(A, clock_rate=0.7, clock_declared=True)) == pytest.approx(0.7)
    assert engine_clock_rate(snap(A, clock_rate=0.7)) == 1.0


def test_no_seat_wait_while_a_seat_is_free_or_the_seats_are_unknown() -> None:
    young = cohort(256, 1.0)
    assert seat_wait_s(256, InFlight(requests=255), None, 15.0, young) == 0.0
    assert seat_wait_s(None, InFlight(requests=999), None, 15.0, young) == 0.0
    assert seat_wait_s(256, InFlight(requests=999), None, 0.0, young) == 0.0  # no service time learned
    # The router's count fills them before the engine shows it: the 257th waits for the first departure.
    assert seat_wait_s(256, InFlight(requests=256), snap(A, running=200), 15.0, young) == pytest.approx(14.0)
    # Traffic that bypassed the routers shows in the engine's gauges: 256 wait, so this one needs the whole cohort
    # to leave and then one of the next.
    gauges = snap(A, running=256, waiting=256)
    assert seat_wait_s(256, InFlight(requests=10), gauges, 15.0, young) == pytest.approx(14.0 + 15.0)


# -- placement ------------------------------------------------------------------------------------------------------


def test_a_full_engine_holding_the_prefix_loses_to_one_with_a_free_seat() -> None:
    # B holds 6,000 of the 7,200 tokens (0.6 s of prefill saved) but its 256 seats are taken by requests 6 s into
    # 15 s of service: the next one starts in 9 s. A has a seat free.
    state = FleetState(
        NOW,
        matches={B: _cached(6000)},
        inflight={A: InFlight(requests=200), B: InFlight(requests=256)},
        snapshots={A: snap(A, running=200, mean_service_s=15.0), B: snap(B, running=250, mean_service_s=15.0)},
        seat_progress={A: cohort(200, 6.0), B: cohort(256, 6.0)},
    )
    decision = place(RouteRequest(model="m", prompt="x"), keys(7200), fleet(), state)
    assert decision.endpoint == A, decision.explain()
    assert score(decision, B).slot_wait_s == pytest.approx(9.0)
    assert score(decision, A).slot_wait_s == 0.0
    assert "slot wait" in decision.explain()
    # Off, or with no seat count known, the prefix wins as before.
    assert place(RouteRequest(model="m", prompt="x"), keys(7200), fleet(seats=None), state).endpoint == B
    off = fleet(cost_model={"seat_wait_weight": 0.0})
    assert place(RouteRequest(model="m", prompt="x"), keys(7200), off, state).endpoint == B


SHEDDABLE = {"priorities": {"default": {"ttft_slo_s": 2.0, "sheddable": True}}}


def test_a_sheddable_class_is_refused_while_every_seat_is_held_by_a_young_cohort() -> None:
    # 270 in flight on each engine's 256 seats: 14 ahead, so the 15th departure.
    full = {e: InFlight(requests=270) for e in (A, B)}
    snaps = {e: snap(e, running=256, mean_service_s=15.0) for e in (A, B)}
    req = RouteRequest(model="m", prompt="x")
    young = FleetState(NOW, inflight=full, snapshots=snaps, seat_progress={A: cohort(256, 6.0), B: cohort(256, 7.0)})
    decision = place(req, keys(512), fleet(placement=SHEDDABLE), young)
    assert decision.rejection is not None and decision.rejection.status == 429, decision.explain()
    # B's cohort is 7 s into its 15: 8 s to the first departure, 6.1 s past the 2 s SLO.
    assert decision.rejection.retry_after_s == 7
    # Little's law alone (no ages) puts 15 departures 0.9 s away and admits it, to wait 8 s.
    blind = place(req, keys(512), fleet(placement=SHEDDABLE), FleetState(NOW, inflight=full, snapshots=snaps))
    assert blind.rejection is None and score(blind, blind.endpoint).slot_wait_s == pytest.approx(15 * 15.0 / 256)
    # With the cohort near its end the seats free in time, and the request is placed.
    old = FleetState(NOW, inflight=full, snapshots=snaps, seat_progress={A: cohort(256, 14.5), B: cohort(256, 14.9)})
    placed = place(req, keys(512), fleet(placement=SHEDDABLE), old)
    assert placed.endpoint == B and placed.rejection is None, placed.explain()


def _cached(tokens: int) -> PrefixMatch:
    return PrefixMatch(blocks=tokens // BLOCK, weighted_blocks=tokens / BLOCK)


# -- the tenure, learned from the lifecycle -------------------------------------------------------------------------


def test_tenure_needs_samples_and_measures_its_spread() -> None:
    tenure = SeatTenure()
    for _ in range(MIN_SAMPLES - 1):
        tenure.observe(A, 15.0)
    assert tenure.tenure_s(A) is None and tenure.variability(A) == PRIOR_VARIABILITY
    tenure.observe(A, 15.0)
    assert tenure.tenure_s(A) == pytest.approx(15.0) and tenure.variability(A) == pytest.approx(0.0)
    for seconds in (1.0, 29.0) * 20:
        tenure.observe(B, seconds)
    assert tenure.variability(B) == pytest.approx(14.0**2 / 15.0**2, rel=0.1)


def test_tenure_follows_longer_and_shorter_answers() -> None:
    tenure = SeatTenure()
    for _ in range(40):
        tenure.observe(A, 2.0)
    for _ in range(150):  # answers grew long (about the last 20 count)
        tenure.observe(A, 20.0)
    assert tenure.tenure_s(A) == pytest.approx(20.0, rel=0.01)
    for _ in range(150):  # and short again
        tenure.observe(A, 2.0)
    assert tenure.tenure_s(A) == pytest.approx(2.0, rel=0.05)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


async def test_the_router_times_its_seat_holders_and_predicts_when_a_seat_frees() -> None:
    """Through the lifecycle: requests whose first token came back hold a seat until they finish; the router learns
    how long (10 s here, on its own clock) and, with the engine's 2 seats taken by requests 4 s old, predicts the
    next one waits the 6 s until the first of them finishes, in the engine's units (mean_service_s 10 s)."""
    clock = Clock()
    store = MemoryStore()
    config = fleet(seats=2, placement={"recompute_weight": 0.0, "priorities": {"default": {"ttft_slo_s": 60}}})
    router = Router(config, store, clock=clock)
    for e in (A, B):
        await store.put_snapshot(EndpointSnapshot(endpoint=e, last_seen=NOW, mean_service_s=10.0))

    async def admit(i: int, endpoint: str) -> Any:
        req = RouteRequest(model="m", prompt=f"prompt {i}", candidates=(endpoint,), request_id=f"r{i}")
        decision, attempt = await router.admit(req)
        assert attempt is not None and decision.endpoint == endpoint
        return attempt

    for i in range(MIN_SAMPLES):
        attempt = await admit(i, A)
        attempt.first_token()
        await asyncio.sleep(0)
        clock.now += 10.0
        attempt.finish(Outcome(OutcomeKind.COMPLETED))
        await attempt.settled()
    for e in (A, B):
        await store.put_snapshot(EndpointSnapshot(endpoint=e, last_seen=clock.now, mean_service_s=10.0))
    holders = [await admit(100 + i, A) for i in range(2)]
    for attempt in holders:
        attempt.first_token()
    await asyncio.sleep(0)
    clock.now += 4.0

    req = RouteRequest(model="m", prompt="the next one", request_id="next")
    decision = await router.place(req)
    assert decision.endpoint == B, decision.explain()
    assert score(decision, A).slot_wait_s == pytest.approx(6.0)
    assert score(decision, B).slot_wait_s == 0.0


async def test_on_a_ramp_nothing_has_finished_and_the_engines_clock_reads_the_ages() -> None:
    """The seats fill before any request finishes (a ramp of load): no tenure is measured yet, so the holders' ages
    (8 gateway seconds) are read on the engine's clock (0.25: 2 engine seconds) against its 10 s of service: 8 s to
    the first departure, blended half and half (the prior variability) with Little's law's 10 / 2 = 5 s."""
    clock = Clock()
    store = MemoryStore()
    config = fleet(seats=2, placement={"recompute_weight": 0.0, "priorities": {"default": {"ttft_slo_s": 60}}})
    router = Router(config, store, clock=clock)
    holders = []
    for i in range(2):
        req = RouteRequest(model="m", prompt=f"prompt {i}", candidates=(A,), request_id=f"r{i}")
        _, attempt = await router.admit(req)
        assert attempt is not None
        attempt.first_token()
        holders.append(attempt)
    await asyncio.sleep(0)
    clock.now += 8.0
    for e in (A, B):
        await store.put_snapshot(
            EndpointSnapshot(endpoint=e, last_seen=clock.now, mean_service_s=10.0, clock_rate=0.25, clock_declared=True)
        )
    decision = await router.place(RouteRequest(model="m", prompt="the next one", request_id="next"))
    assert decision.endpoint == B, decision.explain()
    assert score(decision, A).slot_wait_s == pytest.approx(0.5 * 8.0 + 0.5 * 5.0)
