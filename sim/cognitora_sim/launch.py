"""Start a simulated fleet as a real child process (``python -m cognitora.cli sim fleet``) and drive it.

    with start_fleet(4, time_scale=20, log_dir=tmp_path) as fleet:
        fleet.urls              # ["http://127.0.0.1:P", ...]
        fleet.endpoint_ids      # ["127.0.0.1:P", ...]
        fleet.events_addresses  # ["tcp://127.0.0.1:Q", ...]   (PUB)
        fleet.replay_addresses  # ["tcp://127.0.0.1:Q+1", ...] (ROUTER)
        fleet.fault(2, "slow", factor=3.0)

Ports come from ``free_port_block``: N consecutive HTTP ports, 2N event ports, and one admin port through which
faults are sent (so "recover" reaches an engine whose listener a "crash" closed).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

from cognitora_sim.harness.process import ManagedProcess, free_port_block
from cognitora_sim.kv_events import topic_for


class SimFleet:
    def __init__(
        self,
        process: ManagedProcess,
        n: int,
        base_port: int,
        events_base_port: int,
        admin_port: int,
        model: str,
    ) -> None:
        self.process = process
        self.n = n
        self.model = model
        self.base_port = base_port
        self.events_base_port = events_base_port
        self.admin_url = f"http://127.0.0.1:{admin_port}"
        self.ports = [base_port + i for i in range(n)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.endpoint_ids = [f"127.0.0.1:{p}" for p in self.ports]
        self.events_addresses = [f"tcp://127.0.0.1:{events_base_port + 2 * i}" for i in range(n)]
        self.replay_addresses = [f"tcp://127.0.0.1:{events_base_port + 2 * i + 1}" for i in range(n)]
        self.topics = [topic_for("127.0.0.1", p, model) for p in self.ports]

    def model_config(self, tokenizer: Path, block_size: int = 16) -> dict[str, object]:
        """This fleet as one ``models[]`` entry of a ``cognitora.yaml``: its model, the tokenizer, every engine."""
        return {
            "name": self.model,
            "block_size": block_size,
            "tokenizer": str(tokenizer),
            "endpoints": [{"url": url} for url in self.urls],
        }

    def fault(self, i: int, kind: str, factor: float | None = None) -> None:
        """Inject a fault into engine ``i``: crash | hang | slow (with factor) | clear_cache | restart | recover."""
        body: dict[str, object] = {"engine": i, "kind": kind}
        if factor is not None:
            body["factor"] = factor
        resp = httpx.post(f"{self.admin_url}/sim/fault", json=body, timeout=10.0)
        if resp.status_code != 200:
            raise ValueError(f"fault {kind!r} on engine {i} refused: {resp.text}")

    def state(self, i: int | None = None) -> dict[str, object]:
        """``GET /sim/state``: one engine's state (queue, running, cached blocks), or the whole fleet's."""
        data: dict[str, object] = httpx.get(f"{self.admin_url}/sim/state", timeout=10.0).json()
        if i is None:
            return data
        engines = data["engines"]
        assert isinstance(engines, list)
        engine: dict[str, object] = engines[i]
        return engine

    def stop(self) -> int | None:
        return self.process.stop()

    def __enter__(self) -> SimFleet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_fleet(
    n: int,
    *,
    model: str = "smollm2",
    profile: str = "h100",
    time_scale: float = 1.0,
    kv_capacity_tokens: int | None = None,
    tokenizer: Path | str | None = None,
    extra_args: Sequence[str] = (),
    log_dir: Path,
    startup_timeout_s: float = 60.0,
    base_port: int | None = None,
) -> SimFleet:
    """Run ``cognitora sim fleet`` with ``n`` engines; return once every engine answers ``/health``.

    ``base_port``: take the ports of an earlier fleet of ``n`` engines (its ``base_port``), as an engine restarted
    after a crash comes back at its old address; default: a free block.
    """
    last_error: Exception | None = None
    for _attempt in range(3 if base_port is None else 1):
        # below the kernel's ephemeral range (32768+), where client sockets would race us for ports; random,
        # because other fleets and tests look for free blocks at the same time
        base = base_port or free_port_block(3 * n + 1, start=random.randrange(20000, 32000 - 3 * n))
        http_base, events_base, admin_port = base, base + n, base + 3 * n
        argv = [
            sys.executable, "-m", "cognitora.cli", "sim", "fleet",
            "--engines", str(n),
            "--base-port", str(http_base),
            "--events-base-port", str(events_base),
            "--admin-port", str(admin_port),
            "--model", model,
            "--profile", profile,
            "--time-scale", str(time_scale),
        ]  # fmt: skip
        if kv_capacity_tokens is not None:
            argv += ["--kv-capacity-tokens", str(kv_capacity_tokens)]
        # None: the file-free built-in tokenizer (what these fleets were calibrated with), not the CLI's default
        argv += ["--tokenizer", "builtin" if tokenizer is None else str(tokenizer)]
        argv += list(extra_args)
        log_path = Path(log_dir) / f"sim-fleet-{http_base}.log"
        proc = ManagedProcess(argv, log_path, cwd=Path(__file__).resolve().parents[2])
        fleet = SimFleet(proc, n, http_base, events_base, admin_port, model)
        try:
            _wait_announced(proc, n, startup_timeout_s)
            for url in [*fleet.urls, fleet.admin_url]:
                proc.wait_http(f"{url}/health", timeout_s=startup_timeout_s)
            return fleet
        except _ExitedEarly as exc:  # most likely a port taken between our check and its bind: try other ports
            proc.stop()
            last_error = exc
        except BaseException:
            proc.stop()
            raise
    raise RuntimeError(f"the simulated fleet failed to start three times; last error: {last_error}")


class _ExitedEarly(RuntimeError):
    pass


def _wait_announced(proc: ManagedProcess, n: int, timeout_s: float) -> None:
    """Wait for the fleet's n startup lines: proof that this process, not a stranger, listens on the ports."""
    deadline = time.monotonic() + timeout_s
    while True:
        announced = 0
        for line in proc.log_tail(lines=n + 200).splitlines():
            if line.startswith('{"engine"'):
                announced += 1
        if announced >= n:
            return
        if not proc.alive():
            raise _ExitedEarly(f"fleet exited with {proc.proc.returncode}: {proc.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"fleet did not start within {timeout_s:.0f}s; log tail:\n{proc.log_tail()}")
        time.sleep(0.05)
