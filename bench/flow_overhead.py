"""What the gateway queue costs: memory per waiting request, CPU while thousands wait, the queue's own work per
request, and the event loop's lag in a burst of 10x the capacity. ``cognitora.flow.FlowController`` on a real
asyncio loop, with a ``Placer`` over a count of free seats (a placement that costs nothing, so what is measured is
the queue's own cost; the core's placement is ``bench/results/budget_overhead.md``'s ``budgets off`` row).

    .venv/bin/python -m bench.flow_overhead --rounds 3

- **Memory**: ``tracemalloc`` over N requests waiting, each its own task (as a gateway's request is), against N
  tasks awaiting a bare future (what a gateway holds for a pending request anyway): per request, the difference
  (the queue's own: ticket, entry, its future, its deadline timer, two ordered-dict nodes) and the whole.
- **CPU while waiting**: this process's CPU seconds per second over ``--window-s`` with N waiting on a saturated
  fleet: the queue re-checked every 0.25 s and woken 200 times a second (attempts finishing), each try finding the
  fleet still full (``retry_spacing_s`` at its default merges the wake-ups). With N = 0, 1,000 and 10,000: waiting
  must cost memory, not CPU. The tries per second are what the core's placements would add (each ~1.3 ms of CPU).
- **Per request**: microseconds to queue N requests (task creation included), and to dispatch them all once
  capacity frees (each placed, its future resolved, its task resumed and finished).
- **Burst**: 100 seats, each held 20 ms; 1,000 requests arrive at once (10x): the first 100 take the free seats,
  900 wait; a 1 ms ticker measures the loop's lag until all have been served (ideal: 10 rounds of 20 ms).

Writes ``<out>/flow_overhead.md`` and ``.json``. The machine is shared: the figures are medians over rounds with
their range; compare rows with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cognitora.flow.bands import Band
from cognitora.flow.config import FlowControlConfig, HoldReason
from cognitora.flow.controller import FlowController, Ticket
from cognitora.flow.outcome import Held, QueueRefusal, WakeReason
from cognitora.flow.saturation import Saturation

ROOT = Path(__file__).resolve().parent.parent
FULL = Saturation(HoldReason.SEATS, "full")
BANDS = (Band("interactive", 600.0, None), Band("batch", 600.0, 300.0))
TEAMS = 50


class Seats:
    def __init__(self, free: int = 0) -> None:
        self.free = free
        self.placed = 0
        self.tries = 0

    async def place(self, ticket: Ticket[int]) -> int | Held:
        self.tries += 1
        if self.free <= 0:
            return Held("full")
        self.free -= 1
        self.placed += 1
        return ticket.item

    def unclaimed(self, result: int) -> None:
        self.free += 1


def controller(seats: Seats, **config: Any) -> FlowController[int, int]:
    settings = {"max_queued": 100_000, "recheck_interval_s": 0.25, **config}
    return FlowController(FlowControlConfig.model_validate(settings), BANDS, seats)


def waiting(c: FlowController[int, int], n: int) -> list[asyncio.Task[int | QueueRefusal]]:
    return [
        asyncio.create_task(
            c.wait(
                i,
                request_id=str(i),
                band=BANDS[i % 2].name,
                flow=f"team:{i % TEAMS}",
                cost=float(100 + i % 4000),
                saturation=FULL,
            )
        )
        for i in range(n)
    ]


async def settle(until: Callable[[], bool]) -> None:
    while not until():
        await asyncio.sleep(0.001)


async def cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def memory(n: int, queued: bool) -> float:
    """Bytes per request held by ``n`` waiting requests: through the queue, or each a task awaiting a future.
    One fresh loop per figure (garbage of an earlier figure freed meanwhile would read as negative)."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    c: FlowController[int, int] | None = None
    if queued:
        c = controller(Seats(0), recheck_interval_s=10.0)
        tasks = waiting(c, n)
        await settle(lambda: c is not None and c.snapshot().waiting == n)
    else:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(_await(loop.create_future())) for _ in range(n)]
        await asyncio.sleep(0.01)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    await cancel_all(tasks)
    if c is not None:
        await c.close()
    return held / n


async def _await(f: asyncio.Future[Any]) -> Any:
    return await f


async def cpu_while_waiting(n: int, window_s: float) -> dict[str, float]:
    seats = Seats(0)
    c = controller(seats)
    tasks = waiting(c, n)
    await settle(lambda: c.snapshot().waiting == n)
    stop = asyncio.Event()

    async def finishes() -> None:  # 200 attempts a second finish elsewhere and wake the queue
        while not stop.is_set():
            c.wake(WakeReason.FINISHED)
            await asyncio.sleep(0.005)

    waker = asyncio.create_task(finishes())
    tries = seats.tries
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.sleep(window_s)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    stop.set()
    await waker
    tries = seats.tries - tries
    await cancel_all(tasks)
    await c.close()
    return {"cpu_share": cpu / wall, "tries_per_s": tries / wall}


async def per_request(n: int) -> dict[str, float]:
    seats = Seats(0)
    c = controller(seats, recheck_interval_s=10.0)
    started = time.perf_counter()
    tasks = waiting(c, n)
    await settle(lambda: c.snapshot().waiting == n)
    enqueue = time.perf_counter() - started
    seats.free = n
    started = time.perf_counter()
    c.wake(WakeReason.FINISHED)
    await asyncio.gather(*tasks)
    dispatch = time.perf_counter() - started
    await c.close()
    return {"enqueue_us": enqueue / n * 1e6, "dispatch_us": dispatch / n * 1e6}


