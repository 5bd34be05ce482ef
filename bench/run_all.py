"""Side-by-side benchmark runner: every target, each in front of an identical fresh simulated fleet, same workload.

    python -m bench.run_all --workload b2b-saas --rates 10,30,60 --targets envoy-rr,cognitora-litellm
    python -m bench.run_all --trace PATH/TO/synthetic_trace.jsonl --speed 1 --duration 300

Per target: start a fresh fleet, start the target, read the engines' counters, send the schedule open-loop (while
sampling each engine's queue and KV gauges), read the counters again, stop both. Results go to
``bench/results/side_by_side_<workload>.{md,json,png}`` with the exact command at the top.

Time scale: the schedule is in engine seconds. ``--time-scale auto`` picks the largest X <= 1 such that the
heaviest stage offers at most ``--max-wall-rps`` requests per wall second, so this machine keeps up by running the
simulated clock slower, never by shrinking the workload.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import random
import shlex
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from bench import workloads as wl
from bench.capacity_bound import fleet_capacity_bounds
from bench.cpu_timeline import CpuTimeline
from bench.loadgen import LoadResult, RequestResult, run_load
from bench.report import (
    EngineStats,
    Report,
    Slo,
    TargetRun,
    engine_hit_and_bound,
    summarize_stage,
    why_unusable,
    write_report,
)
from bench.run_args import BLOCK_SIZE, build_schedule, parse_args
from bench.targets import (
    COGNITORA_TARGETS,
    PEER_TARGETS,
    FleetLike,
    Target,
    TargetUnavailable,
    all_targets,
    make_target,
    process_group_cpu_seconds,
    split_target,
)
from cognitora_sim.harness.process import ManagedProcess, free_port_block, wait_until

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


# --------------------------------------------------------------------------------------------------------------------
# Fleet


@dataclass(frozen=True)
class FleetSpec:
    engines: int
    profile: str
    model: str
    time_scale: float
    stream_chunk_tokens: int
    tokenizer: str
    """``builtin`` or a tokenizer.json path (Cognitora's config then names the same file)."""
    block_size: int = BLOCK_SIZE
    engine_kind: str = "vllm"
    """``cognitora sim --engine-kind``: what each engine shows (a comma list cycles over the engines)."""
    sim_args: tuple[str, ...] = ()
    """More ``cognitora sim fleet`` flags (``bench.real_engines``: ``--disable-scale-out``, as its real engines)."""

    @property
    def engine_kinds(self) -> list[str]:
        kinds = [k.strip() for k in self.engine_kind.split(",") if k.strip()]
        return [kinds[i % len(kinds)] for i in range(self.engines)]

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["tokenizer"] = Path(self.tokenizer).parent.name if self.tokenizer != "builtin" else "builtin"
        return d


class BenchFleet:
    """A fresh simulated fleet for one target: ``cognitora sim fleet`` in its own process (its CPU is not ours).

    Every fleet publishes vLLM KV events (peers ignore them), so all targets face identical engines.
    """

    def __init__(self, spec: FleetSpec, workdir: Path | None = None) -> None:
        self.spec = spec
        # A random start: several harness runs (and tests) on one machine must not race for the same ports.
        base = free_port_block(spec.engines, start=random.randrange(20000, 50000))
        events = free_port_block(2 * spec.engines, start=base + spec.engines + 100)
        argv = [
            sys.executable, "-m", "cognitora.cli", "sim", "fleet",
            "--engines", str(spec.engines),
            "--base-port", str(base),
            "--events-base-port", str(events),
            "--profile", spec.profile,
            "--model", spec.model,
            "--block-size", str(spec.block_size),
            "--time-scale", f"{spec.time_scale:g}",
            "--stream-chunk-tokens", str(spec.stream_chunk_tokens),
            "--engine-kind", spec.engine_kind,
        ]  # fmt: skip
        argv += ["--tokenizer", spec.tokenizer]  # "builtin" included: the sim's default is SmolLM2's
        argv += list(spec.sim_args)
        logdir = workdir or Path(tempfile.mkdtemp(prefix="bench-fleet-"))
        self._proc = ManagedProcess(argv, logdir / "fleet.log")
        self.urls: list[str] = [f"http://127.0.0.1:{base + i}" for i in range(spec.engines)]
        self.endpoint_ids = [f"127.0.0.1:{base + i}" for i in range(spec.engines)]
        self.events_addresses = [f"tcp://127.0.0.1:{events + 2 * i}" for i in range(spec.engines)]
        self.replay_addresses = [f"tcp://127.0.0.1:{events + 2 * i + 1}" for i in range(spec.engines)]
        self.tokenizer_path = None if spec.tokenizer == "builtin" else spec.tokenizer
        self.block_size = spec.block_size
        from cognitora_sim.profiles import profiles_for_fleet

        self.max_num_seqs = [p.max_num_seqs for p in profiles_for_fleet(spec.profile, spec.engines)]
        """Each engine's seats (its profile's ``--max-num-seqs``): an operator's engine flag, told to Cognitora."""
        self.engine_kinds = spec.engine_kinds
        """Each engine's kind: Cognitora's config says it (and subscribes to events only where there are some)."""
        try:
            # Our own process must be the one listening (a port taken meanwhile would let another fleet answer):
            # it prints one JSON line per engine, with its URL, once every engine listens.
            wait_until(lambda: self._listening() or not self._proc.alive(), 60, "the simulated fleet to listen")
            if not self._proc.alive():
                raise RuntimeError(f"the simulated fleet exited:\n{self._proc.log_tail()}")
        except BaseException:
            self._proc.stop()
            raise

    def _listening(self) -> bool:
        text = self._proc.log_path.read_text(errors="replace")
        return all(f'"url": "{url}"' in text for url in self.urls)

    def cpu_seconds(self) -> float:
        return process_group_cpu_seconds(self._proc.pid)

    def stop(self) -> None:
        self._proc.stop()


# --------------------------------------------------------------------------------------------------------------------
# Engine counters

_COUNTERS = {
    "vllm:request_success": "requests",
    "vllm:prefix_cache_queries": "prompt_tokens",
    "vllm:prefix_cache_hits": "cached_tokens",
    "vllm:generation_tokens": "generation_tokens",
}


_ENGINE_TTFT = {
    "vllm:time_to_first_token_seconds_sum": "ttft_sum_s",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
}


def _scrape(url: str) -> dict[str, float]:
    """Counters and gauges of one engine's /metrics, summed over label sets; energy in joules. An engine of another
    kind (``--engine-kind``: no vLLM page) is read from the simulator's own ``/sim/state`` counters instead."""
    resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=5)
    if resp.status_code != 200 or "vllm:num_requests_running" not in resp.text:
        return dict(httpx.get(f"{url.rstrip('/')}/sim/state", timeout=5).json()["counters"])
    text = resp.text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name.removesuffix("_total")
            if name in _COUNTERS and not s.name.endswith("_created"):
                out[_COUNTERS[name]] = out.get(_COUNTERS[name], 0.0) + s.value
            elif name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
                out["energy_j"] = out.get("energy_j", 0.0) + s.value / 1000.0
            elif name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
                out[name] = s.value
            elif s.name in _ENGINE_TTFT:
                out[_ENGINE_TTFT[s.name]] = out.get(_ENGINE_TTFT[s.name], 0.0) + s.value
    return out


