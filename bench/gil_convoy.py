"""Does the embedded collector's /metrics parsing slow a gateway's event loop through the GIL (a "convoy")?

    python -m bench.gil_convoy [--requests 60] [--rps 3] [--rounds 2] [--out bench/results/gil_convoy.md]
    python -m bench.gil_convoy --hogs 3 --out bench/results/gil_convoy_hogs.md   # cores contended, as with engines

The hypothesis (issue 45): the LiteLLM proxy's loop does many short I/O operations per request; each releases the
GIL, and when another thread of the process is CPU-bound (the embedded collector parsing engines' /metrics pages)
the loop waits up to ``sys.getswitchinterval()`` (5 ms) to get it back, so a few ms of background CPU would cost
each request far more.

The model: one process, one event loop serving open-loop requests (``--rps``, Poisson), each request ``STEPS``
steps of ``STEP_MS`` ms of pure-Python CPU followed by a 200-byte round trip over a socket to an echo server in
another process (LiteLLM's proxy spends ~42 ms of CPU per request, in many steps between awaits). Beside it, in the
same process, a thread parsing ``tests/data/vllm_0.32_metrics.txt`` (a real vLLM 0.32 page) with the scraper's own
``parse_prometheus_text`` and, for contrast, with prometheus_client's parser as the scraper used before:
``collector`` = 3 pages a second (3 engines scraped each second, as the benchmark's proxy does), ``10x`` = 30 pages
a second. Each mode at the default switch interval and at 0.5 ms. ``--hogs N``: N busy processes at nice 10 beside
it (the benchmark's engines run at nice 10 and keep every core busy; then a thread holding the GIL can lose its
core, which is when a convoy would hurt most). Mean and p90 request latency, ms; the modes
interleave per round so machine noise hits all alike.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvstate.engines.prom import parse_prometheus_text  # noqa: E402

PAGE = ROOT / "tests" / "data" / "vllm_0.32_metrics.txt"
STEPS = 40
STEP_MS = 1.0
PAGES_PER_S = {"none": 0, "collector": 3, "collector 10x": 30}


def _echo_server(port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def _spin(ms: float) -> None:
    until = time.perf_counter() + ms / 1000
    while time.perf_counter() < until:
        pass


async def _request(port: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    for _ in range(STEPS):
        _spin(STEP_MS)
        writer.write(b"x" * 200)
        await writer.drain()
        await reader.read(4096)
    writer.close()
    return time.perf_counter() - start


async def _load(port: int, rps: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        tasks.append(asyncio.create_task(_request(port)))
        await asyncio.sleep(rng.expovariate(rps))
    return list(await asyncio.gather(*tasks))


def _old_parse(text: str) -> None:
    """The scraper's parse before the lean path: comments, buckets and _created dropped, then prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    body = "\n".join(
        line
        for line in text.splitlines()
        if not line.startswith("#") and "_bucket{" not in line and "_created{" not in line
    )
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            float(sample.value)


def _parser(stop: threading.Event, parse: Callable[[str], object], page: str, per_s: int, busy: list[float]) -> None:
    period = 1.0 / per_s
    while not stop.wait(period):
        start = time.thread_time()
        parse(page)
        busy[0] += time.thread_time() - start


def run_one(port: int, mode: str, parse: Callable[[str], object], switch_s: float, args: argparse.Namespace) -> dict:
    page = PAGE.read_text()
    sys.setswitchinterval(switch_s)
    stop, busy = threading.Event(), [0.0]
    thread = None
    if PAGES_PER_S[mode]:
        thread = threading.Thread(target=_parser, args=(stop, parse, page, PAGES_PER_S[mode], busy), daemon=True)
        thread.start()
    started = time.perf_counter()
    latencies = asyncio.run(_load(port, args.rps, args.requests, seed=1))
    wall = time.perf_counter() - started
    stop.set()
    if thread is not None:
        thread.join()
    sys.setswitchinterval(0.005)
    latencies.sort()
    return {
        "mean": statistics.mean(latencies) * 1000,
        "p90": latencies[int(0.9 * len(latencies))] * 1000,
        "parse_cpu_ms_per_s": busy[0] * 1000 / wall,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gil_convoy", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--rps", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hogs", type=int, default=0, help="busy processes at nice 10 beside the model")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gil_convoy.md")
    args = p.parse_args(argv)
    port = 20_000 + os.getpid() % 20_000
    echo = mp.Process(target=_echo_server, args=(port,), daemon=True)
    echo.start()
    hogs = [subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    time.sleep(0.5)
    parsers: dict[str, Callable[[str], object]] = {"lean": parse_prometheus_text, "prometheus_client": _old_parse}
    configs = [("none", "-", 0.005)] + [
        (mode, parser, switch)
        for mode in ("collector", "collector 10x")
        for parser in parsers
        for switch in (0.005, 0.0005)
    ]
    results: dict[tuple[str, str, float], list[dict]] = {c: [] for c in configs}
    load = [os.getloadavg()[0]]
    try:
        for _ in range(args.rounds):
            for config in configs:
                mode, parser, switch = config
                results[config].append(run_one(port, mode, parsers.get(parser, parse_prometheus_text), switch, args))
                print(config, results[config][-1], flush=True)
        load.append(os.getloadavg()[0])
    finally:
        echo.terminate()
        for hog in hogs:
            hog.kill()
            hog.wait()
    rows = [
        "# GIL convoy: does /metrics parsing on a thread slow a gateway's event loop?",
        "",
        f"Command: `python -m bench.gil_convoy --requests {args.requests} --rps {args.rps} --rounds {args.rounds}"
        f"{f' --hogs {args.hogs}' if args.hogs else ''}`  ",
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs shared with other work; load average (1 min) at "
        f"start / end {load[0]:.1f} / {load[1]:.1f}. The model is in the module docstring: requests of {STEPS} "
        f"steps of {STEP_MS:g} ms CPU + a socket round trip, {args.rps:g} rps open loop, a parsing thread beside the "
        f"loop on the real vLLM 0.32 page ({PAGE.stat().st_size:,} bytes). Median over {args.rounds} rounds, ms."
        + (f" {args.hogs} busy processes at nice 10 beside it." if args.hogs else ""),
        "",
        "| parsing thread | parser | switch interval | request mean | request p90 | parse CPU ms/s |",
        "|---|---|---|---|---|---|",
    ]
    for (mode, parser, switch), runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        rows.append(
            f"| {mode} | {parser} | {switch * 1000:g} ms | {med['mean']:.1f} | {med['p90']:.1f} | "
            f"{med['parse_cpu_ms_per_s']:.1f} |"
        )
    args.out.write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
