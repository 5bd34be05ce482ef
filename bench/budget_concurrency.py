"""Budget admission under concurrency, through both real gateways, on Redis and on a Redis Cluster.

    .venv/bin/python -m bench.budget_concurrency --rounds 3 --reserve-batch 256,1 --out bench/results

For each store (a private ``redis-server``; a 3-master Redis Cluster, ``bench/harness/redis_cluster.py``) and
each gateway (the real Envoy on ``examples/envoy.yaml`` + ``cognitora extproc``; the real LiteLLM proxy with
``routing_strategy: cognitora`` and a ``custom_auth`` module that maps ``sk-team-<name>`` to team ``<name>``), one
gateway is started on a fresh simulated fleet of 4 engines (``time_scale`` 10), and then, per round, three cells:

| teams | requests per team | at once | cap per team (total_tokens, day) |
|---|---|---|---|
| 2 | 100 | 200 | 2,000 |
| 10 | 50 | 500 | 1,000 |
| 50 | 20 | 1,000 | 400 |

Every request of a cell is sent at the same moment (one connection each; a chat of ~45 prompt tokens,
``max_tokens`` 20, a third streamed), each team fresh (its own counters), about a third of each team's requests
fitting its cap. Per cell:

- **over cap**: per team and day window, the tokens counted in Redis (``used``, as ``cognitora budgets show``
  reads it) minus its cap, when positive; the worst team and the sum over teams (a cell that runs over midnight
  UTC counts into two windows, each read). It must be 0: the simulated engines generate exactly
  ``max_tokens`` and count prompts as the router does, so no request's usage exceeds its estimate (the only
  overshoot a correct ledger allows). ``largest request`` gives the scale of one request;
- **reserve p50 / p99**: from the gateway's own histogram ``cognitora_budget_reserve_duration_seconds`` (the delta
  over the cell; linear inside a bucket, as Prometheus' ``histogram_quantile``): the time from a reservation
  being sent to its verdict, batching included;
- **fail-open**: the delta of ``cognitora_budget_fail_open_total``: requests admitted without a check. Must be 0
  (Redis is up throughout);
- what the clients got: 200 / 429 / anything else, how many 503s were the budget's (``store_slow``: the wait
  passed ``budgets.reserve_timeout_s``; the others are the gateway's own), the tokens charged beyond what the
  served requests used, and the cell's wall time.

``--reserve-batch 256,1`` runs the design (group commit, up to 256 reservations per script call) beside one call
per request, on the stores named by ``--ablation-stores`` (default: Redis only, to keep the run short).

The budget store is deliberately NOT the shared Redis of the machine (other engineers' tests use it). The gateways
read no collector (placement decides on their own in-flight counts: this measures admission, not placement).
Writes ``<out>/budget_concurrency.md`` and ``.json``; the machine's load (load average, the busiest processes) at
the start and the end is recorded in both, because this 2-core machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import secrets
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import yaml

from bench.harness.redis_cluster import redis_cluster
from bench.harness.redis_server import free_port, private_redis
from bench.harness.team_key_auth import TEAM_KEY_AUTH
from cognitora.budgets.config import BudgetsConfig
from cognitora.budgets.plan import Planner
from cognitora.budgets.redis_ledger import RedisLedger
from cognitora.identity import Identity
from cognitora.redaction import redact
from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.harness.process import ManagedProcess
from cognitora_sim.launch import SimFleet, start_fleet
from cognitora_sim.tokenizer import SMOLLM2_DIR

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2"
MAX_TOKENS = 20
CELLS: tuple[tuple[int, int, int], ...] = ((2, 100, 2_000), (10, 50, 1_000), (50, 20, 400))
"""(teams, requests per team, cap per team)."""


@dataclass
class Cell:
    store: str
    gateway: str
    reserve_batch: int
    round: int
    teams: int
    per_team: int
    cap: int
    wall_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    used: list[int] = field(default_factory=list)
    over_cap_max: int = 0
    over_cap_sum: int = 0
    largest_request: int = 0
    reserve_p50_ms: float = math.nan
    reserve_p99_ms: float = math.nan
    reservations: int = 0
    fail_open: int = 0
    store_slow: int = 0
    """Requests refused 503 because their reservation waited past ``budgets.reserve_timeout_s``."""
    charged_unserved: int = 0
    """Tokens counted in Redis beyond what the served requests used (requests charged though the client got none)."""

    @property
    def concurrent(self) -> int:
        return self.teams * self.per_team


# -- the gateways -----------------------------------------------------------------------------------------------


class Gateway:
    """A running gateway: where to send requests, how to authenticate as a team, its metrics page."""

    name = ""
    chat_url = ""
    metrics_url = ""

    def headers(self, team: str) -> dict[str, str]:
        raise NotImplementedError


class EnvoyGateway(Gateway):
    name = "envoy"

    def __init__(self, url: str, metrics_url: str, secret: bytes) -> None:
        self.chat_url = f"{url}/v1/chat/completions"
        self.metrics_url = metrics_url
        self._secret = secret
        self._tokens: dict[str, str] = {}

    def headers(self, team: str) -> dict[str, str]:
        token = self._tokens.get(team)
        if token is None:
            claims = {"iss": "cognitora-example", "exp": int(time.time()) + 3600, "team": team, "sub": f"{team}-key"}
            token = self._tokens[team] = jwt.encode(claims, self._secret, algorithm="HS256", headers={"kid": "demo"})
        return {"Authorization": f"Bearer {token}"}


class LiteLLMGateway(Gateway):
    name = "litellm"

    def __init__(self, url: str) -> None:
        self.chat_url = f"{url}/v1/chat/completions"
        self.metrics_url = f"{url}/cognitora/metrics"

    def headers(self, team: str) -> dict[str, str]:
        return {"Authorization": f"Bearer sk-team-{team}"}


def cognitora_config(fleet: SimFleet, store: Mapping[str, Any], budgets: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **store,
        "models": [
            {
                "name": fleet.model,
                "tokenizer": str(SMOLLM2_DIR / "tokenizer.json"),
                "chat_template": str(SMOLLM2_DIR / "chat_template.jinja"),
                "endpoints": [{"url": url} for url in fleet.urls],
            }
        ],
        "budgets": dict(budgets),
    }


@contextmanager
def envoy(fleet: SimFleet, store: Mapping[str, Any], budgets: Mapping[str, Any], workdir: Path) -> Iterator[Gateway]:
    path = workdir / "cognitora.yaml"
    path.write_text(yaml.safe_dump(cognitora_config(fleet, store, budgets)))
    secret = secrets.token_bytes(32)
    metrics = free_port()
    args = ["--metrics-listen", f"127.0.0.1:{metrics}"]
    with start_gateway(path, fleet.endpoint_ids, workdir, embedded=False, jwt_secret=secret, extproc_args=args) as gw:
        yield EnvoyGateway(gw.url, f"http://127.0.0.1:{metrics}/metrics", secret)


@contextmanager
def litellm(fleet: SimFleet, store: Mapping[str, Any], budgets: Mapping[str, Any], workdir: Path) -> Iterator[Gateway]:
    args = cognitora_config(fleet, store, budgets)
    args["models"] = [{k: v for k, v in args["models"][0].items() if k != "endpoints"}]
    args["models"][0]["name"] = "chat"
    config = {
        "model_list": [
            {
                "model_name": "chat",
                "litellm_params": {"model": f"openai/{fleet.model}", "api_base": f"{url}/v1", "api_key": "none"},
                # No KV events: in Redis mode the proxy reads the store; this measures admission, not placement.
                "model_info": {"id": f"engine-{i}", "cognitora_engine": "vllm"},
            }
            for i, url in enumerate(fleet.urls)
        ],
        "router_settings": {"routing_strategy": "cognitora", "routing_strategy_args": args},
        "litellm_settings": {
            "telemetry": False,
            "request_timeout": 600,
            "callbacks": ["litellm_plugin.callbacks.cognitora"],
        },
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            "custom_auth": "team_key_auth.user_api_key_auth",
        },
    }
    (workdir / "team_key_auth.py").write_text(TEAM_KEY_AUTH)
    path = workdir / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    env = {
        "LITELLM_MASTER_KEY": "sk-bench-" + secrets.token_hex(8),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "PYTHONPATH": str(ROOT),
    }
    argv = [str(Path(sys.executable).with_name("litellm")), "--config", str(path), "--host", "127.0.0.1"]
    proxy = ManagedProcess(
        [*argv, "--port", str(port), "--num_workers", "1"], workdir / "litellm.log", env=env, cwd=workdir
    )
    try:
        proxy.wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=240)
        yield LiteLLMGateway(f"http://127.0.0.1:{port}")
    finally:
        proxy.stop()


# -- one cell ---------------------------------------------------------------------------------------------------


def body(team: str, i: int) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "chat",
        "messages": [{"role": "user", "content": f"Team {team}, question {i}: what is a KV cache, in short?"}],
        "max_tokens": MAX_TOKENS,
        "stream": i % 3 == 0,
    }
    if data["stream"]:
        data["stream_options"] = {"include_usage": True}
    return data


async def one_request(client: httpx.AsyncClient, gw: Gateway, team: str, i: int, model: str) -> tuple[str, int, int]:
    data = body(team, i)
    data["model"] = model
    try:
        if not data["stream"]:
            r = await client.post(gw.chat_url, json=data, headers=gw.headers(team))
            used = 0
            if r.status_code == 200:
                usage = r.json()["usage"]
                used = usage["prompt_tokens"] + usage["completion_tokens"]
            return team, r.status_code, used
        async with client.stream("POST", gw.chat_url, json=data, headers=gw.headers(team)) as r:
            used = 0
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        used = usage["prompt_tokens"] + usage["completion_tokens"]
            return team, r.status_code, used
    except httpx.HTTPError:
        return team, -1, 0


async def fire(gw: Gateway, teams: Sequence[str], per_team: int, model: str) -> list[tuple[str, int, int]]:
    limits = httpx.Limits(max_connections=len(teams) * per_team + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        jobs = [one_request(client, gw, team, i, model) for i in range(per_team) for team in teams]
        return list(await asyncio.gather(*jobs))


def scrape(url: str) -> str:
    return httpx.get(url, timeout=30).text


def sample(page: str, name: str, labels: str = "") -> float:
    total = 0.0
    for line in page.splitlines():
        key, _, value = line.rpartition(" ")
        if key == f"{name}{labels}":
            total += float(value)
    return total


def buckets(page: str, name: str) -> list[tuple[float, float]]:
    out: dict[float, float] = {}
    prefix = f'{name}_bucket{{le="'
    for line in page.splitlines():
        if line.startswith(prefix):
            bound = line[len(prefix) :].split('"', 1)[0]
            le = math.inf if bound == "+Inf" else float(bound)
            out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return sorted(out.items())


def quantile(q: float, cumulative: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile``: linear inside the bucket that holds rank q."""
    if not cumulative or cumulative[-1][1] <= 0:
        return math.nan
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


