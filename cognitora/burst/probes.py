"""Local probes: how a class in burst learns that the fleet serves it again.

A class in burst sends out what its best local endpoint is predicted to miss. When the load is gone, that
prediction may stay high: the figures it rests on (the engine's prefill rate, the prefill time of its short
prompts, the TTFT feedback) were learned under the load, and nothing runs locally any more to correct them (a
step left an idle engine predicted at 1.5 s for a 3-token prompt, and every request went out for minutes).

So, in burst, a request whose best local endpoint is *measured* idle (nothing running, nothing queued: the
scrape and the routers' own counts) and whose own prefill there fits the exit threshold is placed locally, as a
probe: at most one at a time per (model, class), and one per ``burst.probe_interval_s``. The probe's first token
(or, where a gateway sees none, its whole answer) timed by the gateway is a measurement: within the exit threshold
it ends the burst (``SaturationDetector.release``); later, or a failure, and the class stays out until the next
probe. A probe still open past the exit threshold has failed already: the next one may go.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["LocalProbes", "ProbeResult"]

ClassKey = tuple[str, str]
"""(model, priority class)."""


class ProbeResult(StrEnum):
    """How a probe ended (``cognitora_burst_probes_total{result}``)."""

    RELEASED = "released"
    """It answered within the exit threshold: the class left burst."""
    TOO_SLOW = "too_slow"
    """No answer within the exit threshold."""
    FAILED = "failed"
    """The engine failed it."""


@dataclass(frozen=True)
class _Probe:
    request_id: str
    key: ClassKey
    started: float
    deadline_s: float
    """The exit threshold in seconds (``exit_ratio`` x the class's TTFT SLO)."""


class LocalProbes:
    """The probes of one Router's burst policy. Not thread-safe: the Router calls it on its loop."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._open: dict[ClassKey, _Probe] = {}
        self._by_id: dict[str, _Probe] = {}
        self._last_start: dict[ClassKey, float] = {}
        self.results: dict[tuple[str, str, str], int] = {}
        """(model, priority, ProbeResult) -> probes ended so."""

    @property
    def active(self) -> bool:
        """Some probe is open (the Router reports local finishes only then)."""
        return bool(self._by_id)

    def may_probe(self, key: ClassKey, now: float) -> bool:
        """Whether a probe of ``key`` may start now."""
        probe = self._open.get(key)
        if probe is not None and now - probe.started > probe.deadline_s:
            self._end(probe, ProbeResult.TOO_SLOW)
            probe = None
        return probe is None and now - self._last_start.get(key, float("-inf")) >= self.interval_s

    def start(self, key: ClassKey, request_id: str, now: float, deadline_s: float) -> None:
        probe = _Probe(request_id, key, now, deadline_s)
        self._open[key] = probe
        self._by_id[request_id] = probe
        self._last_start[key] = now

    def withdraw(self, request_id: str) -> None:
        """The probe was not sent (refused after the decision): the class may probe again at once."""
        probe = self._by_id.pop(request_id, None)
        if probe is not None and self._open.get(probe.key) is probe:
            del self._open[probe.key]
            self._last_start.pop(probe.key, None)

    def finished(self, request_id: str, achieved_s: float | None) -> ClassKey | None:
        """A local attempt ended; ``achieved_s``: its first token (else whole answer) after dispatch, None when it
        failed. The class it released, if it was a probe that answered within its deadline."""
        probe = self._by_id.get(request_id)
        if probe is None:
            return None
        if achieved_s is None:
            self._end(probe, ProbeResult.FAILED)
            return None
        if achieved_s > probe.deadline_s:
            self._end(probe, ProbeResult.TOO_SLOW)
            return None
        self._end(probe, ProbeResult.RELEASED)
        return probe.key

    def _end(self, probe: _Probe, result: ProbeResult) -> None:
        self._by_id.pop(probe.request_id, None)
        if self._open.get(probe.key) is probe:
            del self._open[probe.key]
        key = (*probe.key, result.value)
        self.results[key] = self.results.get(key, 0) + 1
