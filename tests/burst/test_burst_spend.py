"""Burst spend through the budgets ledger (a real Redis): a cloud attempt finished on one Router is a charge the
budgets report shows per target, beside local usage, and the team's cloud spend limit is the one every replica
reads (a second Router refuses to burst once the first spent it). Reading the spend costs a round trip only for a
request that would burst."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cognitora.budgets import cli
from cognitora.burst.ledger_spend import LedgerSpend
from cognitora.config import load_config
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.request import RouteRequest
from cognitora_sim.cloud_launch import start_cloud
from kvstate.redis_store import RedisStore

MODEL = "smollm2"


@pytest.fixture
def config_file(tmp_path: Path, redis_server_url: str, key_prefix: str) -> Path:
    return write_config(tmp_path, redis_server_url, key_prefix)


@pytest.fixture(params=["redis", "cluster"])
def shared_config_file(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> Path:
    """A real Redis, or a real Redis Cluster (the spend counter lives in the budgets' one hash slot)."""
    cluster = request.param == "cluster"
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_server_url")
    return write_config(tmp_path, url, key_prefix, cluster=cluster)


def write_config(tmp_path: Path, redis_url: str, key_prefix: str, *, cluster: bool = False) -> Path:
    data: dict[str, Any] = {
        "redis_url": redis_url,
        "redis_cluster": cluster,
        "key_prefix": key_prefix,
        "placement": {"store_timeout_s": 5.0, "priorities": {"default": {"ttft_slo_s": 2.0}}},
        # One engine so slow (10 tokens/s) that every prompt misses the 2 s SLO: every decision would burst.
        "models": [{"name": MODEL, "endpoints": [{"url": "http://127.0.0.1:18001", "prefill_tokens_per_s": 10}]}],
        "budgets": {
            "prices": {MODEL: {"input_per_million_usd": 1.0, "output_per_million_usd": 1.0}},
            "teams": {"research": {"limits": [{"window": "month", "total_tokens": 1_000_000, "cost_usd": 100.0}]}},
        },
        "burst": {
            "targets": [
                {
                    "name": "cloud",
                    "base_url": "https://cloud.example/v1",
                    "models": {MODEL: "big-model"},
                    "input_usd_per_mtok": 1_000_000.0,  # a dollar a token: the limit is easy to reach
                    "output_usd_per_mtok": 2_000_000.0,
                }
            ],
            "teams": ["research", "ops"],
            "priorities": ["default"],
            # A request below is held at $52 while in flight (48 prompt tokens at $1, max_tokens 2 at $2): the limit
            # lets one go, and not one more after the $6 it spent.
            "team_spend_limit_usd": {"research": 55.0},
        },
    }
    path = tmp_path / "cognitora.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def request(team: str | None = "research") -> RouteRequest:
    return RouteRequest(
        model=MODEL,
        prompt="a prompt of a few words " * 8,
        team=team,
        api_key_id="k-1",
        user="ann",
        priority="default",
        max_tokens=2,
    )


def router_for(config_file: Path) -> Router:
    config = load_config(config_file)
    store = RedisStore.from_url(config.redis_url or "", key_prefix=config.key_prefix, cluster=config.redis_cluster)
    return Router(config, store)


async def spend_on_one_router_is_seen_by_another(config_file: Path) -> None:
    first, second = router_for(config_file), router_for(config_file)
    try:
        gate = first.burst.spend
        assert isinstance(gate, LedgerSpend) and isinstance(second.burst.spend, LedgerSpend)
        local, _ = await first.admit(request(team=None))  # may not burst: no spend read for it
        assert local.cloud is None and gate.reads == 0
        unlimited, attempt = await first.admit(request(team="ops"))  # bursts, but ops has no limit: no read
        assert unlimited.cloud is not None and attempt is not None and gate.reads == 0
        attempt.finish(Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=1, completion_tokens=1))

        decision, attempt = await first.admit(request())
        assert decision.cloud is not None and attempt is not None and gate.reads == 1
        attempt.finish(Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=2, completion_tokens=2))  # $6
        await asyncio.sleep(0)  # the finish runs on the loop
        assert first.budgets is not None
        await first.budgets.drain()

        # This router knows its own spend without a read; the other reads the shared counter.
        assert not first.burst.spend.hold("probe", "research", 52.0)
        refused, served_here = await second.admit(request())
        assert refused.cloud is None and "spend exhausted" in refused.reason and served_here is not None
        served_here.finish(Outcome(OutcomeKind.COMPLETED, status=200, prompt_tokens=48, completion_tokens=10))
        await asyncio.sleep(0)
        assert second.budgets is not None
        await second.budgets.drain()
        assert second.burst.spend.spent_usd("research") == pytest.approx(6.0)
        assert second.burst.denied[(MODEL, "default", "spend_exhausted")] == 1
    finally:
        await first.close()
        await second.close()


