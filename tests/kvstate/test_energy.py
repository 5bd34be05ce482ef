"""Energy per token, learned from one endpoint's power meter and token counters (``kvstate.energy``)."""

from __future__ import annotations

import math

import pytest

from kvstate.energy import EnergyEstimator
from kvstate.store import EndpointSnapshot


def energy_snap(
    t: float, joules: float, tokens: float, watts: float, running: int = 1, hits: float | None = None
) -> EndpointSnapshot:
    return EndpointSnapshot(
        "e",
        last_seen=t,
        running=running,
        power_watts=watts,
        energy_joules=joules,
        prompt_tokens_total=tokens * 0.75,
        generation_tokens_total=tokens * 0.25,
        prefix_cache_hits_total=hits,
    )


def test_energy_estimator_learns_marginal_joules_per_token() -> None:
    est = EnergyEstimator(min_tokens=256)
    est.observe(energy_snap(0.0, 5000.0, 1000.0, watts=100.0, running=0))  # idle: 100 W
    est.observe(energy_snap(0.0, 5000.0, 1000.0, watts=100.0, running=0))  # the same snapshot read twice
    assert est.joules_per_token is None  # nothing learned before a window closes
    # 10 s later: 20,000 tokens more, 1,000 J of idle draw plus 0.05 J/token of work
    est.observe(energy_snap(10.0, 5000.0 + 1000.0 + 1000.0, 21000.0, watts=300.0))
    assert est.joules_per_token == pytest.approx(0.05)
    est.observe(energy_snap(11.0, 7050.0, 21100.0, watts=300.0))  # under min_tokens: wait for a longer window
    assert est.joules_per_token == pytest.approx(0.05)
    est.observe(energy_snap(20.0, 10.0, 50.0, watts=300.0))  # counters went backwards: engine restarted
    assert est.joules_per_token == pytest.approx(0.05)


def test_cache_hits_are_not_counted_as_tokens_computed() -> None:
    # Placement charges J/token x (uncached prompt + generated tokens), so the rate is learned per token computed:
    # 12,000 tokens served, 8,000 of them prompt tokens read from the prefix cache, for 200 J of work.
    est = EnergyEstimator()
    est.observe(energy_snap(0.0, 1000.0, 4000.0, watts=0.0, hits=0.0))
    est.observe(energy_snap(1.0, 1200.0, 16000.0, watts=0.0, hits=8000.0))
    assert est.joules_per_token == pytest.approx(200.0 / 4000.0)


def test_a_prefill_counted_after_its_energy_is_learned_at_its_true_rate() -> None:
    """The prompt counter moves when a prompt's first token is out; its prefill's energy was spent before.

    True rate: 0.05 J/token. The first window holds a 3,840-token prefill's energy (192 J) and the 256 tokens
    generated meanwhile (12.8 J), but counts only those 256; the next one counts the prompt and holds no energy.
    Averaging the two windows' ratios read 0.56 J/token (smoothing 0.3) on the old estimator; the sums divide to
    the true rate."""
    est = EnergyEstimator(min_tokens=256, horizon_tokens=math.inf)
    est.observe(EndpointSnapshot("e", last_seen=0.0, running=1, energy_joules=1000.0, prompt_tokens_total=1.0))
    est.observe(
        EndpointSnapshot(
            "e",
            last_seen=1.0,
            running=1,
            energy_joules=1000.0 + 192.0 + 12.8,  # 0.8 J/token in this window alone
            prompt_tokens_total=1.0,
            generation_tokens_total=256.0,
        )
    )
    est.observe(
        EndpointSnapshot(
            "e",
            last_seen=2.0,
            running=1,
            energy_joules=1000.0 + 192.0 + 12.8,
            prompt_tokens_total=3841.0,
            generation_tokens_total=256.0,
        )
    )
    assert est.joules_per_token == pytest.approx(0.05)


def test_a_hit_counted_before_its_prompt_does_not_restart_the_window() -> None:
    # An engine counts a cache hit when it schedules the prompt and the prompt when its first token is out: between
    # the two, tokens computed step back. That is not a restart, and the window's energy is kept.
    est = EnergyEstimator(min_tokens=100, horizon_tokens=math.inf)
    est.observe(energy_snap(0.0, 1000.0, 4000.0, watts=0.0, hits=0.0))
    est.observe(energy_snap(1.0, 1010.0, 4000.0, watts=0.0, hits=500.0))  # 500 hits, their prompt not counted yet
    assert est.joules_per_token is None
    est.observe(energy_snap(2.0, 1030.0, 5000.0, watts=0.0, hits=500.0))  # the prompt and more: 500 computed
    assert est.joules_per_token == pytest.approx(30.0 / 500.0)


