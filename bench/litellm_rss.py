"""Whose memory grows in the LiteLLM proxy: LiteLLM's own or Cognitora's plugin? The soak's seed 1, before issue
44's reload fix (``git show 0489970:bench/results/soak_seed1.md``), saw the proxy's RSS grow 107 MiB in 30
minutes; this short run attributes Python allocations.

    python -m bench.litellm_rss --duration-s 480 --rps 3

The soak's LiteLLM half: a private ``redis-server``, two simulated engines, ``cognitora collector``, the LiteLLM
proxy (one worker) with the routing strategy and Cognitora's callback, ``--rps`` requests a second, and the soak's
faults in turn every ``--cycle-s`` (an engine restart, a Redis restart, a config reload). The proxy loads a
probe callback (written beside its config) that starts tracemalloc (``--frames`` deep) then, after the proxy's own
imports, and every ``SAMPLE_S`` takes a snapshot and charges each live allocation to the innermost frame of its
traceback that lies in ``litellm_plugin``/``cognitora``/``kvstate`` (Cognitora), else in ``litellm``
(LiteLLM), else to "other" (the standard library and other packages called from neither). Writes
``bench/results/litellm_rss.md``: RSS and traced bytes per owner at the first sample after the warm-up and at the
end, and the 10 sites that grew most.

tracemalloc's own tables grow with what it traces, so its RSS is not the proxy's: ``--no-tracemalloc`` samples RSS
from outside every 10 s and fits its slope after the warm-up, with glibc's malloc counters and Python's allocated
blocks from inside; ``--router simple-shuffle`` runs LiteLLM with no Cognitora code, ``--malloc-arena-max``,
``--gc-pacing-s`` and ``--limit NAME=VALUE`` change one thing at a time (``bench/results/memory_growth.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.harness.redis_server import free_port
from bench.soak import (
    FAULTS,
    LITELLM,
    ROOT,
    SMOLLM2_DIR,
    Run,
    load,
    proc_sample,
    proxy_config,
    slope_per_hour,
    start_redis,
)
from cognitora_sim.harness.process import ManagedProcess
from cognitora_sim.launch import start_fleet

OUT = Path(__file__).parent / "results" / "litellm_rss.md"
SAMPLE_S = 60.0
WARMUP_S = 90.0
RSS_SAMPLE_S = 10.0
RSS_WARMUP_S = 120.0
"""The RSS slope is fitted from here on: the proxy's first requests load what it keeps (tokenizer, pools)."""