def diff(after: Sequence[tuple[float, float]], before: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    was = dict(before)
    return [(le, count - was.get(le, 0.0)) for le, count in after]


async def team_used(
    ledger: RedisLedger, budgets: BudgetsConfig, teams: Sequence[str], moments: Sequence[float]
) -> list[list[int]]:
    """Each team's counter in the day window of each of ``moments`` (the cell's start and end: a cell that runs
    over midnight UTC counts into two windows), as ``cognitora budgets show`` reads it (settled usage plus open
    reservations); one list per distinct window."""
    planner = Planner(budgets)
    out: list[list[int]] = []
    seen: set[str] = set()
    for moment in moments:
        plans = [planner.plan("-", Identity(team=t), MODEL, planner.usage(MODEL, 0, 0), moment) for t in teams]
        if plans[0].counters[0].name in seen:
            continue
        seen.add(plans[0].counters[0].name)
        out.append(await ledger.counter_values([p.counters[0] for p in plans], int(moment * 1000)))
    return out


def run_cell(gw: Gateway, cell: Cell, teams: Sequence[str], model: str, ledger_of: Any, budgets: BudgetsConfig) -> None:
    hist = "cognitora_budget_reserve_duration_seconds"
    before = scrape(gw.metrics_url)
    started, began = time.monotonic(), time.time()
    results = asyncio.run(fire(gw, teams, cell.per_team, model))
    cell.wall_s = round(time.monotonic() - started, 2)
    # Let the last settles land (they are written in the background after each response).
    time.sleep(1.0)
    after = scrape(gw.metrics_url)
    for _, status, _ in results:
        cell.statuses[str(status)] = cell.statuses.get(str(status), 0) + 1
    cell.largest_request = max((u for _, s, u in results if s == 200), default=0)
    windows = asyncio.run(_read_used(ledger_of, budgets, teams, (began, time.time())))
    used = [sum(values) for values in zip(*windows, strict=True)]
    cell.used = used
    cell.charged_unserved = sum(used) - sum(u for _, s, u in results if s == 200)
    over = [max(0, u - cell.cap) for values in windows for u in values]  # the cap holds per window
    cell.over_cap_max, cell.over_cap_sum = max(over), sum(over)
    delta = diff(buckets(after, hist), buckets(before, hist))
    cell.reservations = int(delta[-1][1]) if delta else 0
    cell.reserve_p50_ms = round(quantile(0.5, delta) * 1000, 2)
    cell.reserve_p99_ms = round(quantile(0.99, delta) * 1000, 2)
    name = "cognitora_budget_fail_open_total"
    cell.fail_open = int(sample(after, name) - sample(before, name))
    cell.store_slow = int(reason_total(after, "store_slow") - reason_total(before, "store_slow"))


def reason_total(page: str, reason: str) -> float:
    """``cognitora_budget_rejections_total`` summed over teams, for one reason."""
    total = 0.0
    for line in page.splitlines():
        if line.startswith("cognitora_budget_rejections_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _read_used(
    ledger_of: Any, budgets: BudgetsConfig, teams: Sequence[str], moments: Sequence[float]
) -> list[list[int]]:
    ledger = ledger_of()
    try:
        return await team_used(ledger, budgets, teams, moments)
    finally:
        await ledger.close()


# -- the run ----------------------------------------------------------------------------------------------------


def machine_load() -> dict[str, Any]:
    """What else ran on this shared machine: the load average and the busiest processes (command lines cut)."""
    busiest = subprocess.run(
        ["ps", "-eo", "pcpu,etimes,args", "--sort=-pcpu"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[1:9]
    return {"loadavg": list(os.getloadavg()), "busiest": [redact(" ".join(line.split())[:110]) for line in busiest]}


def team_names(rounds: int, run: str) -> dict[tuple[int, int], list[str]]:
    return {
        (r, c): [f"{run}-r{r}-c{c}-t{t}" for t in range(CELLS[c][0])] for r in range(rounds) for c in range(len(CELLS))
    }


def budgets_for(names: Mapping[tuple[int, int], Sequence[str]]) -> dict[str, Any]:
    teams = {}
    for (_, c), cell_teams in names.items():
        for team in cell_teams:
            teams[team] = {"limits": [{"window": "day", "total_tokens": CELLS[c][2]}]}
    return {"teams": teams}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", default="redis,cluster")
    parser.add_argument("--gateways", default="envoy,litellm")
    parser.add_argument("--cells", default="0,1,2", help="indices into CELLS")
    parser.add_argument(
        "--reserve-batch", default="256,1", help="budgets.reserve_batch values to compare (1: a call each request)"
    )
    parser.add_argument(
        "--ablation-stores", default="redis", help="stores that run every --reserve-batch value (others: the first)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    command = "python -m bench.budget_concurrency " + " ".join(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    cells = [int(c) for c in args.cells.split(",")]
    load_before = machine_load()
    results: list[Cell] = []
    run = uuid.uuid4().hex[:6]
    names = team_names(args.rounds, run)
    budget_section = budgets_for(names)
    budgets = BudgetsConfig.model_validate(budget_section)
    for store in args.stores.split(","):
        with ExitStack() as stack:
            if store == "redis":
                settings: dict[str, Any] = {"redis_url": stack.enter_context(private_redis())}
            else:
                settings = {"redis_url": stack.enter_context(redis_cluster()), "redis_cluster": True}
            for gateway in args.gateways.split(","):
                batches = [int(b) for b in args.reserve_batch.split(",")]
                for batch in batches if store in args.ablation_stores.split(",") else batches[:1]:
                    store_settings = {**settings, "key_prefix": f"bench-{run}-{store}-{gateway}-{batch}"}
                    section = {**budget_section, "reserve_batch": batch}
                    results += run_gateway(store, gateway, batch, store_settings, section, budgets, names, args, cells)
    load_after = machine_load()
    write(args.out, command, results, load_before, load_after)
    return 0


def run_gateway(
    store: str,
    gateway: str,
    batch: int,
    store_settings: Mapping[str, Any],
    section: Mapping[str, Any],
    budgets: BudgetsConfig,
    names: Mapping[tuple[int, int], Sequence[str]],
    args: argparse.Namespace,
    cells: Sequence[int],
) -> list[Cell]:
    """One gateway on ``store`` with ``budgets.reserve_batch`` = ``batch``, on a fleet of its own: every round's
    cells, one after another."""

    def ledger_of() -> RedisLedger:
        cluster = bool(store_settings.get("redis_cluster"))
        return RedisLedger.from_url(store_settings["redis_url"], store_settings["key_prefix"], 2, cluster=cluster)

    out: list[Cell] = []
    start = envoy if gateway == "envoy" else litellm
    with (
        _tempdir(f"budget-bench-{store}-{gateway}-") as workdir,
        start_fleet(4, time_scale=10.0, tokenizer=SMOLLM2_DIR / "tokenizer.json", log_dir=Path(workdir)) as fleet,
        start(fleet, store_settings, section, Path(workdir)) as gw,
    ):
        model = fleet.model if gateway == "envoy" else "chat"
        asyncio.run(fire(gw, ["warm-up"], 4, model))  # connections open, scripts loaded: a gateway that is running
        for r in range(args.rounds):
            for c in cells:
                teams, per_team, cap = CELLS[c]
                cell = Cell(store, gateway, batch, r, teams, per_team, cap)
                run_cell(gw, cell, names[(r, c)], model, ledger_of, budgets)
                print(json.dumps(asdict(cell)), flush=True)
                out.append(cell)
    return out


@contextmanager
def _tempdir(prefix: str) -> Iterator[str]:
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _spread(values: Sequence[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    if len(finite) == 1:
        return f"{finite[0]:g}"
    return f"{statistics.median(finite):g} ({min(finite):g}..{max(finite):g})"


def write(out: Path, command: str, cells: Sequence[Cell], before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    groups: dict[tuple[str, str, int, int], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.store, cell.gateway, cell.reserve_batch, cell.teams), []).append(cell)
    for (store, gateway, batch, teams), group in groups.items():
        first = group[0]
        statuses: dict[str, int] = {}
        for cell in group:
            for status, n in cell.statuses.items():
                statuses[status] = statuses.get(status, 0) + n
        rows.append(
            f"| {store} | {gateway} | {batch} | {teams} x {first.per_team} = {first.concurrent} | {first.cap:,} | "
            f"{max(c.over_cap_max for c in group)} | {sum(c.over_cap_sum for c in group)} | "
            f"{max(c.largest_request for c in group)} | {_spread([c.reserve_p50_ms for c in group])} | "
            f"{_spread([c.reserve_p99_ms for c in group])} | {sum(c.fail_open for c in group)} | "
            f"{', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))} | {sum(c.store_slow for c in group)} | "
            f"{sum(c.charged_unserved for c in group)} | {_spread([c.wall_s for c in group])} |"
        )
    md = [
        "# Budget admission under concurrency",
        "",
        "```",
        command,
        "```",
        "",
        f"{len({c.round for c in cells})} rounds per cell (fresh teams each round); {platform.node()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}. bench/budget_concurrency.py says how each figure "
        "is taken. Over cap: tokens counted in Redis beyond a team's cap (max over teams and rounds; sum). Reserve "
        "p50/p99: the gateway's own histogram, median over rounds (range). Fail-open: requests admitted without a "
        "check (Redis is up: must be 0). Statuses: every request of every round; 503s that are not store_slow are "
        "the gateway's own (Envoy's ext_proc message_timeout, 2 s in examples/envoy.yaml). Charged, not served: "
        "tokens counted beyond what the served requests used (sum over rounds).",
        "",
        "| store | gateway | reserve_batch | teams x requests = at once | cap | over cap, max | over cap, sum "
        "| largest request | reserve p50 ms | reserve p99 ms | fail-open | statuses | of which 503 store_slow "
        "| charged, not served | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "## The machine during the run (shared: other engineers' tests ran beside it)",
        "",
        f"- load average at the start: {', '.join(f'{x:.2f}' for x in before['loadavg'])}; at the end: "
        f"{', '.join(f'{x:.2f}' for x in after['loadavg'])}",
        "- busiest processes at the start:",
        *[f"  - `{line}`" for line in before["busiest"]],
        "- busiest processes at the end:",
        *[f"  - `{line}`" for line in after["busiest"]],
        "",
    ]
    (out / "budget_concurrency.md").write_text("\n".join(md))
    data = {"command": command, "load_before": before, "load_after": after, "cells": [asdict(c) for c in cells]}
    (out / "budget_concurrency.json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