class EngineSampler:
    """Counters before/after, and the peak of each engine's queue and KV gauges sampled during the run."""

    def __init__(self, urls: Sequence[str], interval_wall_s: float = 2.0) -> None:
        self.urls = list(urls)
        self.interval = interval_wall_s
        self.before = [self._safe(u) for u in self.urls]
        self.stats = [EngineStats(url=u) for u in self.urls]

    @staticmethod
    def _safe(url: str) -> dict[str, float]:
        try:
            return _scrape(url)
        except (httpx.HTTPError, ValueError):
            return {}

    async def sample_forever(self) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                for url, st in zip(self.urls, self.stats, strict=True):
                    try:
                        text = (await client.get(f"{url}/metrics")).text
                    except httpx.HTTPError:
                        continue
                    for line in text.splitlines():
                        if line.startswith("vllm:num_requests_waiting"):
                            st.max_waiting = max(st.max_waiting, float(line.rsplit(" ", 1)[1]))
                        elif line.startswith("vllm:num_requests_running"):
                            st.max_running = max(st.max_running, float(line.rsplit(" ", 1)[1]))
                        elif line.startswith("vllm:kv_cache_usage_perc"):
                            st.max_kv_usage = max(st.max_kv_usage, float(line.rsplit(" ", 1)[1]))
                await asyncio.sleep(self.interval)

    def finish(self) -> list[EngineStats]:
        for url, st, before in zip(self.urls, self.stats, self.before, strict=True):
            after = self._safe(url)

            def delta(key: str, after: dict[str, float] = after, before: dict[str, float] = before) -> float:
                return after.get(key, 0.0) - before.get(key, 0.0)

            st.requests = int(delta("requests"))
            st.prompt_tokens = int(delta("prompt_tokens"))
            st.cached_tokens = int(delta("cached_tokens"))
            st.generation_tokens = int(delta("generation_tokens"))
            st.energy_j = delta("energy_j")
            st.ttft_sum_s = delta("ttft_sum_s")
            st.ttft_count = int(delta("ttft_count"))
        return self.stats