def test_the_sums_weigh_windows_by_their_tokens_and_follow_a_change() -> None:
    est = EnergyEstimator(min_tokens=100, horizon_tokens=math.inf)
    est.observe(energy_snap(0.0, 1000.0, 1000.0, watts=0.0))
    est.observe(energy_snap(1.0, 1100.0, 2000.0, watts=0.0))  # 0.1 J/token over 1,000 tokens
    est.observe(energy_snap(2.0, 1400.0, 5000.0, watts=0.0))  # 0.1 J/token over 3,000 tokens
    est.observe(energy_snap(3.0, 1500.0, 5200.0, watts=0.0))  # 0.5 J/token over 200: a short window weighs little
    assert est.joules_per_token == pytest.approx(500.0 / 4200.0)
    # With a horizon, what was learned fades: after ten horizons at 0.02 J/token, the estimate reads 0.02.
    moving = EnergyEstimator(min_tokens=100, horizon_tokens=1000.0)
    moving.observe(energy_snap(0.0, 1000.0, 0.0 + 1.0, watts=0.0))
    moving.observe(energy_snap(1.0, 1100.0, 1001.0, watts=0.0))
    assert moving.joules_per_token == pytest.approx(0.1)
    joules, tokens = 1100.0, 1001.0
    for t in range(2, 22):
        joules, tokens = joules + 10.0, tokens + 500.0
        moving.observe(energy_snap(float(t), joules, tokens, watts=0.0))
    assert moving.joules_per_token == pytest.approx(0.02, rel=0.01)


def test_an_engine_without_counters_learns_nothing() -> None:
    blind = EnergyEstimator()
    blind.observe(EndpointSnapshot("e", last_seen=1.0, energy_joules=100.0))  # no token counters
    blind.observe(EndpointSnapshot("e", last_seen=2.0, energy_joules=200.0))
    assert blind.joules_per_token is None


def test_an_idle_draw_seen_once_lower_gives_way_to_the_idle_draw_of_late() -> None:
    """The idle draw was the lowest idle reading ever seen: one reading of a GPU in its deepest idle state (before
    its first request; or a meter's dip) stayed the baseline for good, after the engine idled at 100 W between
    requests for hours, and every window's idle draw above it was charged to its tokens (0.87 J/token here
    against 0.05). The baseline is the lowest idle reading of the last ``IDLE_HORIZON_S`` of idle readings."""
    est = EnergyEstimator(min_tokens=256)
    est.observe(energy_snap(0.0, 5000.0, 1000.0, watts=60.0, running=0))  # deep idle, once
    for t in range(10, 410, 10):  # idle again, at 100 W, for nearly 7 minutes
        est.observe(energy_snap(float(t), 5000.0 + 100.0 * t, 1000.0, watts=100.0, running=0))
    # then 20,000 tokens at 0.05 J/token on top of the 100 W the engine draws when idle
    est.observe(energy_snap(410.0, 5000.0 + 100.0 * 410 + 1000.0, 21000.0, watts=300.0))
    assert est.joules_per_token == pytest.approx(0.05)


def test_the_idle_draw_is_the_lowest_idle_reading_not_one_taken_as_work_winds_down() -> None:
    """An idle reading right after work can still hold its draw (a meter averages): the lowest one counts."""
    est = EnergyEstimator(min_tokens=256)
    est.observe(energy_snap(0.0, 5000.0, 1000.0, watts=250.0, running=0))  # just after a request ended
    est.observe(energy_snap(1.0, 5100.0, 1000.0, watts=100.0, running=0))  # idle
    est.observe(energy_snap(2.0, 5200.0, 1000.0, watts=180.0, running=0))  # the meter's lag of the next blip
    est.observe(energy_snap(12.0, 5200.0 + 1000.0 + 1000.0, 21000.0, watts=300.0))  # 10 s: 1,000 J idle + work
    assert est.joules_per_token == pytest.approx(0.05)
