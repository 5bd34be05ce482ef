"""A canary Redis password and a canary API key planted in every config, then every command's every output grepped
for them: ``cognitora explain``, ``collector``, ``extproc``, the LiteLLM export, config errors, debug logs.

The Redis here really requires the canary password, so the commands run as they would in production (the right
password: they work; a wrong one: they fail), and the outputs are whatever they print then.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
import redis
import yaml

from cognitora_sim.harness.process import free_port
from cognitora_sim.tokenizer import SMOLLM2_DIR

ROOT = Path(__file__).resolve().parents[2]
CANARY_PASSWORD = "canaryPw-4f1e9b27"
CANARY_API_KEY = "sk-canary-9d2c71aa55"


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is needed (apt-get install redis-server)"
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis-auth")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", CANARY_PASSWORD]
    proc = subprocess.Popen(
        [*argv, "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            if redis.Redis(port=port, password=CANARY_PASSWORD, socket_timeout=0.5).ping():
                break
        except (redis.RedisError, OSError):
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "the password-protected redis did not start"
        time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def cognitora_yaml(tmp: Path, redis_url: str, name: str = "cognitora.yaml") -> Path:
    config = {
        "redis_url": redis_url,
        "models": [
            {
                "name": "m",
                "tokenizer": str(SMOLLM2_DIR / "tokenizer.json"),
                "endpoints": [{"url": f"http://127.0.0.1:{free_port()}"}],
            }
        ],
        "scrape": {"interval_s": 0.2, "timeout_s": 0.2},
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(config))
    return path


def run(
    argv: list[str],
    tmp: Path,
    *,
    env: dict[str, str] | None = None,
    for_s: float | None = None,
    serving: str | None = None,
) -> str:
    """Run a command; with ``for_s``, let it serve: until it has printed ``serving`` (the line that says it serves:
    by then SIGTERM is its own to handle) and for at least ``for_s`` seconds, or until it exits by itself; 60 s at
    most (a loaded machine starts it slowly). Then SIGTERM it: it must exit within 30 s. Everything it printed."""
    full_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, cwd=tmp
    )
    if for_s is None:
        out, _ = proc.communicate(timeout=120)
        return out.decode(errors="replace")
    assert proc.stdout is not None and serving is not None
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(proc.stdout.readline, b"")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    what = " ".join(argv[2:4])

    def printed() -> str:
        return b"".join(chunks).decode(errors="replace")

    def fail(why: str) -> NoReturn:
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
        raise AssertionError(f"{what} {why}; it printed:\n{printed()[-3000:]}")

    started = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - started >= for_s and any(serving.encode() in chunk for chunk in chunks):
            break
        if time.monotonic() > started + 60:
            fail(f"did not print {serving!r} within 60 s")
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        fail("did not exit within 30 s of SIGTERM")
    reader.join(timeout=30)
    return printed()


def assert_clean(output: str, what: str) -> None:
    assert output.strip(), f"{what} printed nothing: the check would prove nothing"
    for canary in (CANARY_PASSWORD, CANARY_API_KEY):
        assert canary not in output, f"{what} leaked a secret:\n{output[-3000:]}"


def test_no_command_prints_a_redis_password_or_an_api_key(redis_with_password: int, tmp_path: Path) -> None:
    good = f"redis://:{CANARY_PASSWORD}@127.0.0.1:{redis_with_password}/0"
    wrong = f"redis://:{CANARY_PASSWORD}x@127.0.0.1:{redis_with_password}/0"
    dead = f"redis://:{CANARY_PASSWORD}@127.0.0.1:{free_port()}/0"
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Where does this go?")
    py = sys.executable
    outputs: dict[str, str] = {}
    for label, url in (("good", good), ("wrong password", wrong), ("redis down", dead)):
        config = cognitora_yaml(tmp_path, url, f"{label.replace(' ', '-')}.yaml")
        explain = [py, "-m", "cognitora.cli", "explain", "--config", str(config), "--model", "m"]
        outputs[f"explain ({label})"] = run([*explain, "--prompt-file", str(prompt)], tmp_path)
        collector = [py, "-m", "cognitora.cli", "collector", "--config", str(config), "--log-level", "debug"]
        outputs[f"collector ({label})"] = run(collector, tmp_path, for_s=4, serving="collector started")
        extproc = [
            py,
            "-m",
            "cognitora.cli",
            "extproc",
            "--config",
            str(config),
            "--listen",
            f"127.0.0.1:{free_port()}",
        ]
        outputs[f"extproc ({label})"] = run(
            [*extproc, "--log-level", "debug"], tmp_path, for_s=4, serving="ext_proc listening on"
        )
    # A redis_url with the wrong scheme is echoed in the config error: without its password.
    bad_scheme = cognitora_yaml(tmp_path, f"http://:{CANARY_PASSWORD}@127.0.0.1:1/0", "bad-scheme.yaml")
    outputs["config error"] = run(
        [
            py,
            "-m",
            "cognitora.cli",
            "explain",
            "--config",
            str(bad_scheme),
            "--model",
            "m",
            "--prompt-file",
            str(prompt),
        ],
        tmp_path,
    )
    assert "expected a Redis URL" in outputs["config error"], outputs["config error"]
    # The LiteLLM config names the key through the environment, as LiteLLM users write it.
    litellm_config = tmp_path / "litellm_config.yaml"
    litellm_config.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {
                        "model_name": "m",
                        "litellm_params": {
                            "model": "hosted_vllm/m",
                            "api_base": f"http://127.0.0.1:{free_port()}/v1",
                            "api_key": "os.environ/CANARY_API_KEY",
                        },
                    }
                ],
                "router_settings": {
                    "routing_strategy": "cognitora",
                    "routing_strategy_args": {"redis_url": "os.environ/CANARY_REDIS_URL", "models": [{"name": "m"}]},
                },
            }
        )
    )
    env = {"CANARY_API_KEY": CANARY_API_KEY, "CANARY_REDIS_URL": wrong}
    exported = tmp_path / "exported.yaml"
    printed = run([py, "-m", "litellm_plugin.export", str(litellm_config), "-o", str(exported)], tmp_path, env=env)
    outputs["litellm export"] = printed + exported.read_text()
    assert "redis_url: os.environ/CANARY_REDIS_URL" in exported.read_text()
    for what, output in outputs.items():
        assert_clean(output, what)
    # What each command said is still useful: the store it reads, or why it could not.
    assert "store: Redis redis://:****@127.0.0.1" in outputs["explain (good)"], outputs["explain (good)"]
