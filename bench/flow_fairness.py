"""Which order should the gateway queue keep? A discrete-event simulation of a saturated fleet with a noisy
neighbour, comparing queue policies on the same arrivals, with the real ``cognitora.flow.fair_queue.FairQueue``.

    .venv/bin/python -m bench.flow_fairness --seeds 3 --duration 300

**Fleet.** 4 engines, each prefilling one request at a time at 8,000 uncached tokens/s (chunked prefill is
serial in the prefill budget) with 32 seats; a request holds a seat from dispatch until its 64 output tokens are
decoded at 25 ms each. Prefill is the scarce resource: 32,000 uncached tokens/s for the fleet.

**Teams** (Poisson arrivals, the same per seed for every policy):

- ``A`` the noisy neighbour: 4 requests/s of 12,000 uncached tokens (48,000 tokens/s: 1.5x the fleet alone, far
  more than its share);
- ``B`` a light, chatty team: 16 requests/s of 250 tokens (4,000 tokens/s);
- ``C`` an agent with a long system prompt the engines hold: 5 requests/s of 8,000 prompt tokens, 7,800 cached
  (1,000 uncached tokens/s; a router that cannot see caches thinks it is 40,000).

**Policies.** ``none``: no gateway queue, each request placed on arrival on the engine with the lowest predicted
TTFT (its prefill backlog plus its own prefill): today's non-sheddable behaviour. The others hold a request at the
gateway until an engine has a free seat and less than ``--hold-s`` (0.25 s) of prefill queued, then place it
there; the queue is ``fifo`` (one queue), or DRR across teams charged by ``requests``, by ``prompt_tokens``, or by
``uncached_tokens`` (Cognitora's default); ``uncached_tokens+lane`` adds a rule the queue does not have yet (a
team's long prompts, over 2,000 uncached tokens, may fill all engines' prefill but one: the lane short requests
use instead of waiting behind them), to measure what latency isolation would add. A request that waited
``--max-wait-s`` (30 s) at the gateway leaves with a 429. TTFT = gateway wait + the engine's prefill queue + its
own prefill.

**Reference.** ``B alone`` and ``C alone``: the same team's arrivals on the idle fleet; the issue's bar is B's TTFT
p90 within 1.25x of B alone.

Writes ``<out>/flow_fairness.md`` and ``.json``: per policy and team, TTFT p50/p90/p99 and 429s (median and range
over the seeds), the p90 against the team alone, and the share of each team's uncached tokens that was served.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import platform
import random
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cognitora.flow.bands import Band
from cognitora.flow.fair_queue import FairQueue

ROOT = Path(__file__).resolve().parent.parent
ENGINES, SEATS, PREFILL_TPS = 4, 32, 8000.0
DECODE_TOKENS, ITL_S = 64, 0.025
MIN_PREFILL_S = 0.005


@dataclass(frozen=True)
class Team:
    name: str
    rate: float
    prompt: int
    cached: int


TEAMS = (Team("A", 4.0, 12_000, 0), Team("B", 16.0, 250, 0), Team("C", 5.0, 8000, 7800))
POLICIES = ("none", "fifo", "requests", "prompt_tokens", "uncached_tokens", "uncached_tokens+lane")
LANE_PROMPT = 2000
"""``+lane``: a request of more uncached tokens than this is long."""


@dataclass
class Request:
    team: Team
    arrival: float
    seq: int
    ttft: float | None = None
    rejected: bool = False

    @property
    def uncached(self) -> int:
        return self.team.prompt - self.team.cached


@dataclass
class Engine:
    backlog: float = 0.0
    """Uncached tokens queued or in prefill."""
    prefilling: deque[Request] = field(default_factory=deque)
    free: int = SEATS


def arrivals(teams: Sequence[Team], duration: float, seed: int) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for t in teams:
        now = 0.0
        while True:
            now += rng.expovariate(t.rate)
            if now >= duration:
                break
            out.append(Request(t, now, 0))
    out.sort(key=lambda r: r.arrival)
    for i, r in enumerate(out):
        r.seq = i
    return out


def cost_of(policy: str) -> Callable[[Request], float]:
    if policy == "requests" or policy == "fifo":
        return lambda r: 1.0
    if policy == "prompt_tokens":
        return lambda r: float(r.team.prompt)
    return lambda r: float(max(16, r.uncached))


def over_lane(policy: str, r: Request, prefilling: dict[str, int]) -> bool:
    """``+lane``: a long request may not start while its team's long prefills already fill all engines but one
    (the lane that keeps short requests from waiting behind them)."""
    if not policy.endswith("+lane") or r.uncached <= LANE_PROMPT:
        return False
    return prefilling.get(r.team.name, 0) >= ENGINES - 1


def simulate(requests: list[Request], policy: str, hold_s: float, max_wait_s: float) -> list[Request]:
    """Run ``requests`` (fresh copies) through the fleet under ``policy``; returns them with TTFT or rejected."""
    reqs = [Request(r.team, r.arrival, r.seq) for r in requests]
    engines = [Engine() for _ in range(ENGINES)]
    events: list[tuple[float, int, str, Any]] = []
    tie = itertools.count()
    for r in reqs:
        heapq.heappush(events, (r.arrival, next(tie), "arrive", r))
    queue: FairQueue[Request] = FairQueue([Band("all", max_wait_s, None)])
    cost = cost_of(policy.removesuffix("+lane"))
    queued: dict[int, Any] = {}
    long_prefills: dict[str, int] = {}

    def ttft_on(e: Engine, r: Request) -> float:
        return (e.backlog + r.uncached) / PREFILL_TPS

    def start_prefill(e: Engine, now: float) -> None:
        r = e.prefilling[0]
        heapq.heappush(events, (now + max(MIN_PREFILL_S, r.uncached / PREFILL_TPS), next(tie), "prefilled", (e, r)))

    def send(r: Request, e: Engine, now: float) -> None:
        e.free -= 1
        if r.uncached > LANE_PROMPT:
            long_prefills[r.team.name] = long_prefills.get(r.team.name, 0) + 1
        e.backlog += r.uncached
        e.prefilling.append(r)
        if len(e.prefilling) == 1:
            start_prefill(e, now)

    def dispatch(now: float) -> None:
        while (choice := queue.next(now)) is not None:
            r = choice.entry.payload
            able = [e for e in engines if e.free > 0 and e.backlog / PREFILL_TPS <= hold_s]
            if not able or over_lane(policy, r, long_prefills):
                return
            queue.commit(choice)
            del queued[r.seq]
            send(r, min(able, key=lambda e: ttft_on(e, r)), now)

    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "arrive":
            r = data
            if policy == "none":
                send(r, min(engines, key=lambda e: ttft_on(e, r)), now)
                continue
            flow = "all" if policy == "fifo" else r.team.name
            queued[r.seq] = queue.push(r, 0, flow, cost(r), now)
            heapq.heappush(events, (now + max_wait_s, next(tie), "deadline", r))
        elif kind == "deadline":
            entry = queued.pop(data.seq, None)
            if entry is not None:
                queue.remove(entry)
                data.rejected = True
        elif kind == "prefilled":
            e, r = data
            e.prefilling.popleft()
            e.backlog -= r.uncached
            if r.uncached > LANE_PROMPT:
                long_prefills[r.team.name] -= 1
            r.ttft = now - r.arrival
            heapq.heappush(events, (now + DECODE_TOKENS * ITL_S, next(tie), "finished", e))
            if e.prefilling:
                start_prefill(e, now)
        elif kind == "finished":
            data.free += 1
        if policy != "none":
            dispatch(now)
    return reqs


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def team_figures(reqs: Sequence[Request], team: str, duration: float) -> dict[str, float]:
    mine = [r for r in reqs if r.team.name == team]
    ttfts = [r.ttft for r in mine if r.ttft is not None]
    served = sum(r.uncached for r in mine if r.ttft is not None)
    return {
        "p50": pct(ttfts, 0.5),
        "p90": pct(ttfts, 0.9),
        "p99": pct(ttfts, 0.99),
        "rejected_share": sum(r.rejected for r in mine) / max(1, len(mine)),
        "served_share": served / max(1, sum(r.uncached for r in mine)),
    }


def run(seeds: Sequence[int], duration: float, hold_s: float, max_wait_s: float) -> dict[str, Any]:
    results: dict[str, Any] = {"per_seed": []}
    for seed in seeds:
        reqs = arrivals(TEAMS, duration, seed)
        row: dict[str, Any] = {"seed": seed}
        for t in ("B", "C"):
            alone = simulate([r for r in reqs if r.team.name == t], "none", hold_s, max_wait_s)
            row[f"{t} alone"] = {t: team_figures(alone, t, duration)}
        for policy in POLICIES:
            out = simulate(reqs, policy, hold_s, max_wait_s)
            row[policy] = {t.name: team_figures(out, t.name, duration) for t in TEAMS}
        results["per_seed"].append(row)
    return results


def spread(values: Sequence[float], fmt: str) -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return "-"
    return f"{format(statistics.median(vals), fmt)} ({format(min(vals), fmt)} .. {format(max(vals), fmt)})"


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    seeds = results["per_seed"]
    lines = [
        "# Gateway queue order under a noisy neighbour (simulation)",
        "",
        f"Command: `.venv/bin/python -m bench.flow_fairness --seeds {args.seeds} --duration {args.duration:g}`",
        "",
        f"Machine: {platform.machine()}, CPython {platform.python_version()}; a deterministic discrete-event "
        "simulation (bench/flow_fairness.py says what it models), so figures do not depend on the machine's load. "
        f"{len(seeds)} seeds ({', '.join(str(r['seed']) for r in seeds)}), {args.duration:g} s of arrivals each; "
        "each cell: median over seeds (min .. max). TTFT in seconds, of the requests served.",
        "",
        "Fleet: 4 engines x 8,000 uncached prefill tokens/s, 32 seats each. A: 4 req/s x 12,000 uncached tokens "
        "(1.5x the fleet alone); B: 16 req/s x 250 tokens; C: 5 req/s x 8,000 prompt tokens, 7,800 of them cached.",
        "",
        "| policy | team | TTFT p50 | TTFT p90 | TTFT p99 | p90 / team alone | 429 share | uncached tokens served |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in ("B", "C"):
        f = [r[f"{t} alone"][t] for r in seeds]
        lines.append(
            f"| {t} alone | {t} | {spread([x['p50'] for x in f], '.3f')} | {spread([x['p90'] for x in f], '.3f')} "
            f"| {spread([x['p99'] for x in f], '.3f')} | 1 | - | {spread([x['served_share'] for x in f], '.0%')} |"
        )
    for policy in POLICIES:
        for t in ("A", "B", "C"):
            f = [r[policy][t] for r in seeds]
            ratio = "-"
            if t != "A":
                ratio = spread([x["p90"] / r[f"{t} alone"][t]["p90"] for x, r in zip(f, seeds, strict=True)], ".2f")
            name = f"**{policy}**" if policy == "uncached_tokens" else policy
            rejected = spread([x["rejected_share"] for x in f], ".1%")
            lines.append(
                f"| {name} | {t} | {spread([x['p50'] for x in f], '.3f')} | {spread([x['p90'] for x in f], '.3f')} "
                f"| {spread([x['p99'] for x in f], '.3f')} | {ratio} | {rejected} "
                f"| {spread([x['served_share'] for x in f], '.0%')} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--hold-s", type=float, default=0.25)
    parser.add_argument("--max-wait-s", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    seeds = [20251130 + i for i in range(args.seeds)]
    results = run(seeds, args.duration, args.hold_s, args.max_wait_s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flow_fairness.json").write_text(json.dumps(results, indent=1) + "\n")
    text = report(results, args)
    (args.out / "flow_fairness.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
