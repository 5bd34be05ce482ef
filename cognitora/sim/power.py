"""Energy and power of one simulated engine, in engine time.

Between steps the accelerators draw ``idle`` watts; during a step they draw what the profile's power model says
(see profiles.py). ``energy_joules(now)`` is the integral; ``watts(now)`` is the average over the last second, as
NVML reports power on Ampere and newer (a 1-second average).
"""

from __future__ import annotations

from collections import deque


class EnergyMeter:
    def __init__(self, idle_watts: float, start: float = 0.0) -> None:
        self.idle_watts = idle_watts
        self._t = start
        self._joules = 0.0
        self._samples: deque[tuple[float, float]] = deque([(start, 0.0)], maxlen=4096)

    def add_step(self, start: float, end: float, watts: float) -> None:
        """A step ran from ``start`` to ``end`` (engine seconds) drawing ``watts``; idle before it."""
        if start > self._t:
            self._joules += (start - self._t) * self.idle_watts
            self._t = start
        if end > self._t:
            self._joules += (end - self._t) * watts
            self._t = end
            self._samples.append((self._t, self._joules))

    def energy_joules(self, now: float) -> float:
        return self._joules + max(0.0, now - self._t) * self.idle_watts

    def watts(self, now: float, window: float = 1.0) -> float:
        start = now - window
        while len(self._samples) > 1 and self._samples[1][0] <= start:
            self._samples.popleft()
        t0, e0 = self._samples[0]
        if t0 < start:  # samples[0] is the last point before the window: interpolate the idle-or-step energy
            t1, e1 = self._samples[1] if len(self._samples) > 1 else (self._t, self._joules)
            e0 = e0 + (e1 - e0) * ((start - t0) / (t1 - t0)) if t1 > t0 else e0
            t0 = start
        span = now - t0
        if span <= 0:
            return self.idle_watts
        return (self.energy_joules(now) - e0) / span
