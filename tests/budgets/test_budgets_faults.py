"""Budget faults against a real ``redis-server`` this test starts, kills and restarts: no settled count lost over
an AOF restart; Redis down with ``fail_open`` (admitted, counted here, written when it is back: nothing lost) and
with ``fail_closed`` (503 that says why); a gateway that dies mid-request (its reservation expires and is settled
at its estimate, once)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.redis_server import answers, free_port
from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.identity import Identity
from cognitora.request import RouteRequest
from cognitora_sim.harness.process import wait_until
from kvstate.redis_store import RedisStore

MODEL = "smollm2"


class RedisProcess:
    """A redis-server with AOF (fsync on every write) in its own folder, on a fixed port across restarts."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is needed for this test"
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="cognitora-budget-redis-")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "always"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: answers(self.url), 15, "redis-server to answer")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no shutdown save; only what the AOF holds survives
        self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def redis_process() -> Iterator[RedisProcess]:
    server = RedisProcess()
    server.start()
    yield server
    if server.proc is not None:
        server.kill()
    shutil.rmtree(server.dir, ignore_errors=True)


def make_config(smollm2_dir: Path, url: str, **budgets: Any) -> CognitoraConfig:
    return config_from_dict(
        {
            "redis_url": url,
            "placement": {"store_timeout_s": 0.5},
            "budgets": {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": 100_000}]}}, **budgets},
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": "http://127.0.0.1:18001"}],
                }
            ],
        }
    )


def ask() -> RouteRequest:
    messages = [{"role": "user", "content": "Say something about budgets."}]
    return RouteRequest(model=MODEL, messages=messages, team="alpha", max_tokens=50)


async def alpha_used(router: Router) -> int:
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    r = gate.planner.plan("-", Identity(team="alpha"), MODEL, gate.planner.usage(MODEL, 0, 0))
    [value] = await gate.ledger.counter_values(list(r.counters), int(time.time() * 1000))
    return value


async def serve(router: Router, n: int, completion: int = 10) -> int:
    """``n`` requests admitted and completed; the tokens they settle."""
    total = 0
    for _ in range(n):
        decision, attempt = await router.admit(ask())
        assert attempt is not None, decision.explain()
        attempt.finish(
            Outcome(OutcomeKind.COMPLETED, prompt_tokens=decision.prompt_tokens, completion_tokens=completion)
        )
        total += decision.prompt_tokens + completion
    return total


async def test_aof_restart_loses_no_settled_count(smollm2_dir: Path, redis_process: RedisProcess) -> None:
    config = make_config(smollm2_dir, redis_process.url)
    router = Router(config, RedisStore.from_url(redis_process.url))
    settled = await serve(router, 5)
    assert await alpha_used(router) == settled
    redis_process.kill()
    redis_process.start()
    assert await alpha_used(router) == settled  # the client reconnects; the AOF held every settle
    settled += await serve(router, 2)
    assert await alpha_used(router) == settled
    await router.close()


async def test_redis_down_fail_open_counts_here_and_writes_when_back(
    smollm2_dir: Path, redis_process: RedisProcess
) -> None:
    config = make_config(smollm2_dir, redis_process.url)
    router = Router(config, RedisStore.from_url(redis_process.url))
    settled = await serve(router, 2)
    assert await alpha_used(router) == settled  # (their settles landed before the store goes)
    redis_process.kill()
    settled += await serve(router, 3)  # admitted (fail_open), placed on local state, settled into the backlog
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    assert gate.backlog == 3 and gate.stats.fail_open == 3
    from cognitora.metrics.families import budget_families

    [fail_open] = [m for m in budget_families(gate) if m.name == "cognitora_budget_fail_open"]
    assert [s.value for s in fail_open.samples] == [3]  # counted where an operator sees it
    redis_process.start()
    settled += await serve(router, 1)  # the first answer from the store starts writing the backlog
    await gate.drain()
    await gate.flushed()
    assert gate.backlog == 0
    assert await alpha_used(router) == settled  # nothing lost, nothing twice
    await router.close()


async def test_redis_down_fail_closed_refuses_with_a_clear_503(smollm2_dir: Path, redis_process: RedisProcess) -> None:
    config = make_config(smollm2_dir, redis_process.url, on_store_error="fail_closed")
    router = Router(config, RedisStore.from_url(redis_process.url))
    redis_process.kill()
    decision, attempt = await router.admit(ask())
    assert attempt is None and decision.rejection is not None
    assert decision.rejection.status == 503 and decision.rejection.retry_after_s == 1
    assert "budget store (Redis) is unreachable" in decision.rejection.message
    assert "fail_closed" in decision.rejection.message
    await router.close()


async def test_a_gateway_that_dies_mid_request_loses_nothing(smollm2_dir: Path, redis_process: RedisProcess) -> None:
    config = make_config(smollm2_dir, redis_process.url, reservation_ttl_s=1)
    dead = Router(config, RedisStore.from_url(redis_process.url))
    decision, attempt = await dead.admit(ask())  # reserved, dispatched: then the gateway dies, no finish
    assert attempt is not None
    estimate = decision.prompt_tokens + 50
    assert await alpha_used(dead) == estimate  # counted while its lease runs
    # Another gateway, 2 s later by its clock: past the dead one's lease (reservation_ttl_s: 1).
    live = Router(config, RedisStore.from_url(redis_process.url), clock=lambda: time.time() + 2)
    settled = await serve(live, 1)  # a later reserve settles the dead one at its estimate
    gate = live.budgets
    assert gate is not None
    day = await gate.ledger.days([gate.planner.plan("-", Identity(), MODEL, gate.planner.usage(MODEL, 0, 0)).day])
    assert await alpha_used(live) == estimate + settled
    assert await gate.ledger.open_reservations() == 0
    [rows] = day.values()
    assert rows[f"team\talpha\t{MODEL}\trequests"] == 2
    # The old gateway comes back and reports its attempt after all: counted once already, nothing changes.
    attempt.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=1, completion_tokens=1))
    assert dead.budgets is not None
    await dead.budgets.drain()
    assert await alpha_used(live) == estimate + settled
    await dead.close()
    await live.close()
