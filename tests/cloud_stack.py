"""What the cloud end-to-end tests of both gateways share (tests/test_cloud_envoy_e2e.py,
tests/test_cloud_litellm_e2e.py): the burst settings, the simulated cloud's arguments, and the traffic they send.

Two priority classes: ``default`` (a 2 s TTFT SLO: the load-step test), and ``instant``, whose SLO (1 ms) no local
engine meets, so that every request of a team allowed to burst is sent out while the cloud's breaker lets it: the
permission and fault tests need a request that *would* go to the cloud.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.burst_load import CLOUD_MODEL, Answer, chat, closed_loop
from cognitora.process import wait_until
from cognitora.sim.cloud_launch import SimCloudProcess
from cognitora.sim.launch import SimFleet

INSTANT = "instant"
"""The class no local engine can serve in time (its requests of an allowed team always burst)."""
SLO_S = 2.0
HOLD_OFF_S = 5.0
"""burst.unhealthy_s: the breaker's first hold-off (longer than the local retries of a wave take here through
Envoy, so a wave sent after it still finds the breaker open; twice that through the LiteLLM proxy, slower here);
the next ones double, to twice that."""
PROBE_INTERVAL_S = 1.0
SCRAPE_INTERVAL_S = 1.0
RELEASE_BOUND_S = SCRAPE_INTERVAL_S + PROBE_INTERVAL_S + 0.4 * SLO_S + 1.0
"""docs/burst.md, "Letting go": once the engine is idle, traffic is local within the scrape interval (for the
engine's idleness to be seen) + the probe interval + the probe's own answer (at most the exit threshold, 0.4 x the
SLO), plus a second of margin for this shared machine."""
CLOUD_ARGS = ["--models", CLOUD_MODEL, "--ttft-ms", "100", "--rtt-ms", "20", "--retry-after-s", "10"]
"""A 429 asks for 10 s: through LiteLLM the breaker honours it (through Envoy the service sees a retried request,
not its status: the failure hold-off applies)."""

PRIORITIES = {"default": {"ttft_slo_s": SLO_S}, INSTANT: {"ttft_slo_s": 0.001}}


def burst_settings(
    *, hold_off_s: float = HOLD_OFF_S, named_teams: list[str] | None = None, **target: Any
) -> dict[str, Any]:
    """The ``burst:`` section both gateways run with: research may burst; short hold-offs and probes."""
    return {
        "targets": [
            {
                "name": "sim-cloud",
                "input_usd_per_mtok": 0.15,
                "output_usd_per_mtok": 0.6,
                "max_concurrency": 16,
                "timeout_s": 30,
                "named_teams": named_teams or [],
                **target,
            }
        ],
        "teams": ["research"],
        "priorities": ["default", INSTANT],
        "enter_ratio": 0.7,
        "exit_ratio": 0.4,
        "min_dwell_s": 2,
        "unhealthy_s": hold_off_s,
        "unhealthy_max_s": 2 * hold_off_s,
        "probe_interval_s": PROBE_INTERVAL_S,
    }


@dataclass
class Wave:
    """Concurrent requests sent while the cloud did something, and what came of them."""

    answers: list[Answer]
    cloud_calls: int
    """Requests that reached the cloud during the wave (its own count)."""

    @property
    def errors(self) -> list[str]:
        return [f"{a.status} {a.error}" for a in self.answers if a.status != 200]

    def from_cloud(self, marks: frozenset[str]) -> int:
        return sum(1 for a in self.answers if a.cloud(marks))


def wave(cloud: SimCloudProcess, url: str, headers: dict[str, str], n: int, tag: str, model: str) -> Wave:
    """``n`` concurrent streamed requests (one each), counting what reached the cloud meanwhile."""
    before = cloud.received()

    async def send() -> list[Answer]:
        async with httpx.AsyncClient(timeout=60) as client:
            return list(await asyncio.gather(*(chat(client, url, headers, f"{tag}-{i}", 8, model) for i in range(n))))

    answers = asyncio.run(send())
    return Wave(answers, cloud.received() - before)


def wait_idle(fleet: SimFleet) -> float:
    """Wait until the engine runs and queues nothing; when that was seen (monotonic)."""

    def quiet() -> bool:
        state = fleet.state(0)
        return state.get("running") == 0 and state.get("waiting") == 0

    wait_until(quiet, 90, "the engine to drain")
    return time.monotonic()


def mixed_load_step(url: str, burst_headers: dict[str, str], local_headers: dict[str, str], model: str) -> list[Answer]:
    """A load step that saturates the engine: a team that may burst (most of it goes out), and beside it a team
    that may not (its requests all run locally, under load: what the engine's learned figures are made of)."""

    async def both() -> list[Answer]:
        out, _ = await asyncio.gather(
            closed_loop(url, burst_headers, 8, 48, "step", model=model),
            closed_loop(url, local_headers, 8, 24, "ops-step", model=model),
        )
        return out

    return asyncio.run(both())


def trickle(url: str, headers: dict[str, str], seconds: float, rate: float, model: str) -> list[tuple[float, Answer]]:
    """Short prompts at ``rate`` a second for ``seconds``, open loop: (when each was sent, monotonic; its answer)."""

    async def run() -> list[tuple[float, Answer]]:
        sent: list[tuple[float, asyncio.Task[Answer]]] = []
        async with httpx.AsyncClient(timeout=60) as client:
            for i in range(int(seconds * rate)):
                task = asyncio.create_task(chat(client, url, headers, f"trickle-{i}", 3, model, words=2))
                sent.append((time.monotonic(), task))
                await asyncio.sleep(1 / rate)
            return [(at, await task) for at, task in sent]

    return asyncio.run(run())


def local_after(sent: list[tuple[float, Answer]], since: float, is_cloud: Callable[[Answer], bool]) -> list[str]:
    """The requests sent after ``since`` that went to the cloud (should be none), as readable lines."""
    return [f"+{at - since:.1f} s: {a.served_by}" for at, a in sent if at >= since and is_cloud(a)]
