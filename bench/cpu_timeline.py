"""A process group's CPU use sampled over a run, so each ladder stage gets its own figure.

One figure per run hides where a router's CPU goes: a proxy at 0.9 cores over a run may be idle in the first
stages and pinned at one core in the last, and only the second says that the stage measured the proxy rather
than placement. The sampler reads the group's CPU seconds about once a wall second (off the event loop: a /proc
scan takes a few ms) and answers the mean cores used between two wall times by interpolating between samples.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CpuTimeline:
    read_cpu_s: Callable[[], float]
    """CPU seconds used so far by what is measured (e.g. ``Target.cpu_seconds``)."""
    interval_s: float = 1.0
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(``time.perf_counter()``, CPU seconds), in time order."""

    def sample(self) -> None:
        """Take one sample now (call it before the run starts, so the first stage's window begins after it)."""
        self.samples.append((time.perf_counter(), self.read_cpu_s()))

    async def sample_forever(self) -> None:
        """One sample each interval, the first one interval from now."""
        while True:
            await asyncio.sleep(self.interval_s)
            cpu = await asyncio.to_thread(self.read_cpu_s)
            self.samples.append((time.perf_counter(), cpu))

    def cores_between(self, t0: float, t1: float) -> float | None:
        """Mean cores used between wall times ``t0`` and ``t1`` (``perf_counter`` seconds); None when the window is
        shorter than one sampling interval or outside the samples (too little to say)."""
        if t1 - t0 < self.interval_s or len(self.samples) < 2:
            return None
        if t0 < self.samples[0][0] or t1 > self.samples[-1][0]:
            return None
        return (self._cpu_at(t1) - self._cpu_at(t0)) / (t1 - t0)

    def _cpu_at(self, t: float) -> float:
        times = [s[0] for s in self.samples]
        i = min(max(bisect_left(times, t), 1), len(times) - 1)
        (ta, ca), (tb, cb) = self.samples[i - 1], self.samples[i]
        return ca if tb <= ta else ca + (cb - ca) * (t - ta) / (tb - ta)
