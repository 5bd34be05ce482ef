"""GPU power as NVIDIA's DCGM exporter names it (engines.md 7.2, ``dcgm-exporter:etc/default-counters.csv``).

The names may appear on the engine's own /metrics page (the simulated fleet exposes them there) or on a separate
DCGM exporter (conventionally port 9400). One series per GPU: an engine spanning several GPUs draws their sum.
"""

from __future__ import annotations

from kvstate.engines.prom import MetricSamples

POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
"""Gauge, watts."""
TOTAL_ENERGY_CONSUMPTION = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
"""Counter, millijoules since boot."""

MILLIJOULES_PER_JOULE = 1000.0

NAMES = frozenset({POWER_USAGE, TOTAL_ENERGY_CONSUMPTION})


def power_watts(samples: MetricSamples) -> float | None:
    return samples.gauge_sum(POWER_USAGE)


def energy_joules(samples: MetricSamples) -> float | None:
    millijoules = samples.counter(TOTAL_ENERGY_CONSUMPTION)
    return None if millijoules is None else millijoules / MILLIJOULES_PER_JOULE
