"""Soak: a steady load through both gateways for ``--duration-s`` (30 minutes by default) with faults on a schedule,
and whether anything drifts. Never part of the test suite (docs/operations.md, "Soak").

    python -m bench.soak --duration-s 1800 --seed 1

The stack, all on loopback: a private ``redis-server``, two simulated engines, ``cognitora collector``, two
``cognitora extproc`` replicas behind Envoy (``examples/envoy.yaml``), and the LiteLLM proxy with the routing
strategy, both gateways on one ``cognitora.yaml`` in Redis mode. Each gateway gets ``--rps`` requests a second
(open loop, fixed interval). Every ``--cycle-s``, in turn: an engine restarts (``/sim/fault restart``), Redis is
killed and started again on its port (its state is lost), the config file is rewritten with another scrape interval
(both gateways reload it). Sampled every 10 s: RSS and open file descriptors of every process. From the gateways'
decision log lines: the decision time's p99 per cycle. An error is a non-200 answer or a transport error; those
within ``FAULT_WINDOW_S`` after a fault are counted apart, as injected.

Writes ``bench/results/soak_seed<seed>.md`` (and ``.json``): per process the RSS and FD slopes (least squares, per
hour) and their first and last values, the errors in and outside fault windows, p99 decision time per cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from cognitora_sim.harness.envoy_launch import render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from cognitora_sim.tokenizer import SMOLLM2_DIR

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LITELLM = Path(sys.executable).parent / "litellm"
FAULT_WINDOW_S = 30.0
SAMPLE_S = 10.0
FAULTS = ("engine-restart", "redis-restart", "config-reload")
WARMUP_S = 300.0
"""Slopes are also fitted from here on: the first minutes load what a process keeps (tokenizers, pools, the engines'
caches filling up to ``--kv-capacity-tokens``), a step a leak does not have."""


@dataclass
class Run:
    answers: list[tuple[float, str, int]] = field(default_factory=list)
    """(seconds since start, gateway, status; -1 a transport error)."""
    faults: list[tuple[float, str]] = field(default_factory=list)
    samples: dict[str, list[tuple[float, float, int]]] = field(default_factory=dict)
    """Process -> (seconds, RSS MiB, open FDs)."""
    load: list[float] = field(default_factory=list)
    """The machine's 1-minute load average at each sample (other work shares the cores)."""


