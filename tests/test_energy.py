"""Energy per token, learned from one endpoint's power meter and token counters (``kvstate.energy``)."""

from __future__ import annotations

import pytest

from kvstate.energy import EnergyEstimator
from kvstate.store import EndpointSnapshot


def energy_snap(t: float, joules: float, tokens: float, watts: float, running: int = 1) -> EndpointSnapshot:
    return EndpointSnapshot(
        "e",
        last_seen=t,
        running=running,
        power_watts=watts,
        energy_joules=joules,
        prompt_tokens_total=tokens * 0.75,
        generation_tokens_total=tokens * 0.25,
    )


def test_energy_estimator_learns_marginal_joules_per_token() -> None:
    est = EnergyEstimator(min_tokens=256, smoothing=1.0)
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


def test_energy_estimator_smooths_and_ignores_an_engine_without_counters() -> None:
    est = EnergyEstimator(min_tokens=100, smoothing=0.5)
    est.observe(energy_snap(0.0, 1000.0, 1000.0, watts=0.0))
    est.observe(energy_snap(1.0, 1100.0, 2000.0, watts=0.0))  # 0.1 J/token
    est.observe(energy_snap(2.0, 1400.0, 3000.0, watts=0.0))  # 0.3 J/token: halfway there
    assert est.joules_per_token == pytest.approx(0.2)
    blind = EnergyEstimator()
    blind.observe(EndpointSnapshot("e", last_seen=1.0, energy_joules=100.0))  # no token counters
    blind.observe(EndpointSnapshot("e", last_seen=2.0, energy_joules=200.0))
    assert blind.joules_per_token is None