PROBE = '''
"""Memory probe inside the LiteLLM proxy (bench/litellm_rss.py): JSON lines to PROBE_OUT. With PROBE_TRACE=0, no
tracemalloc: glibc's malloc counters and Python's allocated blocks only, which cost nothing."""
import ctypes, gc, json, os, sys, threading, time, tracemalloc
from litellm.integrations.custom_logger import CustomLogger

OURS = ("/litellm_plugin/", "/cognitora/", "/kvstate/")


def owner(tb):
    for frame in reversed(tb):  # innermost first
        name = frame.filename
        if any(part in name for part in OURS):
            return "cognitora"
        if "/litellm/" in name:
            return "litellm"
    return "other"


def sample():
    snap = tracemalloc.take_snapshot()
    by_owner, by_site = {}, {}
    for stat in snap.statistics("traceback"):
        who = owner(stat.traceback)
        by_owner[who] = by_owner.get(who, 0) + stat.size
        inner = stat.traceback[-1] if len(stat.traceback) else None
        site = f"{who} {inner.filename}:{inner.lineno}" if inner else who
        by_site[site] = by_site.get(site, 0) + stat.size
    with open(f"/proc/{os.getpid()}/status") as f:
        rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
    top = dict(sorted(by_site.items(), key=lambda kv: -kv[1])[:400])
    line = {"t": time.time(), "rss": rss, "traced": sum(by_owner.values()), "by_owner": by_owner, "sites": top,
            "tracemalloc_own": tracemalloc.get_tracemalloc_memory()}
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(json.dumps(line) + "\\n")


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def light_sample():
    # arena: bytes malloc took from the system with brk/its heaps; hblkhd: in mmapped blocks; uordblks: in use;
    # fordblks: free but kept. Python's own objects live in pymalloc's mmapped arenas, outside these.
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    with open(f"/proc/{os.getpid()}/status") as f:
        status = dict(l.split(":", 1) for l in f if ":" in l)
    line = {"t": time.time(), "rss": int(status["VmRSS"].split()[0]) * 1024, "threads": int(status["Threads"]),
            "malloc_arena": m.arena, "malloc_mmapped": m.hblkhd, "malloc_in_use": m.uordblks + m.hblkhd,
            "malloc_free": m.fordblks, "py_blocks": sys.getallocatedblocks()}
    if os.environ.get("PROBE_GEN2") == "1":
        # What the GC pacer lists to decide on a full collection (8 bytes a pointer): this list is built here too, on
        # this thread, so it is off by default
        line["gen2_objects"] = len(gc.get_objects(generation=2))
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(json.dumps(line) + "\\n")


TRACE = os.environ.get("PROBE_TRACE", "1") == "1"


def loop():
    while True:
        time.sleep(float(os.environ.get("PROBE_EVERY_S", "60")))
        sample() if TRACE else light_sample()


def snapshots_on_request(where):
    # The driver writes NAME.want; the whole snapshot goes to NAME.snap (tracemalloc.Snapshot.load reads it back),
    # so two of them can be compared at any depth afterwards: the allocations a fault left.
    while True:
        time.sleep(0.2)
        for want in sorted(os.listdir(where)):
            if want.endswith(".want"):
                name = os.path.join(where, want[: -len(".want")])
                tracemalloc.take_snapshot().dump(name + ".part")
                os.rename(name + ".part", name + ".snap")
                os.remove(os.path.join(where, want))


# Started here, once the proxy has imported itself: tracing its imports took minutes on 2 busy cores.
if TRACE:
    tracemalloc.start(int(os.environ.get("PROBE_FRAMES", "4")))
threading.Thread(target=loop, daemon=True, name="rss-probe").start()
if TRACE and os.environ.get("PROBE_SNAP_DIR"):
    threading.Thread(target=snapshots_on_request, args=(os.environ["PROBE_SNAP_DIR"],), daemon=True,
                     name="rss-snapshots").start()


class Probe(CustomLogger):
    pass


probe = Probe()
'''


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=480.0)
    p.add_argument("--cycle-s", type=float, default=120.0)
    p.add_argument("--rps", type=float, default=1.0)
    p.add_argument("--frames", type=int, default=4, help="tracemalloc frames kept per allocation (default 4)")
    p.add_argument(
        "--malloc-arena-max",
        type=int,
        default=None,
        help="MALLOC_ARENA_MAX for the proxy: glibc's malloc arenas (8 per core by default) hold freed native "
        "memory per thread; 2 tells fragmentation apart from a leak",
    )
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=None,
        help="each simulated engine's KV cache (default: the h100 profile's 400,000 tokens, which this load does not "
        "fill in 30 minutes: nothing is evicted, and every map of cached blocks grows the whole run)",
    )
    p.add_argument(
        "--trace-collector",
        type=Path,
        default=None,
        help="also run the collector under tracemalloc (bench/harness/traced_main.py): its sites that grew most, "
        "every minute, as JSON lines to this file",
    )
    p.add_argument(
        "--tracemalloc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="trace the proxy's Python allocations (default on); --no-tracemalloc samples RSS only, without "
        "tracemalloc's own tables, which grow with what they trace and distort the RSS slope",
    )
    p.add_argument(
        "--router",
        choices=("cognitora", "simple-shuffle"),
        default="cognitora",
        help="the proxy's routing strategy: cognitora (with Cognitora's callback, the default) or LiteLLM's own "
        "simple-shuffle with no Cognitora code loaded, to tell LiteLLM's growth from Cognitora's",
    )
    p.add_argument(
        "--gc-pacing-s",
        type=float,
        default=None,
        help="limits.gc_pacing_s in the config (default: the schema's 0.05; 0 leaves CPython's own collector on)",
    )
    p.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another limits.NAME in the config (repeatable), e.g. tokenizer_cache_bytes=0 turns the piece cache off",
    )
    p.add_argument(
        "--fault",
        choices=("cycle", "redis-restart", "config-reload", "engine-restart", "none"),
        default="cycle",
        help="cycle (default): the soak's faults in turn every --cycle-s for --duration-s; a kind: only that fault, "
        "--faults times every --every-s after --warmup-s, RSS just before each (a high-water mark stops rising, a "
        "leak steps up at every fault)",
    )
    p.add_argument("--faults", type=int, default=12)
    p.add_argument("--every-s", type=float, default=30.0)
    p.add_argument("--warmup-s", type=float, default=120.0)
    p.add_argument(
        "--after-s", type=float, default=15.0, help="with --snapshot-dir, the second snapshot this long after a fault"
    )
    p.add_argument(
        "--snapshot-dir",
        type=Path,
        default=None,
        help="with a --fault kind and tracemalloc: the proxy dumps a tracemalloc snapshot before each fault and "
        "--after-s after it into this folder (before-NN.snap, after-NN.snap; compare them with "
        "python -m bench.snapshot_diff)",
    )
    p.add_argument(
        "--count-gen2",
        action="store_true",
        help="the light probe also counts the objects in the oldest GC generation (it lists them, as the GC pacer "
        "does: a list of 8 bytes an object, on the probe's thread; perturbs RSS, so a run of its own)",
    )
    p.add_argument("--out", type=Path, default=OUT, help=f"the report (default {OUT.relative_to(OUT.parents[2])})")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cognitora-litellm-rss-"))
    tokenizer = SMOLLM2_DIR / "tokenizer.json"
    redis_port = free_port()
    redis_proc = start_redis(redis_port, str(work))
    run = Run()
    procs: dict[str, ManagedProcess] = {}
    samples = work / "probe.jsonl"
    with start_fleet(
        2, tokenizer=tokenizer, time_scale=10.0, log_dir=work, kv_capacity_tokens=args.kv_capacity_tokens
    ) as fleet:
        config: dict[str, Any] = {
            "redis_url": f"redis://127.0.0.1:{redis_port}/0",
            "key_prefix": "rss",
            "scrape": {"interval_s": 1.0},
            "models": [fleet.model_config(tokenizer)],
        }
        limits: dict[str, Any] = {name: yaml.safe_load(value) for name, value in (x.split("=", 1) for x in args.limit)}
        if args.gc_pacing_s is not None:
            limits["gc_pacing_s"] = args.gc_pacing_s
        if limits:
            config["limits"] = limits
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        (work / "rss_probe.py").write_text(PROBE)
        try:
            cli = [sys.executable, "-m", "cognitora.cli"]
            collector = [*cli, "collector", "--config", str(config_path)]
            collector_env = None
            if args.trace_collector is not None:
                collector = [sys.executable, "-m", "bench.harness.traced_main", "cognitora.cli", *collector[3:]]
                path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
                collector_env = {"TRACED_OUT": str(args.trace_collector.resolve()), "PYTHONPATH": path}
            procs["collector"] = ManagedProcess(collector, work / "c.log", env=collector_env)
            litellm_config = proxy_config(fleet, config_path, tokenizer, ["rss_probe.probe"])
            if args.router == "simple-shuffle":
                litellm_config["router_settings"] = {"routing_strategy": "simple-shuffle"}
                litellm_config["litellm_settings"]["callbacks"] = ["rss_probe.probe"]
            (work / "litellm.yaml").write_text(yaml.safe_dump(litellm_config))
            key = "sk-rss-" + secrets.token_hex(8)
            proxy_port = free_port()
            pythonpath = os.pathsep.join(filter(None, [str(work), str(ROOT), os.environ.get("PYTHONPATH", "")]))
            env = {
                "LITELLM_MASTER_KEY": key,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
                "PYTHONPATH": pythonpath,
                "PROBE_OUT": str(samples),
                # with snapshots on request, no periodic one beside them (each costs the proxy seconds of CPU)
                "PROBE_EVERY_S": str(
                    SAMPLE_S if args.fault == "cycle" else RSS_SAMPLE_S if args.snapshot_dir is None else 1e9
                ),
                "PROBE_FRAMES": str(args.frames),
                "PROBE_TRACE": "1" if args.tracemalloc else "0",
                "PROBE_GEN2": "1" if args.count_gen2 else "0",
            }
            if args.snapshot_dir is not None:
                args.snapshot_dir.mkdir(parents=True, exist_ok=True)
                env["PROBE_SNAP_DIR"] = str(args.snapshot_dir.resolve())
            if args.malloc_arena_max is not None:
                env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
            argv_l = [str(LITELLM), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1"]
            procs["litellm"] = ManagedProcess(
                [*argv_l, "--port", str(proxy_port)], work / "litellm.log", env=env, cwd=work
            )
            procs["litellm"].wait_http(f"http://127.0.0.1:{proxy_port}/health/liveliness", timeout_s=300)
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            proxy_pid = procs["litellm"].pid

            async def fault(kind: str, n: int) -> None:
                nonlocal redis_proc
                if kind == "engine-restart":
                    await asyncio.to_thread(fleet.fault, n % 2, "restart")
                elif kind == "redis-restart":
                    redis_proc.kill()
                    redis_proc.wait()
                    redis_proc = await asyncio.to_thread(start_redis, redis_port, str(work))
                elif kind == "config-reload":
                    config["scrape"] = {"interval_s": 1.0 if n % 2 else 1.5}
                    config_path.write_text(yaml.safe_dump(config))

            async def drive() -> None:
                t0 = time.monotonic()
                stop = asyncio.Event()
                auth = {"Authorization": f"Bearer {key}"}
                loader = asyncio.create_task(load(proxy_url, "litellm", auth, fleet.model, args.rps, run, t0, stop))
                next_fault, n_fault, next_sample = 0.0, 0, 0.0
                while (now := time.monotonic() - t0) < args.duration_s:
                    if now >= next_sample:
                        got = proc_sample(proxy_pid)
                        if got is not None:
                            run.samples.setdefault("litellm", []).append((now, got[0], got[1]))
                        next_sample += RSS_SAMPLE_S
                    if now >= next_fault + args.cycle_s:
                        next_fault += args.cycle_s
                        kind = FAULTS[n_fault % len(FAULTS)]
                        n_fault += 1
                        run.faults.append((now, kind))
                        await fault(kind, n_fault)
                    await asyncio.sleep(0.5)
                stop.set()
                await loader

            async def snapshot(name: str) -> None:
                if args.snapshot_dir is None:
                    return
                (args.snapshot_dir / f"{name}.want").touch()
                deadline = time.monotonic() + 120
                while not (args.snapshot_dir / f"{name}.snap").exists():
                    if time.monotonic() > deadline:
                        raise SystemExit(f"no snapshot {name} from the proxy in 120 s")
                    await asyncio.sleep(0.2)

            async def drive_one_kind() -> float:
                """One kind of fault every --every-s; RSS (and a snapshot) just before each and --after-s after.
                Returns the wall time of its start (the probe's samples are stamped in wall time)."""
                wall0, t0 = time.time(), time.monotonic()
                stop = asyncio.Event()
                auth = {"Authorization": f"Bearer {key}"}
                loader = asyncio.create_task(load(proxy_url, "litellm", auth, fleet.model, args.rps, run, t0, stop))

                async def every_10_s() -> None:  # where a step falls, and how long after a fault
                    while not stop.is_set():
                        got = proc_sample(proxy_pid)
                        if got is not None:
                            run.samples.setdefault("litellm-10s", []).append((time.monotonic() - t0, got[0], got[1]))
                        await asyncio.sleep(RSS_SAMPLE_S)

                sampler = asyncio.create_task(every_10_s())
                await asyncio.sleep(args.warmup_s)
                for n in range(args.faults + 1):
                    got = proc_sample(proxy_pid)
                    if got is None:
                        raise SystemExit(f"the proxy exited; see {work / 'litellm.log'}")
                    run.samples.setdefault("litellm", []).append((time.monotonic() - t0, got[0], got[1]))
                    print(f"before fault {n}: {time.monotonic() - t0:.0f} s, proxy RSS {got[0]:.2f} MiB", flush=True)
                    await snapshot(f"before-{n:02d}")
                    if n == args.faults:
                        break
                    run.faults.append((time.monotonic() - t0, args.fault))
                    await fault(args.fault, n)
                    await asyncio.sleep(args.after_s)
                    await snapshot(f"after-{n:02d}")
                    await asyncio.sleep(max(0.0, args.every_s - args.after_s))
                stop.set()
                await asyncio.gather(loader, sampler)
                return wall0

            if args.fault != "cycle":
                wall0 = asyncio.run(drive_one_kind())
                report_per_fault(args, run, samples, wall0)
                return 0
            asyncio.run(drive())
            if args.tracemalloc:
                report(args, run, samples)
            else:
                report_rss(args, run, samples)
        finally:
            for proc in procs.values():
                proc.stop(grace_s=2)  # (the proxy ignores SIGTERM: SIGKILL after 2 s)
            redis_proc.kill()
    return 0


def command(args: argparse.Namespace) -> str:
    if args.fault == "cycle":
        timing = f"--duration-s {args.duration_s:g} --cycle-s {args.cycle_s:g}"
    else:
        timing = f"--fault {args.fault} --faults {args.faults} --every-s {args.every_s:g} --warmup-s {args.warmup_s:g}"
    flags = [
        f"{timing} --rps {args.rps:g} --frames {args.frames}",
        "" if args.snapshot_dir is None else f"--snapshot-dir {args.snapshot_dir} --after-s {args.after_s:g}",
        "" if args.tracemalloc else "--no-tracemalloc",
        "--count-gen2" if args.count_gen2 else "",
        "" if args.router == "cognitora" else f"--router {args.router}",
        "" if args.gc_pacing_s is None else f"--gc-pacing-s {args.gc_pacing_s:g}",
        *(f"--limit {x}" for x in args.limit),
        "" if args.malloc_arena_max is None else f"--malloc-arena-max {args.malloc_arena_max}",
        "" if args.kv_capacity_tokens is None else f"--kv-capacity-tokens {args.kv_capacity_tokens}",
        "" if args.trace_collector is None else f"--trace-collector {args.trace_collector}",
        "" if args.out == OUT else f"--out {args.out}",
    ]
    return "python -m bench.litellm_rss " + " ".join(f for f in flags if f)


def rss_rows(run: Run) -> list[str]:
    """The proxy's RSS sampled from outside every RSS_SAMPLE_S: least-squares slopes after the warm-up and over each
    half of it (a leak keeps its slope; a cache or fragmentation levels off), then the samples a minute apart."""
    points = [(t, r) for t, r, _ in run.samples.get("litellm", [])]
    steady = [p for p in points if p[0] >= RSS_WARMUP_S]
    if len(steady) < 4:
        return ["Too few RSS samples after the warm-up."]
    mid = (steady[0][0] + steady[-1][0]) / 2
    halves = [p for p in steady if p[0] < mid], [p for p in steady if p[0] >= mid]
    out = [
        "| RSS from (s) | to (s) | first MiB | last MiB | fitted slope MiB/h |",
        "|---|---|---|---|---|",
    ]
    for part in (steady, *halves):
        out.append(
            f"| {part[0][0]:.0f} | {part[-1][0]:.0f} | {part[0][1]:.1f} | {part[-1][1]:.1f} | "
            f"{slope_per_hour(part):+.1f} |"
        )
    out += ["", "RSS samples (s: MiB), one a minute:", ""]
    out.append(", ".join(f"{t:.0f}: {r:.1f}" for i, (t, r) in enumerate(points) if i % 6 == 0))
    return out


def answered(run: Run) -> str:
    statuses: dict[int, int] = {}
    for _, _, s in run.answers:
        statuses[s] = statuses.get(s, 0) + 1
    return (
        f"Requests answered 200: {statuses.get(200, 0)} of {len(run.answers)} (statuses {statuses}, -1: transport "
        "error or timeout)"
    )


def probe_rows(samples: Path, every_s: float = SAMPLE_S) -> list[str]:
    """The light probe's counters inside the proxy, fitted from RSS_WARMUP_S on: where the RSS slope goes."""
    lines = [json.loads(x) for x in samples.read_text().splitlines() if x.strip()] if samples.exists() else []
    if len(lines) < 4:
        return []
    t0 = lines[0]["t"] - every_s
    steady = [x for x in lines if x["t"] - t0 >= RSS_WARMUP_S] or lines
    mib = 1 / 2**20
    out = [
        "",
        f"Inside the proxy (the probe callback, every {every_s:g} s), fitted from {RSS_WARMUP_S:g} s on:",
        "",
        "| counter | first | last | fitted slope per hour |",
        "|---|---|---|---|",
    ]
    names = {
        "rss": "RSS MiB",
        "malloc_in_use": "glibc malloc, in use MiB (Rust/C libraries, Python's large objects)",
        "malloc_free": "glibc malloc, free but kept MiB (fragmentation)",
        "malloc_arena": "glibc malloc, arena bytes from the system MiB",
        "malloc_mmapped": "glibc malloc, mmapped blocks MiB",
        "py_blocks": "Python allocated blocks (thousands)",
        "threads": "threads",
        "gen2_objects": "objects in the oldest GC generation (thousands; --count-gen2)",
    }
    for key, name in names.items():
        if key not in steady[0]:
            continue
        scale = mib if key.startswith(("rss", "malloc")) else (1e-3 if key in ("py_blocks", "gen2_objects") else 1.0)
        pts = [(x["t"] - t0, x[key] * scale) for x in steady]
        out.append(f"| {name} | {pts[0][1]:.1f} | {pts[-1][1]:.1f} | {slope_per_hour(pts):+.1f} |")
    return out


def report_rss(args: argparse.Namespace, run: Run, samples: Path) -> None:
    load_avg = os.getloadavg()
    out = [
        "# LiteLLM proxy memory: RSS only",
        "",
        f"Command: `{command(args)}` (one worker, no tracemalloc; bench/litellm_rss.py). {answered(run)}; faults: "
        f"{', '.join(k for _, k in run.faults)}. Load average at the end: {load_avg[0]:.1f} / {load_avg[1]:.1f} / "
        f"{load_avg[2]:.1f}.",
        "",
        *rss_rows(run),
        *probe_rows(samples, RSS_SAMPLE_S),
    ]
    args.out.write_text("\n".join(out) + "\n")
    print("\n".join(out))


def steps(run: Run, samples: Path, wall0: float, over_mib: float = 1.0) -> list[str]:
    """Each 10-s RSS step over ``over_mib``: when, how long after the last fault, and (without tracemalloc, from the
    light probe's samples on either side of it) what moved inside the proxy with it."""
    points = run.samples.get("litellm-10s", [])
    lines = [json.loads(x) for x in samples.read_text().splitlines() if x.strip()] if samples.exists() else []
    out = []
    for (t1, r1, _), (t2, r2, _) in itertools.pairwise(points):
        if r2 - r1 < over_mib:
            continue
        since = [t1 - f for f, _ in run.faults if f <= t2]
        when = "no fault yet" if not since else f"{since[-1]:.0f} s after a fault"
        if since and since[-1] < 0:
            when = "a fault within it"
        where = f"from {t1:.0f} s to {t2:.0f} s, {when}"
        inside = ""
        # The probe samples on its own clock, every 10 s too: the pair of its samples around the step (give or take
        # one sample) whose RSS rose most is the same step seen from inside
        near = [x for x in lines if t1 - 2 * RSS_SAMPLE_S <= x["t"] - wall0 <= t2 + 2 * RSS_SAMPLE_S]
        pairs = list(itertools.pairwise(near))
        if pairs:
            a, b = max(pairs, key=lambda ab: ab[1]["rss"] - ab[0]["rss"])
            inside = (
                f"; inside: Python blocks {b['py_blocks'] - a['py_blocks']:+,}, glibc malloc in use "
                f"{(b['malloc_in_use'] - a['malloc_in_use']) / 2**20:+.2f} MiB, free but kept "
                f"{(b['malloc_free'] - a['malloc_free']) / 2**20:+.2f} MiB, from the system "
                f"{(b['malloc_arena'] + b['malloc_mmapped'] - a['malloc_arena'] - a['malloc_mmapped']) / 2**20:+.2f}"
                f" MiB, threads {a['threads']} -> {b['threads']}"
            )
        out.append(f"- {r2 - r1:+.2f} MiB, {where}{inside}")
    return out or [f"- none over {over_mib:g} MiB"]


def report_per_fault(args: argparse.Namespace, run: Run, samples: Path, wall0: float) -> None:
    """RSS just before each fault: after a high-water mark it stays; a leak keeps stepping up."""
    rss = [r for _, r, _ in run.samples.get("litellm", [])]
    half = len(rss) // 2
    out = [
        f"# LiteLLM proxy RSS, {args.fault} x {args.faults}",
        "",
        f"Command: `{command(args)}` (one worker; bench/litellm_rss.py). {answered(run)}.",
        "",
        "| before fault | s | RSS MiB | since the previous |",
        "|---|---|---|---|",
    ]
    for n, (t, r, _) in enumerate(run.samples.get("litellm", [])):
        out.append(f"| {n} | {t:.0f} | {r:.2f} | {r - rss[n - 1] if n else 0.0:+.2f} |")
    out += [
        "",
        f"{args.fault} x {args.faults}: RSS {rss[0]:.2f} -> {rss[half]:.2f} -> {rss[-1]:.2f} MiB (first half of the "
        f"faults {rss[half] - rss[0]:+.2f}, second half {rss[-1] - rss[half]:+.2f})",
        "",
        f"RSS steps within {RSS_SAMPLE_S:g} s (sampled every {RSS_SAMPLE_S:g} s from the start):",
        "",
        *steps(run, samples, wall0),
        *probe_rows(samples, RSS_SAMPLE_S),
    ]
    args.out.write_text("\n".join(out) + "\n")
    print("\n".join(out))


def report(args: argparse.Namespace, run: Run, samples: Path) -> None:
    lines = [json.loads(x) for x in samples.read_text().splitlines() if x.strip()]
    start = min(lines[0]["t"] + WARMUP_S - SAMPLE_S, lines[-1]["t"])
    first = next(x for x in lines if x["t"] >= start)
    last = lines[-1]
    mib = 1 / 2**20
    span_h = (last["t"] - first["t"]) / 3600 or 1.0
    out = [
        "# LiteLLM proxy memory: whose allocations grow",
        "",
        f"Command: `{command(args)}` (one worker, tracemalloc from the config load on; "
        f"bench/litellm_rss.py). {answered(run)}; faults: {', '.join(k for _, k in run.faults)}.",
        "",
        f"From the sample at {first['t'] - lines[0]['t'] + SAMPLE_S:.0f} s to the last at "
        f"{last['t'] - lines[0]['t'] + SAMPLE_S:.0f} s:",
        "",
        "| what | first MiB | last MiB | growth MiB | per hour |",
        "|---|---|---|---|---|",
    ]

    def row(name: str, a: float, b: float) -> str:
        return f"| {name} | {a * mib:.1f} | {b * mib:.1f} | {(b - a) * mib:+.1f} | {(b - a) * mib / span_h:+.1f} |"

    out.append(row("RSS", first["rss"], last["rss"]))
    # A leak grows at the same rate throughout; fragmentation and caches level off: the second half tells them apart.
    middle = next(x for x in lines if x["t"] >= (first["t"] + last["t"]) / 2)
    if middle is not last:
        half_h = (last["t"] - middle["t"]) / 3600
        grew = (last["rss"] - middle["rss"]) * mib
        out.append(
            f"| RSS, second half (from {middle['t'] - lines[0]['t'] + SAMPLE_S:.0f} s) | {middle['rss'] * mib:.1f} "
            f"| {last['rss'] * mib:.1f} | {grew:+.1f} | {grew / half_h:+.1f} |"
        )
    out.append(row("traced by tracemalloc", first["traced"], last["traced"]))
    out.append(row("tracemalloc's own", first.get("tracemalloc_own", 0), last.get("tracemalloc_own", 0)))
    for who in ("cognitora", "litellm", "other"):
        out.append(row(f"  charged to {who}", first["by_owner"].get(who, 0), last["by_owner"].get(who, 0)))
    growth = {s: v - first["sites"].get(s, 0) for s, v in last["sites"].items()}
    out += ["", "Sites that grew most (owner, innermost frame):", "", "| site | growth KiB |", "|---|---|"]
    for site, grew in sorted(growth.items(), key=lambda kv: -kv[1])[:10]:
        out.append(f"| `{site.replace(str(ROOT), '.')}` | {grew / 1024:+.0f} |")
    out += ["", "Samples (s, RSS MiB, traced MiB, cognitora / litellm / other MiB):", ""]
    for x in lines:
        o = x["by_owner"]
        out.append(
            f"- {x['t'] - lines[0]['t'] + SAMPLE_S:.0f}: {x['rss'] * mib:.1f}, {x['traced'] * mib:.1f}, "
            f"{o.get('cognitora', 0) * mib:.1f} / {o.get('litellm', 0) * mib:.1f} / {o.get('other', 0) * mib:.1f}"
        )
    args.out.write_text("\n".join(out) + "\n")
    print("\n".join(out[:16]))


if __name__ == "__main__":
    raise SystemExit(main())
