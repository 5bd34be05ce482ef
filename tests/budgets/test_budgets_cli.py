"""``cognitora budgets report|show|reset`` against a real Redis, with usage written by the core and by the charge
API (``cognitora.budgets.charges``, what the cloud burst records): what an operator reads and does."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.harness.redis_server import free_port
from cognitora.budgets import cli
from cognitora.budgets.charges import Charge, record_charge
from cognitora.budgets.ledger import SettleResult
from cognitora.config import load_config
from cognitora.core.router import Router
from cognitora.identity import Identity
from kvstate.redis_store import RedisStore
from tests.conftest import REDIS_PASSWORD, ROOT

BUDGETS = {
    "prices": {"m": {"input_per_million_usd": 1.0, "output_per_million_usd": 2.0}},
    "teams": {"alpha": {"limits": [{"window": "month", "total_tokens": 10_000, "cost_usd": 1.0}]}},
    "keys": {"k-1": {"limits": [{"window": "rolling", "rolling_s": 3600, "output_tokens": 500}]}},
}


@pytest.fixture
def config_file(tmp_path: Path, redis_server_url: str, key_prefix: str) -> Path:
    path = tmp_path / "cognitora.yaml"
    data = {
        "redis_url": redis_server_url,
        "key_prefix": key_prefix,
        "budgets": BUDGETS,
        "models": [{"name": "m", "endpoints": [{"url": "http://127.0.0.1:18001"}]}],
    }
    path.write_text(yaml.safe_dump(data))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def write_usage(config_file: Path) -> None:
    router = Router(load_config(config_file), RedisStore.from_url(load_config(config_file).redis_url or ""))
    gate = router.budgets
    assert gate is not None
    r = gate.planner.plan("req-1", Identity("alpha", "k-1", "ann"), "m", gate.planner.usage("m", 100, 50))
    assert await gate.ledger.reserve(r, int(time.time() * 1000)) is None
    assert await gate.ledger.settle(r, gate.planner.usage("m", 90, 40, 64)) is SettleResult.SETTLED
    burst = Charge(
        "burst-1", model="gpt-x", target="cloud-a", team="alpha", input_tokens=10, output_tokens=5, cost_usd=0.25
    )
    assert await record_charge(gate.ledger, gate.planner, burst) is SettleResult.ADDED
    assert await record_charge(gate.ledger, gate.planner, burst) is SettleResult.ALREADY  # once per id
    await router.close()


def test_report_show_and_reset(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(write_usage(config_file))
    code, out, _ = run(capsys, "report", "--config", str(config_file), "--format", "json")
    assert code == 0
    report = json.loads(out)
    rows = {(u["kind"], u["subject"], u["model"], u["target"]): u for u in report["usage"]}
    alpha = rows[("team", "alpha", "m", "local")]
    assert (alpha["requests"], alpha["input_tokens"], alpha["output_tokens"], alpha["cached_tokens"]) == (1, 90, 40, 64)
    assert alpha["cost_usd"] == pytest.approx((90 * 1 + 40 * 2) / 1e6)
    burst = rows[("team", "alpha", "gpt-x", "cloud-a")]
    assert (burst["input_tokens"], burst["output_tokens"], burst["cost_usd"]) == (10, 5, 0.25)
    assert ("key", "k-1", "m", "local") in rows and ("user", "ann", "m", "local") in rows
    left = {(li["subject"], li["limit"]): li for li in report["limits"]}
    total = left[("alpha", "budgets.teams.alpha.limits[0].total_tokens")]
    assert (total["used"], total["cap"], total["left"]) == (145, 10_000, 10_000 - 145)
    cost = left[("alpha", "budgets.teams.alpha.limits[0].cost_usd")]
    assert cost["used"] == pytest.approx(0.25 + 170 / 1e6)
    assert left[("k-1", "budgets.keys.k-1.limits[0].output_tokens")]["used"] == 40

    code, out, _ = run(capsys, "report", "--config", str(config_file), "--team", "alpha", "--window", "month")
    assert code == 0 and re.search(r"alpha\s+gpt-x\s+cloud-a\s+1\s+10\s+5\s", out)  # a row per cloud target
    assert "ann" not in out and time.strftime("%Y-%m") in out
    code, out, _ = run(capsys, "report", "--config", str(config_file), "--format", "csv", "--since", "2000-01-01")
    assert code == 0 and "period,kind,subject,model,target,requests" in out
    limit_rows = [row for row in csv.reader(io.StringIO(out)) if row[:1] == ["team"] and len(row) == 8]
    assert ["team", "alpha", "budgets.teams.alpha.limits[0].total_tokens"] in [row[:3] for row in limit_rows]
    code, out, _ = run(capsys, "show", "--config", str(config_file))
    assert code == 0 and "budgets.teams.alpha.limits[0].total_tokens" in out and "9,855" in out

    code, _, err = run(capsys, "reset", "--config", str(config_file), "--team", "alpha")
    assert code == 2 and "--yes" in err
    code, out, _ = run(capsys, "reset", "--config", str(config_file), "--team", "alpha", "--yes")
    assert code == 0 and "2 counters deleted" in out
    code, out, _ = run(capsys, "show", "--config", str(config_file), "--team", "alpha", "--format", "json")
    assert [li["used"] for li in json.loads(out)["limits"]] == [0, 0]
    code, out, _ = run(capsys, "report", "--config", str(config_file), "--format", "json")
    assert json.loads(out)["usage"]  # history is kept


def test_errors_say_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump({"budgets": BUDGETS, "models": [{"name": "m", "endpoints": [{"url": "http://h:1"}]}]})
    )
    code, _, err = run(capsys, "report", "--config", str(path))
    assert code == 2 and "no redis_url" in err and "set redis_url" in err
    path.write_text(yaml.safe_dump({"models": [{"name": "m", "endpoints": [{"url": "http://h:1"}]}]}))
    code, _, err = run(capsys, "show", "--config", str(path))
    assert code == 2 and "has no budgets section" in err


def cli_config(tmp_path: Path, redis_url: str) -> Path:
    path = tmp_path / "cognitora.yaml"
    data = {"redis_url": redis_url, "budgets": BUDGETS, "models": [{"name": "m", "endpoints": [{"url": "http://h:1"}]}]}
    path.write_text(yaml.safe_dump(data))
    return path


def cognitora(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command an operator types, in its own process: what it prints and how it exits."""
    cmd = [sys.executable, "-m", "cognitora.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd, env={"PYTHONPATH": str(ROOT)})


def test_redis_down_or_refusing_is_one_line_that_says_what_to_do(tmp_path: Path, redis_with_password_url: str) -> None:
    down = cli_config(tmp_path, f"redis://:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0")
    done = cognitora("budgets", "report", "--config", str(down), cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "Traceback" not in line and REDIS_PASSWORD not in line
    assert line.startswith("cognitora budgets: cannot read the budget store at redis://:****@127.0.0.1:")
    assert "start Redis there, or point redis_url in" in line

    wrong = redis_with_password_url.replace(REDIS_PASSWORD, "not-the-password")
    refused = cli_config(tmp_path, wrong)
    for command in ("report", "show"):
        done = cognitora("budgets", command, "--config", str(refused), cwd=tmp_path)
        assert done.returncode == 1 and done.stdout == ""
        [line] = done.stderr.splitlines()
        assert "Redis refused the credentials" in line and "fix redis_url" in line
        assert "not-the-password" not in line and REDIS_PASSWORD not in line and "Traceback" not in line


def test_a_malformed_redis_url_never_prints_its_password(tmp_path: Path) -> None:
    """``rediss//:pw@host`` (a colon missing): every command that reads the config says the URL is wrong, with the
    password masked."""
    secret = "canary-malformed-7c1d"
    path = cli_config(tmp_path, f"rediss//:{secret}@10.0.0.9:6379")
    for argv in (
        ("budgets", "report", "--config", str(path)),
        ("explain", "--config", str(path), "--model", "m", "--prompt", "hi"),
        ("extproc", "--config", str(path), "--listen", "127.0.0.1:0"),
        ("collector", "--config", str(path)),
    ):
        done = cognitora(*argv, cwd=tmp_path)
        out = done.stdout + done.stderr
        assert done.returncode != 0, (argv, out)
        assert "redis_url: expected a Redis URL" in out and "rediss//:****@10.0.0.9:6379" in out, (argv, out)
        assert secret not in out, (argv, out)
