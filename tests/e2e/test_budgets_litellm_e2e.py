"""Budgets through the real LiteLLM proxy (examples/litellm_config.yaml, Redis mode) to a simulated fleet: two
teams authenticated by the proxy's ``custom_auth``, one runs out mid-run and gets 429s with the right Retry-After,
the other is untouched; a team named by the client (a header, the body's ``user`` and ``metadata``) is ignored; the
report, read by ``cognitora budgets report`` from Redis alone, agrees with the engines' own token counters."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.harness.team_key_auth import TEAM_KEY_AUTH
from cognitora_sim.harness.process import ManagedProcess
from cognitora_sim.launch import SimFleet, start_fleet
from tests.e2e.test_litellm_e2e import write_config
from tests.support import budgets_e2e
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

AUTH_MODULE = """
import os
from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

KEYS = {"sk-alpha": ("alpha", "alice"), "sk-beta": ("beta", "bob")}

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key in KEYS:
        team, user = KEYS[key]
        return UserAPIKeyAuth(api_key=key, team_id=team, user_id=user, key_alias=f"{team}-key")
    raise HTTPException(status_code=401, detail="unknown key")
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    with start_fleet(
        4, time_scale=5, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path_factory.mktemp("sim")
    ) as f:
        yield f


def export_config(proxy_config: Path) -> tuple[ManagedProcess, Path]:
    """``python -m litellm_plugin.export`` started on the proxy's config: the cognitora.yaml an operator runs
    ``cognitora budgets`` with (wait for the process before reading it)."""
    out = proxy_config.parent / "cognitora.yaml"
    export = ManagedProcess(
        [sys.executable, "-m", "litellm_plugin.export", str(proxy_config), "-o", str(out)],
        proxy_config.parent / "export.log",
        env={"PYTHONPATH": str(budgets_e2e.ROOT)},
        cwd=proxy_config.parent,
    )
    return export, out


def test_two_teams_one_runs_out_through_litellm(
    fleet: SimFleet, smollm2_dir: Path, tmp_path: Path, redis_server_url: str, key_prefix: str
) -> None:
    path = write_config(tmp_path, fleet, smollm2_dir, redis_url=redis_server_url, key_prefix=key_prefix)
    config = yaml.safe_load(path.read_text())
    config["router_settings"]["routing_strategy_args"]["budgets"] = budgets_e2e.BUDGETS
    (tmp_path / "budget_auth.py").write_text(AUTH_MODULE)
    config["general_settings"]["custom_auth"] = "budget_auth.user_api_key_auth"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    export, cognitora_yaml = export_config(path)  # what an operator runs the report with, from the proxy's config
    proxy = LiteLLMProxy(path, tmp_path, salt="budgets")  # (the export runs meanwhile)
    try:
        assert export.proc.wait(timeout=60) == 0, export.log_tail()
        spoof = {"x-cognitora-team": "beta", "x-cognitora-user": "bob"}
        headers = {
            "alpha": {"Authorization": "Bearer sk-alpha", **spoof},
            "beta": {"Authorization": "Bearer sk-beta"},
        }
        claims = {"alpha": {"user": "bob", "metadata": {"user_api_key_team_id": "beta", "team_id": "beta"}}}
        url = f"{proxy.url}/v1/chat/completions"
        traffic = asyncio.run(budgets_e2e.two_teams(url, headers, model="chat", extra=claims))
        report = budgets_e2e.budgets_cli("report", "--config", str(cognitora_yaml), cwd=tmp_path)
        figures = budgets_e2e.check_two_teams(traffic, report, budgets_e2e.engine_tokens(fleet.urls))
        # Identity is the key's: its alias and owner, never the client's claims.
        rows = {(r["kind"], r["subject"]) for r in report["usage"]}
        assert {("key", "alpha-key"), ("user", "alice"), ("key", "beta-key"), ("user", "bob")} <= rows
        print("litellm budgets", figures)
    except BaseException:
        print(proxy.process.log_tail(80))
        raise
    finally:
        proxy.stop()


def test_two_teams_at_100_concurrent_never_overshoot_through_litellm(
    fleet: SimFleet, smollm2_dir: Path, tmp_path: Path, redis_server_url: str, key_prefix: str
) -> None:
    """Two teams with a 2,000-token cap send 100 requests each at the same moment (it once overshot to 3,730):
    each ends at most at its cap, within one request of it, every refusal a 429, nothing admitted unchecked (the
    plugin's fail-open counter stays 0). Then a completions batch that can never fit is refused (400), and one
    that fits is counted for every prompt."""
    path = write_config(tmp_path, fleet, smollm2_dir, redis_url=redis_server_url, key_prefix=key_prefix)
    config = yaml.safe_load(path.read_text())
    args = config["router_settings"]["routing_strategy_args"]
    args["budgets"] = budgets_e2e.LOADED_BUDGETS
    args["placement"]["store_timeout_s"] = 0.25  # the production default: a reservation must not depend on it
    (tmp_path / "team_key_auth.py").write_text(TEAM_KEY_AUTH)
    config["general_settings"]["custom_auth"] = "team_key_auth.user_api_key_auth"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    export, cognitora_yaml = export_config(path)
    proxy = LiteLLMProxy(path, tmp_path, salt="loaded")
    try:
        assert export.proc.wait(timeout=60) == 0, export.log_tail()
        teams = (*budgets_e2e.LOADED_TEAMS, budgets_e2e.BATCH_TEAM)
        headers = {t: {"Authorization": f"Bearer sk-team-{t}"} for t in teams}
        metrics_url = f"{proxy.url}/cognitora/metrics"
        used = budgets_e2e.loaded_run(proxy.url, headers, "chat", cognitora_yaml, metrics_url)
        print("litellm 2 x 100 concurrent", used)
    except BaseException:
        print(proxy.process.log_tail(80))
        raise
    finally:
        proxy.stop()