def proc_sample(pid: int) -> tuple[float, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return rss_kb / 1024, fds


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 0.0 if var == 0 else sum((p[0] - mx) * (p[1] - my) for p in points) / var * 3600


def start_redis(port: int, workdir: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench.soak needs redis-server on PATH (Debian: apt-get install redis-server)")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: _answers(port), 10, f"redis-server on {port}")
    return proc


def _answers(port: int) -> bool:
    import redis

    try:
        with redis.Redis(port=port, socket_timeout=0.5) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def decision_seconds(logs: list[Path], started_wall: float) -> list[tuple[float, float]]:
    """(seconds since start, decision_s) of every decision line in ``logs`` (either log format)."""
    out = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if '"decision_s"' not in line or not line.startswith("{"):
                continue
            record = json.loads(line)
            ts = record.get("ts")
            if not isinstance(ts, str):
                continue
            from datetime import datetime

            at = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() - started_wall
            out.append((at, float(record["decision_s"])))
    return out


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def load(url: str, gateway: str, headers: dict[str, str], model: str, rps: float, run: Run, t0: float,
               stop: asyncio.Event) -> None:  # fmt: skip
    rng = random.Random(gateway)
    tasks: set[asyncio.Task[None]] = set()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        prompt = f"conversation {rng.randrange(20)}: " + "shared system context " * 20 + f"question {i}"
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
        try:
            r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            status = r.status_code
        except httpx.HTTPError:
            status = -1
        run.answers.append((time.monotonic() - t0, gateway, status))

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as client:
        i = 0
        next_at = time.monotonic()
        while not stop.is_set():
            i += 1
            task = asyncio.create_task(one(client, i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += 1 / rps
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks, return_exceptions=True)


def proxy_config(
    fleet: SimFleet, config_path: Path, tokenizer: Path, extra_callbacks: Sequence[str] = ()
) -> dict[str, Any]:
    """The LiteLLM proxy's config over the soak's fleet: one deployment per engine, the cognitora strategy reading
    ``config_path`` (the store the collector feeds), Cognitora's callback and then ``extra_callbacks``."""
    return {
        "model_list": [
            {
                "model_name": fleet.model,
                "litellm_params": {"model": f"openai/{fleet.model}", "api_base": f"{u}/v1", "api_key": "none"},
                "model_info": {"id": f"engine-{i}", "cognitora_engine": "vllm"},
            }
            for i, u in enumerate(fleet.urls)
        ],
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {
                "config": str(config_path),
                "models": [{"name": fleet.model, "tokenizer": str(tokenizer)}],
            },
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora", *extra_callbacks]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--cycle-s", type=float, default=120.0, help="seconds between two faults (default 120)")
    p.add_argument("--rps", type=float, default=3.0, help="requests a second per gateway (default 3)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=None,
        help="each simulated engine's KV cache in tokens (default: the h100 profile's 400,000, which this load does "
        "not fill in 30 minutes, so the engines and the collector hold every block ever cached and grow the whole "
        "run; 4096 fills it in about two minutes and the run measures the steady state)",
    )
    p.add_argument(
        "--gateways",
        choices=("both", "envoy", "litellm"),
        default="both",
        help="which gateways get load (default both); one alone halves the CPU a probe of the other's processes takes",
    )
    p.add_argument(
        "--trace",
        action="append",
        default=[],
        choices=("collector", "extproc0"),
        help="run this process under tracemalloc (bench/harness/traced_main.py, repeatable): the allocation sites "
        "that grew most, every minute, as JSON lines beside the report (its RSS then counts tracemalloc's tables)",
    )
    p.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a limits.NAME in the config (repeatable), e.g. tokenizer_cache_bytes=0 turns the piece cache off",
    )
    p.add_argument("--out", type=Path, default=None, help="the report's path without suffix (default soak_seed<seed>)")
    p.add_argument(
        "--rerender",
        type=Path,
        default=None,
        metavar="STEM",
        help="run nothing: rewrite STEM.md (and .json) from STEM.json, with this version's report",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.rerender is not None:
        rerender(args.rerender)
        return 0
    random.seed(args.seed)
    work = Path(tempfile.mkdtemp(prefix="cognitora-soak-"))
    tokenizer = SMOLLM2_DIR / "tokenizer.json"
    redis_port = free_port()
    redis_proc = start_redis(redis_port, str(work))
    run = Run()
    procs: dict[str, ManagedProcess] = {}
    envoy = None
    with start_fleet(
        2, tokenizer=tokenizer, time_scale=10.0, log_dir=work, kv_capacity_tokens=args.kv_capacity_tokens
    ) as fleet:
        settings = {
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "key_prefix": "soak",
            "scrape": {"interval_s": 1.0},
        }
        config: dict[str, Any] = {**settings, "models": [fleet.model_config(tokenizer)]}
        limits = {name: yaml.safe_load(value) for name, value in (x.split("=", 1) for x in args.limit)}
        if limits:
            config["limits"] = limits
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))

        def cli(name: str) -> tuple[list[str], dict[str, str] | None]:
            if name not in args.trace:
                return [sys.executable, "-m", "cognitora.cli"], None
            env = {"TRACED_OUT": str(work / f"{name}.trace.jsonl"), "PYTHONPATH": pythonpath}
            return [sys.executable, "-m", "bench.harness.traced_main", "cognitora.cli"], env

        try:
            argv_c, env_c = cli("collector")
            procs["collector"] = ManagedProcess(
                [*argv_c, "collector", "--config", str(config_path)], work / "c.log", env=env_c
            )
            ports = [free_port(), free_port()]
            for i, port in enumerate(ports):
                argv_x, env_x = cli(f"extproc{i}")
                argv_x += ["extproc", "--config", str(config_path), "--listen", f"127.0.0.1:{port}"]
                procs[f"extproc{i}"] = ManagedProcess(argv_x, work / f"extproc{i}.log", env=env_x)
                # Tracing its imports takes a traced extproc minutes on a busy machine.
                wait_listening(port, procs[f"extproc{i}"], timeout_s=300 if env_x else 30)
            listen, admin = free_port(), free_port()

            def two(envoy_config: dict[str, Any]) -> None:
                for c in envoy_config["static_resources"]["clusters"]:
                    if c["name"] == "cognitora_extproc":
                        eps = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": q}}}}
                               for q in ports]  # fmt: skip
                        c["load_assignment"]["endpoints"] = [{"lb_endpoints": eps}]

            rendered = render_config(
                listen_port=listen, admin_port=admin, extproc_port=ports[0], engines=fleet.endpoint_ids, edit=two
            )
            envoy = start_envoy(rendered, work / "envoy", admin)
            litellm_config = proxy_config(fleet, config_path, tokenizer)
            (work / "litellm.yaml").write_text(yaml.safe_dump(litellm_config))
            key = "sk-soak-" + secrets.token_hex(8)
            proxy_port = free_port()
            env = {
                "LITELLM_MASTER_KEY": key,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
                "PYTHONPATH": pythonpath,
            }
            argv_l = [str(LITELLM), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1"]
            procs["litellm"] = ManagedProcess([*argv_l, "--port", str(proxy_port)], work / "litellm.log", env=env)
            procs["litellm"].wait_http(f"http://127.0.0.1:{proxy_port}/health/liveliness", timeout_s=120)
            pids = {name: proc.pid for name, proc in procs.items()}
            pids["envoy"] = envoy.pid
            pids["sim-fleet"] = fleet.process.pid

            envoy_url, proxy_url = f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{proxy_port}"

            async def soak() -> None:
                t0 = time.monotonic()
                stop = asyncio.Event()
                auth = {"Authorization": f"Bearer {key}"}
                loads = []
                if args.gateways in ("both", "envoy"):
                    loads.append(
                        asyncio.create_task(load(envoy_url, "envoy", {}, fleet.model, args.rps, run, t0, stop))
                    )
                if args.gateways in ("both", "litellm"):
                    gateway = load(proxy_url, "litellm", auth, fleet.model, args.rps, run, t0, stop)
                    loads.append(asyncio.create_task(gateway))
                nonlocal redis_proc
                next_sample = next_fault = 0.0
                n_fault = 0
                while (now := time.monotonic() - t0) < args.duration_s:
                    if now >= next_sample:
                        run.load.append(os.getloadavg()[0])
                        for name, pid in pids.items():
                            got = proc_sample(pid)
                            if got is not None:
                                run.samples.setdefault(name, []).append((now, got[0], got[1]))
                        next_sample += SAMPLE_S
                    if now >= next_fault + args.cycle_s:
                        next_fault += args.cycle_s
                        kind = FAULTS[n_fault % len(FAULTS)]
                        n_fault += 1
                        run.faults.append((now, kind))
                        if kind == "engine-restart":
                            await asyncio.to_thread(fleet.fault, n_fault % 2, "restart")
                        elif kind == "redis-restart":
                            redis_proc.kill()
                            redis_proc.wait()
                            redis_proc = await asyncio.to_thread(start_redis, redis_port, str(work))
                        else:
                            interval = 1.0 if n_fault % 2 else 1.5
                            config["scrape"] = {"interval_s": interval}
                            config_path.write_text(yaml.safe_dump(config))
                    await asyncio.sleep(0.5)
                stop.set()
                await asyncio.gather(*loads)

            started_wall = time.time()
            asyncio.run(soak())
            logs = [work / "extproc0.log", work / "extproc1.log", work / "litellm.log"]
            stem = args.out if args.out is not None else RESULTS / f"soak_seed{args.seed}"
            report(args, run, decision_seconds(logs, started_wall), stem)
            for name in args.trace:
                shutil.copy(work / f"{name}.trace.jsonl", stem.parent / f"{stem.name}.{name}.trace.jsonl")
        finally:
            if envoy is not None:
                envoy.stop()
            for proc in procs.values():
                proc.stop()
            redis_proc.kill()
    return 0


STEP_WINDOW_S = 60.0
"""RSS gained within this long after a fault counts as the fault's step (a resync's replay, reconnections)."""


def steps_at_faults(points: list[tuple[float, float, int]], faults: list[float]) -> dict[str, float]:
    """From the warm-up on, the RSS gained in the ``STEP_WINDOW_S`` after each fault and the RSS gained at other
    times (net, MiB): what steps at faults and settles is not what grows with every request."""
    at_faults = between = 0.0
    for (t0, r0, _), (t1, r1, _) in itertools.pairwise(points):
        if t0 < WARMUP_S:
            continue
        if any(f <= t1 and t0 < f + STEP_WINDOW_S for f in faults):
            at_faults += r1 - r0
        else:
            between += r1 - r0
    return {"rss_mib_gained_at_faults": round(at_faults, 1), "rss_mib_gained_between_faults": round(between, 1)}


FLAT_MIB_PER_HOUR = 3.0
"""An RSS slope under this (about 1.5 MiB over the soak's 30 minutes) is called flat."""


def rss_verdict(row: dict[str, Any]) -> str:
    """What a process's RSS did after the warm-up, in words, from its slopes and where its RSS was gained."""
    after, second = row["rss_mib_per_hour_after_warmup"], row["rss_mib_per_hour_second_half"]
    at_faults, between = row["rss_mib_gained_at_faults"], row["rss_mib_gained_between_faults"]
    if abs(after) < FLAT_MIB_PER_HOUR:
        return f"flat ({after:+g} MiB/h from {WARMUP_S:g} s)"
    words = f"{after:+g} MiB/h from {WARMUP_S:g} s, {second:+g} over the second half"
    if abs(second) < FLAT_MIB_PER_HOUR:
        words += ": levelled off"
    elif second < after / 2:
        words += ": slowing"
    if at_faults > 0 and between < at_faults / 3:
        words += f"; {at_faults:+g} MiB gained in the {STEP_WINDOW_S:g} s after faults, {between:+g} at other times"
    return words


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run."""
    out = (
        f"python -m bench.soak --duration-s {args.duration_s:g} --cycle-s {args.cycle_s:g} "
        f"--rps {args.rps:g} --seed {args.seed}"
    )
    if args.kv_capacity_tokens is not None:
        out += f" --kv-capacity-tokens {args.kv_capacity_tokens}"
    if args.gateways != "both":
        out += f" --gateways {args.gateways}"
    out += "".join(f" --trace {name}" for name in args.trace) + "".join(f" --limit {x}" for x in args.limit)
    return out + ("" if args.out is None else f" --out {args.out}")


def process_rows(
    samples: dict[str, list[tuple[float, float, int]]], faults: list[float], duration_s: float
) -> dict[str, dict[str, Any]]:
    """Per process: RSS and FD first and last values, slopes, and the RSS gained at faults and between them."""
    procs = {}
    half = duration_s / 2
    for name, points in sorted(samples.items()):
        procs[name] = {
            "rss_mib_first": round(points[0][1], 1),
            "rss_mib_last": round(points[-1][1], 1),
            "rss_mib_per_hour": round(slope_per_hour([(t, r) for t, r, _ in points]), 2),
            "rss_mib_per_hour_after_warmup": round(slope_per_hour([(t, r) for t, r, _ in points if t >= WARMUP_S]), 2),
            "rss_mib_per_hour_second_half": round(slope_per_hour([(t, r) for t, r, _ in points if t >= half]), 2),
            "rss_mib_at_warmup": round(next((r for t, r, _ in points if t >= WARMUP_S), points[-1][1]), 1),
            **steps_at_faults(points, faults),
            "fds_first": points[0][2],
            "fds_last": points[-1][2],
            "fds_per_hour": round(slope_per_hour([(t, float(f)) for t, _, f in points]), 2),
        }
    return procs


def report(args: argparse.Namespace, run: Run, decisions: list[tuple[float, float]], stem: Path) -> None:
    def in_fault(t: float) -> bool:
        return any(0 <= t - f <= FAULT_WINDOW_S for f, _ in run.faults)

    errors = [(t, g, s) for t, g, s in run.answers if s != 200]
    outside = [e for e in errors if not in_fault(e[0])]
    cycles = []
    for start in range(0, int(args.duration_s), int(args.cycle_s)):
        window = [d for t, d in decisions if start <= t < start + args.cycle_s]
        value = p99(window)
        cycles.append(
            {"from_s": start, "decisions": len(window), "p99_ms": None if value is None else round(value * 1e3, 2)}
        )
    data = {
        "command": command(args),
        "requests": {g: sum(1 for _, gg, _ in run.answers if gg == g) for g in ("envoy", "litellm")},
        "errors_total": len(errors),
        "errors_outside_fault_windows": len(outside),
        "errors_outside_sample": outside[:10],
        "faults": run.faults,
        "processes": process_rows(run.samples, [f for f, _ in run.faults], args.duration_s),
        "p99_decision_ms_per_cycle": cycles,
        "load_average_1m": {
            "min": round(min(run.load, default=0.0), 2),
            "mean": round(sum(run.load) / max(1, len(run.load)), 2),
            "max": round(max(run.load, default=0.0), 2),
        },
        "samples": {
            name: [[round(t, 1), round(r, 2), f] for t, r, f in points] for name, points in run.samples.items()
        },
    }
    write(args, data, stem)


def rerender(stem: Path) -> None:
    """Rewrite ``stem``'s report from its .json (the processes' rows recomputed from the RSS samples kept there)."""
    data = json.loads(stem.with_suffix(".json").read_text())
    args = _parser().parse_args(shlex.split(data["command"])[3:])
    samples = {name: [(t, r, int(f)) for t, r, f in points] for name, points in data["samples"].items()}
    data["processes"] = process_rows(samples, [f for f, _ in data["faults"]], args.duration_s)
    write(args, data, stem)


def write(args: argparse.Namespace, data: dict[str, Any], stem: Path) -> None:
    """The .json and the .md of a run."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1))
    procs, cycles, load_avg = data["processes"], data["p99_decision_ms_per_cycle"], data["load_average_1m"]
    lines = [
        f"# Soak, seed {args.seed}",
        "",
        f"Command: `{data['command']}` (one machine, loopback; see bench/soak.py for the stack).",
        "",
        f"Requests: {data['requests']}; errors {data['errors_total']}, of which "
        f"{data['errors_outside_fault_windows']} outside the {FAULT_WINDOW_S:g} s after a fault. Faults: "
        f"{len(data['faults'])} ({', '.join(FAULTS)} in turn, every {args.cycle_s:g} s). "
        f"The machine's 1-minute load average over the run (2 cores shared with other work): "
        f"{load_avg['min']} min, {load_avg['mean']} mean, {load_avg['max']} max.",
        "",
        f"Slopes are least-squares fits over all samples (every {SAMPLE_S:g} s), from {WARMUP_S:g} s on, and over "
        f"the second half (from {args.duration_s / 2:g} s): a bounded structure filling up shows as a slope that falls "
        "from one to the next, a leak as one that does not. From the warm-up on, the RSS gained is also split: in the "
        f"{STEP_WINDOW_S:g} s after each fault (steps: a resync's replay, reconnections) and at other times (what "
        "grows with the requests). The RSS samples are in the .json.",
        "",
        f"| process | RSS MiB first | at {WARMUP_S:g} s | last | slope MiB/h | from {WARMUP_S:g} s | second half "
        "| MiB gained at faults | between | FDs first | last | slope FDs/h |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in procs.items():
        lines.append(
            f"| {name} | {row['rss_mib_first']} | {row['rss_mib_at_warmup']} | {row['rss_mib_last']} | "
            f"{row['rss_mib_per_hour']} | {row['rss_mib_per_hour_after_warmup']} | "
            f"{row['rss_mib_per_hour_second_half']} | {row['rss_mib_gained_at_faults']} | "
            f"{row['rss_mib_gained_between_faults']} | {row['fds_first']} | {row['fds_last']} | {row['fds_per_hour']} |"
        )
    lines += ["", "RSS after the warm-up:", ""]
    lines += [f"- {name}: {rss_verdict(row)}" for name, row in procs.items()]
    lines += [
        "",
        "What grows and its bound (bench/results/memory_growth.md): the tokenizer's piece cache, which at "
        "unique prompts holds its probation segment only (4 MiB: a 16th of the 64 MiB default, "
        "limits.tokenizer_cache_probation_share; kvstate/prompt.py); the extprocs' last 256 decisions and "
        "outcomes; the collector's high-water from resyncs, which replay an engine's buffer (at most 10,000 "
        "batches) at Redis restarts and reloads.",
    ]
    lines += ["", "| cycle from (s) | decisions | p99 decision (ms) |", "|---|---|---|"]
    lines += [f"| {c['from_s']} | {c['decisions']} | {c['p99_ms']} |" for c in cycles]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
