"""Start ``cognitora pd-sidecar`` as a child process (tests, benchmarks, the demo): one process fronting several
decode engines, one listener each, ready when every listener answers."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from cognitora_sim.harness.process import ManagedProcess, free_port

__all__ = ["start_sidecars"]


def start_sidecars(
    engine_urls: Sequence[str],
    log_dir: Path,
    *,
    protocol: str = "vllm",
    prefill_timeout_s: float = 30.0,
    transfer_timeout_s: float = 30.0,
) -> tuple[ManagedProcess, list[str]]:
    """A sidecar per engine of ``engine_urls``; returns the process and the sidecars' URLs, in the same order."""
    ports = [free_port() for _ in engine_urls]
    argv = [sys.executable, "-m", "cognitora.cli", "pd-sidecar", "--protocol", protocol]
    argv += ["--prefill-timeout-s", str(prefill_timeout_s), "--transfer-timeout-s", str(transfer_timeout_s)]
    for port, url in zip(ports, engine_urls, strict=True):
        argv += ["--listen", f"127.0.0.1:{port}", "--engine", url]
    proc = ManagedProcess(argv, Path(log_dir) / f"pd-sidecar-{ports[0]}.log")
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            proc.wait_http(f"{url}/sidecar/stats", timeout_s=60)
    except BaseException:
        proc.stop()
        raise
    return proc, urls