def test_burst_spend_is_shared_and_in_the_budgets_report(
    shared_config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = shared_config_file
    asyncio.run(spend_on_one_router_is_seen_by_another(config_file))

    assert cli.main(["report", "--config", str(config_file), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(u["kind"], u["subject"], u["model"], u["target"]): u for u in report["usage"]}
    cloud = rows[("team", "research", MODEL, "cloud")]
    assert (cloud["requests"], cloud["input_tokens"], cloud["output_tokens"], cloud["cost_usd"]) == (1, 2, 2, 6.0)
    assert rows[("key", "k-1", MODEL, "cloud")]["requests"] == 2  # research's and ops' requests, one key
    assert rows[("user", "ann", MODEL, "cloud")]["cost_usd"] == pytest.approx(6.0 + 3.0)
    # Beside it, the request the second router kept local (at the budgets' own price, $1 per million tokens).
    local = rows[("team", "research", MODEL, "local")]
    assert (local["requests"], local["input_tokens"], local["output_tokens"]) == (1, 48, 10)
    # The budget reservation of the burst request was given back, not settled: its tokens are counted once.
    limits = {li["limit"]: li for li in report["limits"]}
    assert limits["budgets.teams.research.limits[0].total_tokens"]["used"] == 4 + 58
    assert limits["budgets.teams.research.limits[0].cost_usd"]["used"] == pytest.approx(6.0 + 58 / 1e6)

    assert cli.main(["report", "--config", str(config_file)]) == 0
    table = capsys.readouterr().out
    assert re.search(r"team\s+research\s+smollm2\s+cloud\s+1\s+2\s+2\s+0\s+6\.0000", table), table
    assert cli.main(["report", "--config", str(config_file), "--format", "csv"]) == 0
    assert "period,kind,subject,model,target,requests" in capsys.readouterr().out


async def serve_through_the_cloud(config_file: Path, n: int) -> None:
    """The gateway's part, done here: admit, send the burst request to the cloud target it names, report the
    answer's usage at the finish (the adapters' translation is tested in the e2e tests)."""
    router = router_for(config_file)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            for i in range(n):
                decision, attempt = await router.admit(request(team="ops"))
                assert decision.cloud is not None and attempt is not None, decision.reason
                body = {
                    "model": decision.cloud.model,
                    "messages": [{"role": "user", "content": f"question {i}: " + "why " * (10 * i + 5)}],
                    "max_tokens": 4 + i,
                }
                r = await client.post(f"{decision.cloud.url}/chat/completions", json=body)
                assert r.status_code == 200, r.text
                usage = r.json()["usage"]
                attempt.first_token()
                attempt.finish(
                    Outcome(
                        OutcomeKind.COMPLETED,
                        status=200,
                        prompt_tokens=usage["prompt_tokens"],
                        completion_tokens=usage["completion_tokens"],
                    )
                )
        await asyncio.sleep(0)
        assert router.budgets is not None
        await router.budgets.drain()
    finally:
        await router.close()


def test_the_report_shows_the_tokens_and_cost_the_cloud_counted(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_cloud(log_dir=tmp_path, args=["--models", "big-model", "--ttft-ms", "5", "--rtt-ms", "1"]) as cloud:
        config = yaml.safe_load(config_file.read_text())
        target = config["burst"]["targets"][0]
        target["base_url"] = cloud.base_url
        target["input_usd_per_mtok"], target["output_usd_per_mtok"] = 0.15, 0.6  # the sim cloud's own prices
        config_file.write_text(yaml.safe_dump(config))
        asyncio.run(serve_through_the_cloud(config_file, 3))
        counted = cloud.metrics()

    assert cli.main(["report", "--config", str(config_file), "--format", "json"]) == 0
    rows = {(u["kind"], u["subject"], u["target"]): u for u in json.loads(capsys.readouterr().out)["usage"]}
    ops = rows[("team", "ops", "cloud")]
    assert ops["requests"] == counted['sim_cloud_requests_total{status="200"}'] == 3
    assert ops["input_tokens"] == counted['sim_cloud_tokens_total{kind="prompt"}']
    assert ops["output_tokens"] == counted['sim_cloud_tokens_total{kind="completion"}']
    assert ops["cost_usd"] == pytest.approx(counted["sim_cloud_cost_usd_total"], abs=2e-6)  # micro-dollar counters
