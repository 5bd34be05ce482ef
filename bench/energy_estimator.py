"""How far apart identical engines' learned J/token are: the old estimator against ``kvstate.energy``'s.

    python -m bench.energy_estimator --out bench/results/energy_estimator

Starts a simulated fleet of identical engines, sends it shared-prefix traffic (groups of requests that share a
long system prompt, each group sticking to one engine, as a cache-aware router places them; a share of the
requests goes to a random engine, as a router's spills do), scrapes every engine's ``/metrics`` at the gateways'
interval, and feeds the very same snapshots to two estimators:

- **old**: the estimator before 2026-12-05: energy over prompt + generated tokens *served* (cache hits included),
  per window of at least 256 tokens, smoothed exponentially (0.3);
- **new**: ``kvstate.energy.EnergyEstimator``: energy over tokens *computed* (cache hits off), a ratio of sums.

Identical engines under the same traffic should read alike. The report gives, over the scrapes after the warm-up,
the spread across engines (max / min of what they read at one scrape) and how much each engine's reading moves from
one scrape to the next. The power rule compares these figures, so a spread is requests moved for noise.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cognitora_sim.launch import start_fleet
from kvstate.energy import EnergyEstimator
from kvstate.memory_store import MemoryStore
from kvstate.scrape import Scraper, ScrapeTarget
from kvstate.store import EndpointSnapshot


@dataclass
class _OldAnchor:
    t: float
    joules: float
    tokens: float


class OldEnergyEstimator:
    """The estimator as it was before 2026-12-05 (kept here only to compare): served tokens, smoothed ratios."""

    def __init__(self, min_tokens: float = 256.0, smoothing: float = 0.3) -> None:
        self.min_tokens, self.smoothing = min_tokens, smoothing
        self._anchor: _OldAnchor | None = None
        self._idle: float | None = None
        self.joules_per_token: float | None = None

    def observe(self, snap: EndpointSnapshot) -> None:
        if snap.running == 0 and snap.waiting == 0 and snap.power_watts > 0:
            self._idle = min(snap.power_watts, self._idle if self._idle is not None else snap.power_watts)
        tokens = (snap.prompt_tokens_total or 0.0) + (snap.generation_tokens_total or 0.0)
        if snap.energy_joules <= 0 or tokens <= 0:
            return
        here, anchor = _OldAnchor(snap.last_seen, snap.energy_joules, tokens), self._anchor
        if anchor is None or here.joules < anchor.joules or tokens < anchor.tokens:
            self._anchor = here
            return
        if here.t <= anchor.t or tokens - anchor.tokens < self.min_tokens:
            return
        marginal = max(0.0, here.joules - anchor.joules - (self._idle or 0.0) * (here.t - anchor.t))
        marginal /= tokens - anchor.tokens
        before = self.joules_per_token
        self.joules_per_token = marginal if before is None else before + self.smoothing * (marginal - before)
        self._anchor = here


@dataclass
class Readings:
    """Per estimator, per scrape: what each engine read (None before its first window)."""

    old: list[list[float | None]] = field(default_factory=list)
    new: list[list[float | None]] = field(default_factory=list)


async def _drive(urls: list[str], args: argparse.Namespace, rng: random.Random, stop_at: float) -> int:
    """Poisson arrivals of shared-prefix requests (token ids, so the engine counts exactly these tokens)."""
    sent = 0
    tasks: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(url: str, ids: list[int]) -> None:
            body = {"model": "smollm2", "prompt": ids, "max_tokens": args.output_tokens, "stream": True}
            async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                async for _ in response.aiter_lines():
                    pass

        while time.monotonic() < stop_at:
            await asyncio.sleep(rng.expovariate(args.rate * args.time_scale))
            group = rng.randrange(args.groups)
            engine = group % len(urls) if rng.random() >= args.spill_share else rng.randrange(len(urls))
            # ids inside a small model's vocabulary; the first one names the group (block keys chain from it)
            prefix = [1000 + group] + [2000 + (group * 13 + j * 97) % 40_000 for j in range(1, args.prefix_tokens)]
            own = [rng.randrange(2000, 42_000) for _ in range(args.user_tokens)]
            task = asyncio.create_task(one(urls[engine], prefix + own))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return sent


async def measure(args: argparse.Namespace) -> tuple[Readings, int]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as logs:
        fleet = start_fleet(args.engines, profile=args.profile, time_scale=args.time_scale, log_dir=Path(logs))
        with fleet:
            store = MemoryStore()
            ids = fleet.endpoint_ids
            targets = [ScrapeTarget(e, u, "vllm") for e, u in zip(ids, fleet.urls, strict=True)]
            scraper = Scraper(store, targets, interval_s=args.scrape_interval)
            old = {e: OldEnergyEstimator() for e in ids}
            new = {e: EnergyEstimator() for e in ids}
            readings = Readings()
            start = time.monotonic()
            stop_at = start + args.duration / args.time_scale
            load = asyncio.create_task(_drive(fleet.urls, args, rng, stop_at))
            while time.monotonic() < stop_at:
                await scraper.scrape_all()
                snaps = await store.snapshots(ids)
                for e in ids:
                    old[e].observe(snaps[e])
                    new[e].observe(snaps[e])
                if time.monotonic() - start >= args.warmup / args.time_scale:
                    readings.old.append([old[e].joules_per_token for e in ids])
                    readings.new.append([new[e].joules_per_token for e in ids])
                await asyncio.sleep(args.scrape_interval)
            sent = await load
            await scraper.stop()
    return readings, sent


def _summary(rows: list[list[float | None]]) -> dict[str, Any]:
    full = [[v for v in row if v is not None] for row in rows]
    spreads = [max(r) / min(r) for r in full if len(r) == len(rows[0]) and min(r) > 0]
    steps: list[float] = []
    for before, after in itertools.pairwise(rows):
        steps += [abs(b / a - 1.0) for a, b in zip(before, after, strict=True) if a and b and a != b]

    def q(values: list[float], p: int) -> float | None:
        return statistics.quantiles(values, n=100)[p - 1] if len(values) >= 2 else None

    return {
        "scrapes": len(rows),
        "spread_p50": q(spreads, 50),
        "spread_p90": q(spreads, 90),
        "spread_max": max(spreads, default=None),
        "step_p50": q(steps, 50),
        "step_p90": q(steps, 90),
        "last": rows[-1] if rows else [],
    }


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def render(args: argparse.Namespace, runs: list[dict[str, Any]]) -> str:
    lines = [
        "# Learned J/token on identical engines: the old estimator against the new",
        "",
        "```bash",
        "python -m bench.energy_estimator " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "```",
        "",
        f"{args.engines} identical `{args.profile}` engines, {args.groups} groups of {args.prefix_tokens}-token shared"
        f" prompts + {args.user_tokens} tokens of their own, {args.output_tokens} output tokens, {args.rate:g} req/s"
        f" (engine time, time scale {args.time_scale:g}), {args.spill_share:.0%} of requests to a random engine;"
        f" scraped every {args.scrape_interval:g} s (wall), readings after {args.warmup:g} engine s.",
        "",
        "Spread: max / min of the engines' readings at one scrape (1.00 = identical engines read alike). Step: how"
        " much one engine's reading moves from one scrape to the next, when it moves.",
        "",
        "| seed | requests | estimator | spread p50 | spread p90 | spread max | step p50 | step p90 | last readings |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for name in ("old", "new"):
            s = run[name]
            last = ", ".join(_fmt(v) for v in s["last"])
            lines.append(
                f"| {run['seed']} | {run['sent']} | {name} | {_fmt(s['spread_p50'], '.2f')} |"
                f" {_fmt(s['spread_p90'], '.2f')} | {_fmt(s['spread_max'], '.2f')} | {_fmt(s['step_p50'], '.1%')} |"
                f" {_fmt(s['step_p90'], '.1%')} | {last} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--profile", default="h100")
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--prefix-tokens", type=int, default=2048)
    p.add_argument("--user-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--rate", type=float, default=60.0, help="requests per engine second")
    p.add_argument("--spill-share", type=float, default=0.1)
    p.add_argument("--duration", type=float, default=12.0, help="engine seconds")
    p.add_argument("--warmup", type=float, default=3.0, help="engine seconds before readings count")
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument("--scrape-interval", type=float, default=1.0, help="wall seconds (the gateways' default)")
    p.add_argument("--seeds", type=int, nargs="+", default=[20251130, 20251201, 20251202])
    p.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    args = p.parse_args(argv)
    runs = []
    for seed in args.seeds:
        args.seed = seed
        readings, sent = asyncio.run(measure(args))
        runs.append({"seed": seed, "sent": sent, "old": _summary(readings.old), "new": _summary(readings.new)})
        print(json.dumps(runs[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = render(args, runs)
    args.out.with_suffix(".md").write_text(report)
    args.out.with_suffix(".json").write_text(json.dumps({"command": sys.argv, "runs": runs}, indent=2) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
