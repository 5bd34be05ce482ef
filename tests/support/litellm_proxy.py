"""The one way the tests start the real LiteLLM proxy: ``litellm --config FILE`` on a free port of 127.0.0.1, with a
fresh master key, LiteLLM kept off the internet, and this checkout first on ``PYTHONPATH`` (the proxy imports
``litellm_plugin`` and any custom auth module beside the config from there). It is ready when ``/health/liveliness``
answers and, with several workers, when each of them has logged that it started."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
LITELLM = Path(sys.executable).parent / "litellm"
WORKER_HEALTHCHECK_S = 60
"""``--timeout_worker_healthcheck`` under ``--num_workers`` > 1. uvicorn's default, 5 s, is shorter than a worker takes
to import the proxy on 2 busy cores: uvicorn then kills it as hung and starts another, forever (a worker refusing to
start is never seen to refuse)."""


class LiteLLMProxy:
    """A started LiteLLM proxy (its ``process``, ``url``, ``port``, master ``key``); ``stop()`` ends it."""

    def __init__(
        self,
        config: Path,
        log_dir: Path,
        salt: str = "",
        workers: int = 1,
        *,
        key_prefix: str = "sk-e2e-",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ready_s: float | None = 90,
    ) -> None:
        """``salt``: what makes a test's prompts its own (a shared fleet must not hold them already). ``env`` is added
        to the proxy's environment; ``cwd`` defaults to the config's folder. ``ready_s=None`` returns as soon as the
        process is started (a test that expects the proxy to refuse to start reads its log)."""
        self.salt = salt
        self.port = free_port()
        self.key = key_prefix + secrets.token_hex(12)
        inherited = os.environ.get("PYTHONPATH", "")
        full_env = {
            "LITELLM_MASTER_KEY": self.key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), inherited) if p),
            # examples/litellm_config.yaml's key list names it: the configs built on the example need it set.
            "RESEARCH_API_KEY": key_prefix + "research-" + secrets.token_hex(8),
            **(env or {}),
        }
        argv: Sequence[str] = [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)]
        if workers > 1:
            argv = [*argv, "--num_workers", str(workers), "--timeout_worker_healthcheck", str(WORKER_HEALTHCHECK_S)]
        self.process = ManagedProcess(argv, log_dir / "litellm.log", env=full_env, cwd=cwd or config.parent)
        self.url = f"http://127.0.0.1:{self.port}"
        if ready_s is None:
            return
        try:
            self.process.wait_http(f"{self.url}/health/liveliness", timeout_s=ready_s)
            # One worker answering is not all of them: on busy cores another may still be importing the proxy, and
            # until it serves, the first takes every request (a test that needs both would see only one place).
            wait_until(
                lambda: self.log().count("Application startup complete.") >= workers,
                WORKER_HEALTHCHECK_S,
                f"all {workers} proxy workers started",
            )
        except BaseException:
            self.process.stop()
            raise

    @property
    def headers(self) -> dict[str, str]:
        """The master key as a client sends it."""
        return {"Authorization": f"Bearer {self.key}"}

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> LiteLLMProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