async def burst(seats_n: int = 100, factor: int = 10, hold_s: float = 0.02) -> dict[str, float]:
    seats = Seats(seats_n)
    c = controller(seats)
    lags: list[float] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def ticker() -> None:
        while not done.is_set():
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t - 0.001)

    async def serve(i: int) -> None:
        if i >= seats_n:  # the first ``seats_n`` find a seat and are placed at once; the rest find none and wait
            flow = f"team:{i % TEAMS}"
            await c.wait(i, request_id=str(i), band="interactive", flow=flow, cost=100.0, saturation=FULL)
        else:
            seats.free -= 1
        await asyncio.sleep(hold_s)  # the request holds its seat, then finishes and wakes the queue
        seats.free += 1
        c.wake(WakeReason.FINISHED)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    n = seats_n * factor
    await asyncio.gather(*(serve(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    done.set()
    await tick
    await c.close()
    lags.sort()
    return {
        "drain_s": elapsed,
        "ideal_drain_s": factor * hold_s,
        "lag_p50_ms": lags[len(lags) // 2] * 1000,
        "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1000,
        "lag_max_ms": lags[-1] * 1000,
    }


def spread(values: Sequence[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)} .. {format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        row: dict[str, Any] = {}
        for n in (1000, 10_000):
            whole, bare = asyncio.run(memory(n, queued=True)), asyncio.run(memory(n, queued=False))
            row[f"memory_{n}"] = {"per_request_bytes": whole, "queue_own_bytes": whole - bare}
            row[f"per_request_{n}"] = asyncio.run(per_request(n))
        for n in (0, 1000, 10_000):
            row[f"cpu_{n}"] = asyncio.run(cpu_while_waiting(n, args.window_s))
        row["burst"] = asyncio.run(burst())
        row["load_1m"] = os.getloadavg()[0]
        rounds.append(row)
        print(json.dumps(row))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flow_overhead.json").write_text(json.dumps({"rounds": rounds}, indent=1) + "\n")

    def col(key: str, field: str) -> list[float]:
        return [r[key][field] for r in rounds]

    loads = ", ".join(f"{r['load_1m']:.1f}" for r in rounds)
    lines = [
        "# Gateway queue overhead: memory, CPU while waiting, per-request work, loop lag in a burst",
        "",
        f"Command: `.venv/bin/python -m bench.flow_overhead --rounds {args.rounds} --window-s {args.window_s:g}`",
        "",
        f"Machine: {platform.machine()}, CPython {platform.python_version()}, shared with other engineers' runs "
        f"(2 cores; load average at the end of each round: {loads}). "
        f"{args.rounds} rounds; each cell: median (min .. max). The placer costs nothing: these are the queue's "
        "own costs, on top of a placement each (bench/flow_overhead.py says what each figure is).",
        "",
        "| waiting | memory per request, whole (bytes) | of which the queue's own (bytes) | queue (us/request) "
        "| dispatch (us/request) |",
        "|---|---|---|---|---|",
    ]
    for n in (1000, 10_000):
        lines.append(
            f"| {n:,} | {spread(col(f'memory_{n}', 'per_request_bytes'), '.0f')} "
            f"| {spread(col(f'memory_{n}', 'queue_own_bytes'), '.0f')} "
            f"| {spread(col(f'per_request_{n}', 'enqueue_us'), '.1f')} "
            f"| {spread(col(f'per_request_{n}', 'dispatch_us'), '.1f')} |"
        )
    lines += [
        "",
        f"CPU while requests wait on a saturated fleet ({args.window_s:g} s window; re-check every 0.25 s, 200 "
        "wake-ups a second from finishing attempts, each try finding the fleet full):",
        "",
        "| waiting | CPU (share of one core) | placement tries per second |",
        "|---|---|---|",
    ]
    for n in (0, 1000, 10_000):
        cpu, tries = spread(col(f"cpu_{n}", "cpu_share"), ".3f"), spread(col(f"cpu_{n}", "tries_per_s"), ".0f")
        lines.append(f"| {n:,} | {cpu} | {tries} |")
    b = [r["burst"] for r in rounds]
    lines += [
        "",
        "Burst: 100 seats held 20 ms each, 1,000 requests at once (10x: 100 placed at once, 900 wait); the loop's "
        "lag on a 1 ms ticker, and how long until all were served (ideal: 10 rounds of 20 ms):",
        "",
        "| drained in (s) | ideal (s) | lag p50 (ms) | lag p99 (ms) | lag max (ms) |",
        "|---|---|---|---|---|",
        f"| {spread([x['drain_s'] for x in b], '.3f')} | {b[0]['ideal_drain_s']:.3f} "
        f"| {spread([x['lag_p50_ms'] for x in b], '.2f')} | {spread([x['lag_p99_ms'] for x in b], '.2f')} "
        f"| {spread([x['lag_max_ms'] for x in b], '.2f')} |",
    ]
    text = "\n".join(lines) + "\n"
    (args.out / "flow_overhead.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
