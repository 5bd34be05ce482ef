"""``/healthz`` and ``/readyz`` for the collector and the node agent (Kubernetes probes, systemd watchdogs, a load
balancer's check). Served beside ``/metrics`` on the same port (``cognitora.metrics.serve.MetricsServer``).

- ``/healthz``: the process answers (200). Liveness: restart it when this fails.
- ``/readyz``: 200 when it is doing its job, else 503; either way a JSON body naming each check and, for a failing
  one, why. The collector is ready when the store answers a ping and its inputs flow (every KV-event stream
  subscribed and resynced, a scrape round done with at least one engine healthy); the node agent when its last
  successful reading of the power source is recent.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["HEALTHZ_PATH", "PING_TIMEOUT_S", "READYZ_PATH", "Probe", "Readiness", "probe_answer", "sample_readiness"]

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
PING_TIMEOUT_S = 1.0
"""A store that takes longer to answer a ping than this is not ready (a probe must answer within its own timeout)."""


@dataclass(frozen=True)
class Readiness:
    checks: dict[str, str] = field(default_factory=dict)
    """Check name -> ``"ok"`` or why not."""

    @property
    def ready(self) -> bool:
        return all(v == "ok" for v in self.checks.values())

    def body(self) -> dict[str, object]:
        return {"status": "ready" if self.ready else "not ready", "checks": self.checks}


Probe = Callable[[], Awaitable[Readiness]]


def sample_readiness(
    last_sample_at: float | None, interval_s: float, clock: Callable[[], float] = time.monotonic
) -> Readiness:
    """The node agent: ready when a reading of its source succeeded within three intervals."""
    if last_sample_at is None:
        return Readiness({"source": "no successful reading of the power source yet"})
    age = clock() - last_sample_at
    limit = 3 * interval_s
    ok = age <= limit
    return Readiness({"source": "ok" if ok else f"last successful reading {age:.1f} s ago (> {limit:g} s)"})


async def probe_answer(probe: Probe) -> tuple[int, dict[str, object]]:
    """``/readyz``'s status and body; a probe that raises is a 503 saying so, never a 500."""
    try:
        readiness = await probe()
    except Exception as exc:
        readiness = Readiness({"probe": f"the readiness check failed: {type(exc).__name__}: {exc}"})
    return (200 if readiness.ready else 503), readiness.body()