# --------------------------------------------------------------------------------------------------------------------
# One target


class Progress:
    """A tqdm progress bar of requests answered (rate and time left included); on a non-terminal, tqdm's own sparse
    updates (every 10 s), so logs stay readable."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._bar: tqdm[Any] | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            tty = sys.stderr.isatty()
            self._bar = tqdm(
                total=total, desc=f"  {self.label}", unit="req", file=sys.stderr, mininterval=0.2 if tty else 10.0
            )
        self._bar.update(done - self._bar.n)
        if done >= total:
            self._bar.close()


async def _drive(
    target: Target,
    base_url: str,
    fleet: FleetLike,
    schedule: wl.Schedule,
    spec: FleetSpec,
    args: argparse.Namespace,
    router_cpu: CpuTimeline,
) -> tuple[LoadResult, list[EngineStats], float]:
    """The load result, the engines' counters, and the wall time (``perf_counter``) the schedule started at."""
    sampler = EngineSampler(fleet.urls)
    sampling = asyncio.create_task(sampler.sample_forever())
    router_cpu.sample()  # before the first request: every stage's window lies within the samples
    cpu_sampling = asyncio.create_task(router_cpu.sample_forever())
    started = time.perf_counter()
    try:
        result = await run_load(
            base_url,
            schedule,
            spec.model,
            time_scale=spec.time_scale,
            headers=target.headers,
            max_wall_s=args.duration,
            max_requests=args.max_requests,
            request_timeout_s=args.request_timeout,
            drain_wall_s=args.drain / spec.time_scale,
            progress=Progress(target.name) if args.progress else None,
        )
    finally:
        sampling.cancel()
        cpu_sampling.cancel()
    return result, sampler.finish(), started


def _fleet_cpu(fleet: Any) -> float:
    return float(fleet.cpu_seconds()) if hasattr(fleet, "cpu_seconds") else 0.0


def run_target(
    name: str,
    schedule: wl.Schedule,
    spec: FleetSpec,
    args: argparse.Namespace,
    slo: Slo,
    fleet_factory: Callable[[FleetSpec], Any] = BenchFleet,
    raw: list[dict[str, Any]] | None = None,
    configure: Callable[[Target], None] | None = None,
) -> TargetRun:
    """Run ``schedule`` against target ``name`` on a fresh fleet; append per-request results to ``raw`` if given.
    ``configure`` may adjust the target before it starts (``bench.flow_bench``: trusted identity headers)."""
    target = make_target(name, spec.model)
    if configure is not None:
        configure(target)
    run = TargetRun(target=name, settings=target.settings)
    try:
        fleet = fleet_factory(spec)
    except (RuntimeError, TimeoutError, OSError) as exc:
        run.skipped = f"the simulated fleet did not start: {str(exc)[-300:]}"
        return run
    try:
        try:
            base_url = target.start(fleet)
        except TargetUnavailable as exc:
            run.skipped = str(exc)
            return run
        except (RuntimeError, TimeoutError, OSError) as exc:
            # One broken target must not lose the others' results: report it and go on.
            run.skipped = f"failed to start: {str(exc)[-300:]}"
            return run
        router_cpu0, fleet_cpu0 = target.cpu_seconds(), _fleet_cpu(fleet)
        router_cpu = CpuTimeline(target.cpu_seconds)
        result, engines, started = asyncio.run(_drive(target, base_url, fleet, schedule, spec, args, router_cpu))
        wall = result.health.wall_s
        if wall > 0:
            run.router_cpu_share = (target.cpu_seconds() - router_cpu0) / wall
            run.fleet_cpu_share = (_fleet_cpu(fleet) - fleet_cpu0) / wall
    finally:
        target.stop()
        fleet.stop()
    if raw is not None:
        raw.extend({"target": name, **asdict(r)} for r in result.results)
    run.engines = engines
    run.health = result.health
    run.not_sent = result.not_sent
    run.total_requests = len(result.results)
    run.total_ok = sum(1 for r in result.results if r.ok)
    run.total_served = sum(1 for r in result.results if r.ok or r.tokens_received > 0)
    failures = Counter(r.error or f"HTTP {r.status}" for r in result.results if r.errored)
    run.errors = {error[:300]: count for error, count in failures.most_common(3)}
    by_stage: dict[str, list[RequestResult]] = {}
    for r in result.results:
        by_stage.setdefault(r.stage, []).append(r)
    for stage in schedule.stages:
        results = by_stage.get(stage.label, [])
        if not stage.measured or not results:
            continue
        summary = summarize_stage(
            stage.label, stage.rate, stage.duration_s, results, schedule.reuse_bound(stage.label), slo
        )
        # The stage's window in wall time: from its first arrival to its last (arrivals are engine seconds).
        first, last = (f(r.arrival_s for r in results) / spec.time_scale for f in (min, max))
        summary.router_cpu_share = router_cpu.cores_between(started + first, started + last)
        run.stages.append(summary)
    engine_hit_and_bound(run, result.results)
    return run


