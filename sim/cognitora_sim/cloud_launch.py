"""Start ``cognitora sim cloud`` as a child process (tests, the demo, benchmarks) and drive its admin switches."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until

TLS_HOSTNAME = "cloud.sim.test"
"""The name on the simulated cloud's certificate: the SNI a client sends (it resolves nowhere; clients connect
to 127.0.0.1 and name this host)."""


class SimCloudProcess:
    def __init__(self, process: ManagedProcess, port: int, tls_dir: Path | None) -> None:
        self.process = process
        self.port = port
        self.tls_dir = tls_dir
        scheme = "https" if tls_dir is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.base_url = f"{self.url}/v1"

    @property
    def ca_file(self) -> Path | None:
        return None if self.tls_dir is None else self.tls_dir / "ca.pem"

    def _client(self) -> httpx.Client:
        return httpx.Client(verify=str(self.ca_file) if self.ca_file is not None else True, timeout=10.0)

    def outage(self, down: bool) -> None:
        """The outage switch: every request answered 503 while ``down``."""
        with self._client() as c:
            c.post(f"{self.url}/admin/outage", json={"down": down}).raise_for_status()

    def limit(self, max_concurrency: int) -> None:
        """Answer 429 beyond ``max_concurrency`` requests in flight (0: every request)."""
        with self._client() as c:
            c.post(f"{self.url}/admin/limit", json={"max_concurrency": max_concurrency}).raise_for_status()

    def fault(self, mode: str, slow_ms: float | None = None) -> None:
        """Fail every request so (``cognitora_sim.cloud.Fault``: none, 500, 503, 429, reset, hang, slow) until
        the next call; ``slow_ms``: the delay of ``slow``."""
        body: dict[str, object] = {"mode": mode}
        if slow_ms is not None:
            body["slow_ms"] = slow_ms
        with self._client() as c:
            c.post(f"{self.url}/admin/fault", json=body).raise_for_status()

    def received(self) -> int:
        """Inference requests that reached the cloud so far, answered or not."""
        return int(self.metrics().get("sim_cloud_received_total", 0))

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{sample with labels: value}``."""
        with self._client() as c:
            text = c.get(f"{self.url}/metrics").text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self) -> int | None:
        return self.process.stop()

    def __enter__(self) -> SimCloudProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cloud(
    *,
    log_dir: Path,
    tls: bool = False,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> SimCloudProcess:
    """Run ``cognitora sim cloud`` (with ``--tls-dir`` under ``log_dir`` when ``tls``); return once it answers."""
    port = port or free_port()
    tls_dir = log_dir / "cloud-tls" if tls else None
    argv = [sys.executable, "-m", "cognitora.cli", "sim", "cloud", "--port", str(port), *args]
    if tls_dir is not None:
        argv += ["--tls-dir", str(tls_dir), "--tls-hostname", TLS_HOSTNAME]
    process = ManagedProcess(argv, log_dir / f"sim-cloud-{port}.log", env=env)
    cloud = SimCloudProcess(process, port, tls_dir)

    def up() -> bool:
        if not process.alive():
            raise RuntimeError(f"cognitora sim cloud exited:\n{process.log_tail()}")
        try:
            with cloud._client() as c:
                return c.get(f"{cloud.url}/metrics").status_code == 200
        except (httpx.HTTPError, OSError):
            return False

    try:
        wait_until(up, 30.0, "the simulated cloud to answer")
    except BaseException:
        process.stop()
        raise
    return cloud
