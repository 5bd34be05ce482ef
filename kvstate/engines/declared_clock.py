"""The engine's clock as the engine declares it: ``cognitora_sim_engine_clock_rate``, engine seconds per wall second.

Only the time-scaled simulator shows it (``cognitora_sim.metrics``, its ``--time-scale``): every time on
its page runs that many times as fast as the gateway's clock. The scraper otherwise learns the rate from the ITL
histogram (``kvstate.rates.RateEstimator.clock_rate``), which needs a steady window of decoding requests and reads
the running gauge, prefills included, as decoding: on the long-context bench at time scale 0.5 no rate was learned
for 40-90% of the long prompts' placements and 0.21-0.64 for the rest, so flow control timed first tokens on the
wall clock and its prediction margin sat at its 1.5 cap (docs/flow_control.md, "Gateways"). A declared rate is
exact from the first scrape. Any engine of any kind may show it: the simulator adds it to every kind's page.
"""

from __future__ import annotations

from kvstate.engines.prom import MetricSamples

__all__ = ["CLOCK_RATE", "declared_clock_rate"]

CLOCK_RATE = "cognitora_sim_engine_clock_rate"
"""Gauge, engine seconds per wall second (``cognitora_sim.metrics`` shows it under this name)."""


def declared_clock_rate(samples: MetricSamples) -> float | None:
    """The page's declared clock rate; None when it declares none (every real engine) or an unusable one."""
    rate = samples.gauge_sum(CLOCK_RATE)
    return rate if rate is not None and rate > 0 else None
