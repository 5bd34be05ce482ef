"""GPU power as NVIDIA's DCGM exporter names it (engines.md 7.2, ``dcgm-exporter:etc/default-counters.csv``).

The names may appear on the engine's own /metrics page (the simulated fleet exposes them there) or on a separate
DCGM exporter or ``cognitora node-agent`` (conventionally port 9400). One series per GPU: an engine spanning
several GPUs draws their sum. A node's exporter shows every GPU of the node; ``only_gpus`` keeps the series of the
GPUs an endpoint uses, named by their ``gpu`` label (the index) or their ``UUID`` label.
"""

from __future__ import annotations

from collections.abc import Collection

from kvstate.engines.prom import MetricSamples

__all__ = ["energy_joules", "gpus_shown", "only_gpus", "power_watts"]

POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
"""Gauge, watts."""
TOTAL_ENERGY_CONSUMPTION = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
"""Counter, millijoules since boot."""

MILLIJOULES_PER_JOULE = 1000.0

NAMES = frozenset({POWER_USAGE, TOTAL_ENERGY_CONSUMPTION})

GPU_LABEL = "gpu"
UUID_LABEL = "UUID"


def only_gpus(samples: MetricSamples, gpus: Collection[str]) -> MetricSamples:
    """The power series of the GPUs named in ``gpus`` (indices as text, or UUIDs); every other sample as it was."""
    wanted = set(gpus)
    index = {name: samples.series(name) for name in samples.names()}
    for name in NAMES:
        for candidate in (name, name + "_total"):
            if candidate in index:
                index[candidate] = [
                    (labels, value)
                    for labels, value in index[candidate]
                    if labels.get(GPU_LABEL) in wanted or labels.get(UUID_LABEL) in wanted
                ]
    return MetricSamples({name: series for name, series in index.items() if series})


def gpus_shown(samples: MetricSamples) -> set[str]:
    """Every ``gpu`` and ``UUID`` label value on the page's power series (to say which mapped GPUs are missing)."""
    shown: set[str] = set()
    for name in NAMES:
        for labels, _ in samples.series(name):
            shown.update(v for k, v in labels.items() if k in {GPU_LABEL, UUID_LABEL} and v)
    return shown


def power_watts(samples: MetricSamples) -> float | None:
    return samples.gauge_sum(POWER_USAGE)


def energy_joules(samples: MetricSamples) -> float | None:
    millijoules = samples.counter(TOTAL_ENERGY_CONSUMPTION)
    return None if millijoules is None else millijoules / MILLIJOULES_PER_JOULE
