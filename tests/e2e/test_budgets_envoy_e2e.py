"""Budgets through the real Envoy (examples/envoy.yaml) and ``cognitora extproc`` on Redis, to a simulated fleet.
Envoy authenticates for real: the example's ``jwt_authn`` with a fresh JWKS and API keys minted by
``cognitora.api_keys`` whose claims name the team, the key and the user. Two teams, one runs out
mid-run and gets 429s with the right Retry-After, the other is untouched; a client's own team header is stripped;
the report, read by ``cognitora budgets report`` from Redis alone, agrees with the engines' own token counters."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.harness.redis_server import free_port
from cognitora import api_keys
from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support import budgets_e2e

pytestmark = pytest.mark.e2e


def token(jwks: str, team: str, key: str, user: str) -> str:
    return api_keys.mint(jwks, team=team, key_id=key, user=user, expires_in_s=600)


def write_config(
    tmp_path: Path,
    fleet: SimFleet,
    smollm2_dir: Path,
    redis_url: str,
    key_prefix: str,
    budgets: dict[str, Any],
    store_timeout_s: float | None = 2.0,
) -> Path:
    """cognitora.yaml for the fleet on Redis with ``budgets``; ``store_timeout_s`` None: the production default."""
    config: dict[str, Any] = {
        "redis_url": redis_url,
        "key_prefix": key_prefix,
        "models": [
            {
                "name": fleet.model,
                "tokenizer": str(smollm2_dir / "tokenizer.json"),
                "chat_template": str(smollm2_dir / "chat_template.jinja"),
                "endpoints": [{"url": url} for url in fleet.urls],
            }
        ],
        "budgets": budgets,
    }
    if store_timeout_s is not None:
        config["placement"] = {"store_timeout_s": store_timeout_s}
    path = tmp_path / "cognitora.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_two_teams_one_runs_out_through_envoy(
    tmp_path: Path, redis_server_url: str, key_prefix: str, smollm2_dir: Path
) -> None:
    with start_fleet(4, time_scale=10.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet:
        config_path = write_config(tmp_path, fleet, smollm2_dir, redis_server_url, key_prefix, budgets_e2e.BUDGETS)
        secret = api_keys.new_jwks()
        with start_gateway(config_path, fleet.endpoint_ids, tmp_path, embedded=False, jwks=secret) as stack:
            extproc = stack.extproc
            try:
                url = f"{stack.url}/v1/chat/completions"
                headers = {
                    # alpha also claims to be beta in a header: Envoy strips it before auth, so alpha still runs out
                    "alpha": {
                        "Authorization": f"Bearer {token(secret, 'alpha', 'alpha-key', 'alice')}",
                        "x-cognitora-team": "beta",
                    },
                    "beta": {"Authorization": f"Bearer {token(secret, 'beta', 'beta-key', 'bob')}"},
                }
                traffic = asyncio.run(budgets_e2e.two_teams(url, headers, model=fleet.model))
                report = budgets_e2e.budgets_cli("report", "--config", str(config_path), cwd=tmp_path)
                figures = budgets_e2e.check_two_teams(traffic, report, budgets_e2e.engine_tokens(fleet.urls))
                rows = {(r["kind"], r["subject"]) for r in report["usage"]}
                assert {("key", "alpha-key"), ("user", "alice"), ("key", "beta-key"), ("user", "bob")} <= rows

                # No key, with a header naming the exhausted team, and a key that is no JWT: refused by the auth
                # filter (the example requires a key), counted for nobody.
                anonymous = budgets_e2e.body("anyone", 0, False, fleet.model)
                r = httpx.post(url, json=anonymous, headers={"x-cognitora-team": "alpha"}, timeout=60)
                assert r.status_code == 401, r.text
                bad = httpx.post(url, json=anonymous, headers={"Authorization": "Bearer not.a.jwt"}, timeout=60)
                assert bad.status_code == 401
                after = budgets_e2e.team_totals(
                    budgets_e2e.budgets_cli("report", "--config", str(config_path), cwd=tmp_path)
                )
                assert "-" not in after and after["alpha"] == budgets_e2e.team_totals(report)["alpha"]
                print("envoy budgets", figures)
            except BaseException:
                print(extproc.log_tail(60))
                raise


def test_two_teams_at_100_concurrent_never_overshoot_through_envoy(
    tmp_path: Path, redis_server_url: str, key_prefix: str, smollm2_dir: Path
) -> None:
    """Two teams with a 2,000-token cap send 100 requests each at the same moment (it once overshot to 5,226):
    each ends at most at its cap, within one request of it, with every refusal a 429 and no request admitted
    without a check (the extproc's fail-open counter stays 0). Then a completions batch that can never fit is
    refused (400), and one that fits is counted for every prompt."""
    with start_fleet(4, time_scale=10.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet:
        budgets = budgets_e2e.LOADED_BUDGETS
        # (placement.store_timeout_s: the production default, 0.25 s: a reservation must not depend on it)
        config_path = write_config(tmp_path, fleet, smollm2_dir, redis_server_url, key_prefix, budgets, None)
        secret = api_keys.new_jwks()
        metrics = free_port()
        args = ["--metrics-listen", f"127.0.0.1:{metrics}"]
        with start_gateway(
            config_path, fleet.endpoint_ids, tmp_path, embedded=False, jwks=secret, extproc_args=args
        ) as stack:
            try:
                teams = (*budgets_e2e.LOADED_TEAMS, budgets_e2e.BATCH_TEAM)
                headers = {t: {"Authorization": f"Bearer {token(secret, t, f'{t}-key', f'{t}-user')}"} for t in teams}
                metrics_url = f"http://127.0.0.1:{metrics}/metrics"
                used = budgets_e2e.loaded_run(stack.url, headers, fleet.model, config_path, metrics_url)
                print("envoy 2 x 100 concurrent", used)
            except BaseException:
                print(stack.extproc.log_tail(60))
                raise