# --------------------------------------------------------------------------------------------------------------------
# CLI


def pick_time_scale(schedule: wl.Schedule, requested: str, max_wall_rps: float) -> float:
    if requested != "auto":
        return float(requested)
    peak = max((s.rate for s in schedule.stages), default=1.0)
    if schedule.stages and schedule.stages[0].label == "trace":
        peak = _peak_rate(schedule.requests)
    scale = min(1.0, max_wall_rps / peak) if peak > 0 else 1.0
    # Round down to 2 significant digits so the command line shows a readable number.
    digits = -math.floor(math.log10(scale)) + 1
    return math.floor(scale * 10**digits) / 10**digits


def _peak_rate(requests: Sequence[wl.BenchRequest], window_s: float = 10.0) -> float:
    """Highest arrival rate over any window (for traces, whose rate varies)."""
    times = [r.arrival_s for r in requests]
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - window_s:
            j += 1
        best = max(best, i - j + 1)
    return best / window_s


def resolve_targets(spec: str) -> list[str]:
    if spec == "all":
        return [*PEER_TARGETS, *COGNITORA_TARGETS]
    if spec == "peers":
        return list(PEER_TARGETS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if split_target(n)[0] not in all_targets()]
    if unknown:
        raise SystemExit(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(all_targets())}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    schedule = build_schedule(args)
    time_scale = pick_time_scale(schedule, args.time_scale, args.max_wall_rps)
    spec = FleetSpec(
        args.engines,
        args.profile,
        args.model,
        time_scale,
        args.stream_chunk_tokens,
        args.tokenizer,
        engine_kind=args.engine_kind,
    )
    slo = Slo(args.slo_ttft, args.slo_itl)
    names = resolve_targets(args.targets)
    workload = "mooncake" if schedule.workload.startswith("mooncake") else schedule.workload
    out = Path(args.out) if args.out else RESULTS / f"side_by_side_{workload}"
    command = shlex.join(["python", "-m", "bench.run_all", *argv])
    report = Report(
        command=command,
        workload=schedule.workload,
        description=schedule.description,
        started_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        time_scale=time_scale,
        slo=slo,
        fleet=spec.as_dict(),
        stages=[
            {"label": s.label, "rate": s.rate, "duration_s": s.duration_s, "measured": s.measured}
            for s in schedule.stages
        ],
        reuse_bound={label: schedule.reuse_bound(label) for label in schedule.stage_labels()},
    )
    bound = fleet_capacity_bounds(schedule, args)
    report.capacity_bound, report.pooled_lru_bound = bound.capacity, bound.pooled_lru
    if time_scale < 1:
        report.notes.append(
            f"The sim ran at time scale {time_scale:g}: wall-clock router overhead is scaled by the same factor."
        )
    print(f"{schedule.description}: {len(schedule.requests)} requests, time scale {time_scale:g}", file=sys.stderr)
    # SIGTERM unwinds like Ctrl-C, so every fleet and router this run started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raw: list[dict[str, Any]] = []
    for name in names:
        print(f"== {name}", file=sys.stderr)
        run = run_target(name, schedule, spec, args, slo, raw=raw)
        report.runs.append(run)
        why = why_unusable(run)
        if why:
            print(f"  FAILED: {name} could not run: {why}", file=sys.stderr)
        write_report(report, out)  # after every target, so a long run leaves partial results
        with gzip.open(out.with_suffix(".requests.jsonl.gz"), "wt") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in raw)
    paths = write_report(report, out)
    print("\n".join(str(p) for p in paths))
    failed = [(run.target, why) for run in report.runs if (why := why_unusable(run))]
    for target, why in failed:
        print(f"FAILED: {target} could not run: {why}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
