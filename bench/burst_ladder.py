"""``python -m bench.burst_ladder``: an overload ladder (1x .. 3x the fleet's capacity) through the real LiteLLM
proxy, three ways, side by side on the same fleet and the same schedule:

- ``cognitora-burst``: Cognitora with ``burst:`` to a cloud deployment (examples/litellm_burst.yaml);
- ``cognitora-local``: the same config with burst off (nobody may burst);
- ``litellm-fallbacks``: LiteLLM's own mechanism, the peer: ``simple-shuffle`` on the engine, ``fallbacks`` to
  the same cloud deployment, triggered by a ``stream_timeout`` of the SLO (no first byte within it: error, then
  the fallback), as LiteLLM documents it.

The fleet: one slow simulated engine (``mac`` profile) and ``cognitora sim cloud`` (its own latency model and
prices). Per arm and rung: goodput (answers with a first token within the SLO, per second), SLO attainment (their
share of requests sent), cloud share (answered by the cloud), errors, and cost per 1,000 requests (the cloud's own
cost counter). Arrivals are Poisson at ``rate x capacity``; capacity is ``--capacity-rps`` (measured: the rate one
engine serves within the SLO, see bench/results/burst_ladder.md). Results: JSON and Markdown under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.burst_load import CLOUD_MODEL, Answer, chat
from bench.cloud_stacks import start_litellm_proxy
from cognitora_sim.cloud_launch import SimCloudProcess, start_cloud
from cognitora_sim.harness.process import wait_until
from cognitora_sim.launch import SimFleet, start_fleet

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "litellm_burst.yaml"
LITELLM = Path(sys.executable).parent / "litellm"
TOKENIZER = ROOT / "cognitora" / "models" / "smollm2-135m-instruct" / "tokenizer.json"
ARMS = ("cognitora-burst", "cognitora-local", "litellm-fallbacks")
TEAM_KEY = "sk-bench-research"
AUTH_MODULE = """
import os
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    return UserAPIKeyAuth(api_key=key, team_id="research")
"""


@dataclass
class Rung:
    arm: str
    rate_x: float
    rps: float
    sent: int
    ok: int
    within_slo: int
    cloud: int
    errors: int
    goodput_rps: float
    slo_attainment: float
    cloud_share: float
    local_ttft_p90_s: float | None
    cost_usd: float
    cost_per_1000_usd: float


def proxy_config(arm: str, fleet: SimFleet, cloud: SimCloudProcess, slo_s: float, work: Path) -> Path:
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    engine, cloud_dep = config["model_list"]
    engine["litellm_params"]["api_base"] = f"{fleet.urls[0]}/v1"
    cloud_dep["litellm_params"]["api_base"] = cloud.base_url
    settings = config["router_settings"]
    args = settings["routing_strategy_args"]
    args["models"][0]["tokenizer"] = str(TOKENIZER)
    args["placement"]["priorities"]["default"]["ttft_slo_s"] = slo_s
    args["burst"]["team_spend_limit_usd"] = {}
    if arm == "cognitora-local":
        args["burst"]["teams"] = []
    elif arm == "litellm-fallbacks":
        # The peer: the cloud deployment in its own group, reached only through LiteLLM's fallbacks.
        cloud_dep["model_name"] = "chat-cloud"
        cloud_dep["model_info"] = {"id": "cloud-0"}
        engine["model_info"] = {"id": "engine-0"}
        engine["litellm_params"]["stream_timeout"] = slo_s
        config["router_settings"] = {
            "routing_strategy": "simple-shuffle",
            "num_retries": 0,
            "fallbacks": [{"chat": ["chat-cloud"]}],
        }
        config["litellm_settings"] = {}
    (work / "bench_auth.py").write_text(AUTH_MODULE)
    config["general_settings"]["custom_auth"] = "bench_auth.user_api_key_auth"
    path = work / f"litellm-{arm}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def open_loop(url: str, rps: float, duration_s: float, seed: str, tag: str) -> list[Answer]:
    """Poisson arrivals at ``rps`` for ``duration_s`` (the schedule is ``seed``'s: the same for every arm);
    every request is awaited to its end. ``tag`` makes the prompts unique (no arm finds another's cached)."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {TEAM_KEY}"}
    tasks: list[asyncio.Task[Answer]] = []
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(i: int) -> Answer:
            try:
                return await chat(client, url, headers, f"{tag}-{i}")
            except httpx.HTTPError as exc:
                return Answer(0, None, "", f"{type(exc).__name__}: {exc}")

        start = time.monotonic()
        at, i = 0.0, 0
        while at < duration_s:
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            at += rng.expovariate(rps)
        return list(await asyncio.gather(*tasks))


def idle(fleet: SimFleet) -> None:
    def quiet() -> bool:
        state = fleet.state(0)
        return state.get("running") == 0 and state.get("waiting") == 0

    wait_until(quiet, 120, "the engine to drain")


def rung(
    arm: str,
    rate_x: float,
    rps: float,
    answers: list[Answer],
    duration_s: float,
    slo_s: float,
    cost: float,
    cloud_base: str,
) -> Rung:
    marks = frozenset({cloud_base, CLOUD_MODEL})
    ok = [a for a in answers if a.status == 200]
    within = [a for a in ok if a.ttft_s is not None and a.ttft_s <= slo_s]
    cloud = [a for a in ok if a.cloud(marks)]
    local = sorted(a.ttft_s for a in ok if not a.cloud(marks) and a.ttft_s is not None)
    p90 = local[max(0, -(-9 * len(local) // 10) - 1)] if local else None
    n = len(answers)
    return Rung(
        arm,
        rate_x,
        rps,
        n,
        len(ok),
        len(within),
        len(cloud),
        n - len(ok),
        len(within) / duration_s,
        len(within) / n if n else 0.0,
        len(cloud) / n if n else 0.0,
        p90,
        cost,
        1000 * cost / n if n else 0.0,
    )


def run(args: argparse.Namespace) -> list[Rung]:
    rates = [float(x) for x in args.rates.split(",")]
    rows: list[Rung] = []
    with tempfile.TemporaryDirectory(prefix="burst-ladder-") as tmp:
        work = Path(tmp)
        env = {"CLOUD_API_KEY": "sk-bench-" + secrets.token_hex(8)}
        cloud_args = [
            "--api-key-env",
            "CLOUD_API_KEY",
            "--models",
            CLOUD_MODEL,
            "--ttft-ms",
            "300",
            "--rtt-ms",
            "40",
            "--max-concurrency",
            "64",
        ]
        with (
            start_fleet(1, profile="mac", tokenizer=TOKENIZER, log_dir=work) as fleet,
            start_cloud(log_dir=work, args=cloud_args, env=env) as cloud,
        ):
            for arm in args.arms.split(","):
                proc, url = start_litellm_proxy(proxy_config(arm, fleet, cloud, args.slo_s, work), work, env)
                try:
                    asyncio.run(open_loop(url, 0.5, 4, "warm", f"{arm}-warm"))  # the proxy's clients set up
                    for x in rates:
                        idle(fleet)
                        before = cloud.metrics().get("sim_cloud_cost_usd_total", 0.0)
                        rps = x * args.capacity_rps
                        schedule = f"{x}-{args.seed}"
                        answers = asyncio.run(open_loop(url, rps, args.stage_s, schedule, f"{arm}-{schedule}"))
                        cost = cloud.metrics().get("sim_cloud_cost_usd_total", 0.0) - before
                        row = rung(arm, x, rps, answers, args.stage_s, args.slo_s, cost, cloud.base_url)
                        print(json.dumps(asdict(row)), flush=True)
                        rows.append(row)
                finally:
                    proc.stop()
    return rows


def markdown(runs: list[list[Rung]], command: str, slo_s: float) -> str:
    out = [
        "# Burst ladder: Cognitora + burst vs Cognitora local-only vs LiteLLM fallbacks",
        "",
        f"Command: `{command}`",
        "",
        f"One simulated `mac` engine, `cognitora sim cloud` (RTT 40 ms, TTFT 300 ms, $0.15/$0.60 per M tokens), "
        f"the real LiteLLM proxy 1.108.7; streamed chat, ~850 prompt / 24 output tokens, Poisson arrivals; "
        f"SLO: TTFT {slo_s:g} s at the client. {len(runs)} runs; median [min, max] over runs. This machine is "
        "shared (2 cores, other engineers' tests running): client-side TTFTs include the proxy's overhead under "
        "that noise.",
        "",
        "| arm | load | goodput (req/s) | SLO attainment | cloud share | errors | local TTFT p90 (s) | cost / 1k req |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r.arm, r.rate_x) for run in runs for r in run}, key=lambda k: (ARMS.index(k[0]), k[1]))

    def span(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"

    for arm, x in keys:
        rows = [r for run in runs for r in run if (r.arm, r.rate_x) == (arm, x)]
        p90s = [r.local_ttft_p90_s for r in rows if r.local_ttft_p90_s is not None]
        out.append(
            f"| {arm} | {x:g}x | {span([r.goodput_rps for r in rows], '.2f')} | "
            f"{span([r.slo_attainment for r in rows], '.2f')} | {span([r.cloud_share for r in rows], '.2f')} | "
            f"{span([float(r.errors) for r in rows], '.0f')} | {span(p90s, '.2f')} | "
            f"${span([r.cost_per_1000_usd for r in rows], '.3f')} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.burst_ladder", description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1,2,3", help="multiples of --capacity-rps")
    p.add_argument("--capacity-rps", type=float, default=0.5, help="what the engine serves within the SLO")
    p.add_argument("--stage-s", type=float, default=15.0)
    p.add_argument("--slo-s", type=float, default=2.5)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "burst_ladder")
    args = p.parse_args(argv)
    command = "python -m bench.burst_ladder " + " ".join(argv if argv is not None else sys.argv[1:])
    runs: list[list[Rung]] = []
    for i in range(args.runs):
        args.seed = i
        runs.append(run(args))
        args.out.with_suffix(".json").write_text(
            json.dumps({"command": command, "runs": [[asdict(r) for r in run_] for run_ in runs]}, indent=1)
        )
        args.out.with_suffix(".md").write_text(markdown(runs, command, args.slo_s))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
