"""Energy, power and utilization of one simulated engine, in engine time.

Between steps the accelerators draw ``idle`` watts; during a step they draw what the profile's power model says
(see profiles.py). ``energy_joules(now)`` is the integral; ``watts(now)`` is the average over the last second, as
NVML reports power on Ampere and newer (a 1-second average); ``utilization(now)`` is the share of the last second
spent running steps (what ``DCGM_FI_DEV_GPU_UTIL`` reports, as a fraction).
"""

from __future__ import annotations

from collections import deque


class EnergyMeter:
    def __init__(self, idle_watts: float, start: float = 0.0) -> None:
        self.idle_watts = idle_watts
        self._t = start
        self._joules = 0.0
        self._busy = 0.0
        # (engine time, joules so far, busy seconds so far) at every step boundary
        self._samples: deque[tuple[float, float, float]] = deque([(start, 0.0, 0.0)], maxlen=4096)

    def add_step(self, start: float, end: float, watts: float) -> None:
        """A step ran from ``start`` to ``end`` (engine seconds) drawing ``watts``; idle before it."""
        if start > self._t:
            self._joules += (start - self._t) * self.idle_watts
            self._t = start
            self._samples.append((self._t, self._joules, self._busy))
        if end > self._t:
            self._joules += (end - self._t) * watts
            self._busy += end - self._t
            self._t = end
            self._samples.append((self._t, self._joules, self._busy))

    def energy_joules(self, now: float) -> float:
        return self._joules + max(0.0, now - self._t) * self.idle_watts

    def _at(self, t: float) -> tuple[float, float]:
        """(joules, busy seconds) at engine time ``t``, interpolated between step boundaries."""
        if t >= self._t:
            return self._joules + (t - self._t) * self.idle_watts, self._busy
        samples = self._samples
        while len(samples) > 2 and samples[1][0] <= t - 5.0:  # keep a few seconds of history
            samples.popleft()
        prev = samples[0]
        if t <= prev[0]:
            return prev[1], prev[2]
        for cur in samples:
            if cur[0] >= t:
                frac = (t - prev[0]) / (cur[0] - prev[0]) if cur[0] > prev[0] else 1.0
                return prev[1] + (cur[1] - prev[1]) * frac, prev[2] + (cur[2] - prev[2]) * frac
            prev = cur
        return prev[1], prev[2]

    def watts(self, now: float, window: float = 1.0) -> float:
        e_now, _ = self._at(now)
        e_then, _ = self._at(now - window)
        return (e_now - e_then) / window

    def utilization(self, now: float, window: float = 1.0) -> float:
        _, b_now = self._at(now)
        _, b_then = self._at(now - window)
        return max(0.0, min(1.0, (b_now - b_then) / window))
