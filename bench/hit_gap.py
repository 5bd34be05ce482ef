"""Where a real-engine run's hit rate falls short of the reuse bound: each request's lost tokens, by cause.

    python -m bench.hit_gap                          # the committed bench/results/real_engines_seed*.*
    python -m bench.hit_gap --stages "3 rps" --prefix bench/results/real_engines --partition

The reuse bound (``bench.workloads.annotate_reuse``) counts the content tokens an earlier request sent; the hit rate
counts what the engines served from cache over their prompt tokens. A request's *attainable* hit is the bound in the
engine's own terms: whole blocks only, and never the prompt's last token (vLLM computes it), over prompt tokens that
include the chat template's. Taken as ``min(reusable + template, prompt - 1)`` rounded down to a block (template =
prompt - content tokens: an upper bound, as if every template token sat before the reused part). What the bound
counts beyond it is the bound's definition, not a miss.

Below the attainable, per request (in the target's own run: its arrivals and TTFTs):

- ``in flight``: the request that made this one's prefix reusable had not had its first token when this one
  arrived: its blocks could not have been announced yet (event lag) nor computed.
- ``cold``: nothing cached (its group's system prompt was not on the engine it went to): a load spread, or the
  prompt's engine had evicted it.
- ``question tail``: the group's system prompt was cached there but not this question, sent earlier (the tail
  blocks were evicted, or the earlier copy went to another engine).
- ``system partial``: less than the system prompt (part of it evicted).

``--partition`` also says where Cognitora's placement puts each group's first request on the run's engine URLs
(``cognitora explain``'s decision, on a fresh in-memory store: an idle fleet, every candidate tied), twice: by the
prefix hash alone (``placement.tie_cache_bound: null``, what placement did before the tie rule), and with the tie rule
(bounded loads, ``--tie-cache-bound``, default the shipped ``placement.tie_cache_bound``), replayed on each seed's
arrivals: each engine's snapshot carries the blocks its groups sent it so far, as the scraper writes the store's
count (``EndpointSnapshot.cached_blocks``), and its KV capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import workloads as wl
from bench.capacity_bound import lru_leading_hits, request_blocks
from bench.report import read_requests
from bench.workloads import BenchRequest
from cognitora.config import PlacementConfig

ROOT = Path(__file__).resolve().parent.parent
CAUSES = ("in flight", "cold", "question tail", "system partial")
SHIPPED_TIE_CACHE_BOUND = PlacementConfig().tie_cache_bound


def attainable(prompt_tokens: int, content_tokens: int, reusable: int, block: int) -> int:
    """The most an engine of ``block``-token blocks can serve from cache of what the bound counts reusable."""
    if reusable <= 0:
        return 0
    template = max(0, prompt_tokens - content_tokens)
    return min(reusable + template, prompt_tokens - 1) // block * block


@dataclass
class Gap:
    """One target's requests of one stage: tokens against the bound, and what was lost, by cause."""

    requests: int = 0
    prompt_tokens: int = 0
    content_tokens: int = 0
    reusable_tokens: int = 0
    attainable_tokens: int = 0
    cached_tokens: int = 0
    lost: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    missed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    """Requests per cause."""

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def bound(self) -> float:
        return self.reusable_tokens / self.content_tokens if self.content_tokens else 0.0

    @property
    def ceiling(self) -> float:
        return self.attainable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _system(req: BenchRequest) -> str:
    return req.messages[0].segments[0].name


def _prompt(req: BenchRequest) -> tuple[str, ...]:
    return tuple(s.name for m in req.messages for s in m.segments)


def gap(
    schedule: Sequence[BenchRequest], records: Iterable[Mapping[str, Any]], target: str, stage: str, block: int
) -> Gap:
    """``target``'s requests of ``stage`` (``records``: the run's per-request rows, every target's)."""
    rows = {int(r["index"]): r for r in records if r["target"] == target}
    out = Gap()
    last_prompt: dict[tuple[str, ...], int] = {}
    last_system: dict[str, int] = {}
    for req in sorted(schedule, key=lambda r: (r.arrival_s, r.index)):
        row = rows.get(req.index)
        prompt, system = _prompt(req), _system(req)
        source = last_prompt.get(prompt, last_system.get(system))
        last_prompt[prompt], last_system[system] = req.index, req.index
        if req.stage != stage or row is None or row.get("status") != 200:
            continue
        prompt_tokens, content = int(row["prompt_tokens"]), int(row["content_tokens"])
        reusable, cached = int(row["reusable_tokens"]), int(row["cached_tokens"])
        best = attainable(prompt_tokens, content, reusable, block)
        out.requests += 1
        out.prompt_tokens += prompt_tokens
        out.content_tokens += content
        out.reusable_tokens += reusable
        out.attainable_tokens += best
        out.cached_tokens += cached
        if cached >= best:
            continue
        system_only = attainable(prompt_tokens, content, req.messages[0].segments[0].tokens, block)
        earlier = rows.get(source) if source is not None else None
        if earlier is not None and _first_token_at(earlier) > float(row["arrival_s"]):
            cause = "in flight"
        elif cached == 0:
            cause = "cold"
        elif cached >= system_only:
            cause = "question tail"
        else:
            cause = "system partial"
        out.lost[cause] += best - cached
        out.missed[cause] += 1
    return out


def _first_token_at(row: Mapping[str, Any]) -> float:
    ttft = row.get("ttft_s")
    return float(row["arrival_s"]) + (float(ttft) if ttft is not None else float("inf"))


def hash_partition(
    urls: Sequence[str],
    schedule: Sequence[BenchRequest],
    model: str,
    tokenizer: str,
    block: int,
    *,
    tie_cache_bound: float | None = None,
    kv_blocks: int = 0,
) -> dict[str, str]:
    """Group -> the endpoint (``host:port``) Cognitora picks for its first request when the fleet is idle, every
    candidate tied. The model's name is part of its block keys, so it must be the run's.

    ``tie_cache_bound`` None: the prefix hash alone. Otherwise placement's tie rule with that bound
    (``placement.tie_cache_bound``, ``affinity.within_cache_bound``), each engine holding what its groups sent it
    (groups stay where their first request went; one LRU cache of ``kv_blocks`` per engine), told to placement as
    the scraper tells it: a fresh snapshot with the engine's block count and its KV capacity."""
    from cognitora.config import config_from_dict
    from cognitora.core.router import Router
    from cognitora.request import RouteRequest
    from kvstate.memory_store import MemoryStore
    from kvstate.store import EndpointSnapshot

    config = config_from_dict(
        {
            "models": [
                {
                    "name": model,
                    "block_size": block,
                    "tokenizer": tokenizer,
                    "endpoints": [{"url": u, "engine": "vllm"} for u in urls],
                }
            ],
            "placement": {"tie_cache_bound": tie_cache_bound},
        }
    )
    ids = [u.split("://", 1)[-1].rstrip("/") for u in urls]
    bank = wl.TextBank(20251130)  # bench.loadgen's: the same text for every seed
    now = 1_000_000.0  # a fixed clock: every snapshot is fresh

    async def place_all() -> dict[str, str]:
        home: dict[str, str] = {}
        caches: dict[str, OrderedDict[int, None]] = {e: OrderedDict() for e in ids}
        for req in sorted(schedule, key=lambda r: (r.arrival_s, r.index)):
            system = _system(req)
            if system not in home:
                store = MemoryStore()
                if tie_cache_bound is not None:
                    for e, held in caches.items():
                        snap = EndpointSnapshot(
                            endpoint=e, last_seen=now, kv_capacity_tokens=kv_blocks * block, cached_blocks=len(held)
                        )
                        await store.put_snapshot(snap)
                body = req.body(bank, model)
                routed = RouteRequest(model=model, messages=body["messages"])
                home[system] = str((await Router(config, store, clock=lambda: now).place(routed)).endpoint)
            cache = caches.get(home[system])
            if cache is None or tie_cache_bound is None:
                continue
            for key in reversed(request_blocks(req, block)):
                cache[key] = None
                cache.move_to_end(key)
            while len(cache) > kv_blocks:
                cache.popitem(last=False)
        return home

    return asyncio.run(place_all())


def partition_hit(
    schedule: Sequence[BenchRequest], partition: Mapping[str, str], stage: str, slots: int, block: int
) -> float:
    """The share of ``stage``'s content tokens found cached when every group stays on the engine ``partition`` gives
    it, each engine one LRU cache of ``slots`` blocks that evicts a prompt's tail first (as vLLM frees a request's
    blocks): what the split alone allows, with no load spreads and no running requests' own blocks."""
    per_engine: dict[str, list[BenchRequest]] = {}
    for req in sorted(schedule, key=lambda r: (r.arrival_s, r.index)):
        per_engine.setdefault(partition[_system(req)], []).append(req)
    hit = total = 0
    for reqs in per_engine.values():
        leading = lru_leading_hits([request_blocks(r, block) for r in reqs], slots)
        for req, blocks in zip(reqs, leading, strict=True):
            if req.stage == stage:
                hit += blocks * block
                total += req.prompt_tokens
    return hit / total if total else 0.0


def even_partitions(groups: Sequence[str], engines: int) -> list[dict[str, str]]:
    """Every way to put the same number of groups on each engine (engines unlabelled)."""
    if engines <= 0 or len(groups) % engines:
        return []
    size = len(groups) // engines

    def split(rest: Sequence[str], label: int) -> list[dict[str, str]]:
        if not rest:
            return [{}]
        first, others = rest[0], rest[1:]
        out = []
        for mates in itertools.combinations(others, size - 1):
            left = [g for g in others if g not in mates]
            for tail in split(left, label + 1):
                out.append({first: str(label), **dict.fromkeys(mates, str(label)), **tail})
        return out

    return split(sorted(groups), 0)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _schedule(seed: int, data: Mapping[str, Any]) -> list[BenchRequest]:
    """The run's schedule, rebuilt from its seed and stages as ``bench.real_engines`` built it."""
    from bench.real_engines import schedule_for

    measured = [s for s in data["stages"] if s.get("measured", True)]
    warm = next((s for s in data["stages"] if not s.get("measured", True)), None)
    rates = [s["rate"] for s in measured]
    return schedule_for(
        seed, rates, measured[0]["duration_s"], (warm["rate"], warm["duration_s"]) if warm else (0.0, 0.0)
    ).requests


def render(
    prefix: Path,
    seeds: Sequence[int],
    stages: Sequence[str],
    targets: Sequence[str],
    partition: bool,
    tie_cache_bound: float | None = SHIPPED_TIE_CACHE_BOUND,
) -> str:
    from bench.real_engines import BLOCK_SIZE, MODEL, TOKENIZER

    shown = prefix.relative_to(ROOT) if prefix.is_absolute() and prefix.is_relative_to(ROOT) else prefix
    lines = [
        "# Hit rate against the reuse bound, request by request",
        "",
        "```bash",
        f'python -m bench.hit_gap --prefix {shown} --stages "{",".join(stages)}"'
        + (" --partition" if partition else "")
        + (
            ""
            if not partition or tie_cache_bound == SHIPPED_TIE_CACHE_BOUND
            else f" --tie-cache-bound {'none' if tie_cache_bound is None else tie_cache_bound}"
        ),
        "```",
        "",
        "Per seed and target: the hit rate over the bound ('of bound', as bench/results/real_engines.md), the "
        "attainable ceiling (whole blocks of the bound in engine tokens) over the bound, the hit rate over that "
        "ceiling, then the tokens lost below the ceiling, in % of the stage's prompt tokens (requests in brackets), "
        "by cause (bench/hit_gap.py); last, each engine's requests over the whole run and its highest KV use.",
    ]
    runs_by_seed = {seed: json.loads(prefix.with_name(f"{prefix.name}_seed{seed}.json").read_text()) for seed in seeds}
    records_by_seed = {seed: read_requests(prefix.with_name(f"{prefix.name}_seed{seed}")) for seed in seeds}
    schedules = {seed: _schedule(seed, data) for seed, data in runs_by_seed.items()}
    for stage in stages:
        lines += [
            "",
            f"## {stage}",
            "",
            "| seed | target | hit rate | bound | of bound | ceiling / bound | of ceiling | "
            + " | ".join(CAUSES)
            + " | engines: requests (max KV use) |",
            "|" + "---|" * (8 + len(CAUSES)),
        ]
        for seed in seeds:
            runs = {r["target"]: r for r in runs_by_seed[seed]["runs"]}
            for target in (t for t in targets if t in runs):
                g = gap(schedules[seed], records_by_seed[seed], target, stage, BLOCK_SIZE)
                engines = ", ".join(
                    f"{e['url'].rsplit(':', 1)[-1]}: {e['requests']} ({e['max_kv_usage']:.2f})"
                    for e in runs[target]["engines"]
                )
                causes = " | ".join(
                    f"{_pct(g.lost[c] / g.prompt_tokens)} ({g.missed[c]})" if g.missed[c] else "-" for c in CAUSES
                )
                lines.append(
                    f"| {seed} | {target} | {g.hit_rate:.3f} | {g.bound:.3f} | {g.hit_rate / g.bound:.3f} | "
                    f"{g.ceiling / g.bound:.3f} | {g.hit_rate / g.ceiling:.3f} | {causes} | {engines} |"
                )
    notes: list[str] = []
    if partition:
        first = seeds[0]
        urls = [e["url"] for e in runs_by_seed[first]["runs"][0]["engines"]]
        hashed = hash_partition(urls, schedules[first], MODEL, TOKENIZER, BLOCK_SIZE)
        groups: dict[str, list[str]] = {}
        for system, endpoint in hashed.items():
            groups.setdefault(endpoint.rsplit(":", 1)[-1], []).append(system)
        notes.append(
            "Cognitora's prefix hash alone (`placement.tie_cache_bound: null`, placement before the tie rule) on an "
            "idle, empty fleet (every candidate tied), by engine port: "
            + "; ".join(f"{port}: {', '.join(sorted(g))}" for port, g in sorted(groups.items()))
            + ". A group's text is the same in every seed, and so are the engines' URLs (one fleet served every "
            "target), so this is where a group goes whenever its first request finds the fleet idle."
        )
        notes.append(_split_costs(schedules, stages[-1], hashed, len(urls), BLOCK_SIZE))
        if tie_cache_bound is not None:
            notes.append(_tie_rule(schedules, stages[-1], urls, tie_cache_bound))
    for seed in seeds:
        per_group: dict[str, int] = {}
        for req in schedules[seed]:
            per_group[_system(req)] = per_group.get(_system(req), 0) + 1
        notes.append(f"seed {seed}: requests per group over the run: {dict(sorted(per_group.items()))}")
    return "\n".join([*lines, "", *(f"- {n}" for n in notes)]) + "\n"


def _split_costs(
    schedules: Mapping[int, Sequence[BenchRequest]], stage: str, hashed: Mapping[str, str], engines: int, block: int
) -> str:
    """What the hash's split and the even splits allow at ``stage`` (``partition_hit`` over the bound), per seed."""
    from bench.real_engines import KV_BLOCKS

    slots = (KV_BLOCKS, KV_BLOCKS - KV_BLOCKS // 8)
    parts = []
    for seed, schedule in schedules.items():
        reqs = [r for r in schedule if r.stage == stage]
        bound = sum(r.reusable_tokens for r in reqs) / sum(r.prompt_tokens for r in reqs)
        even = even_partitions(sorted({_system(r) for r in schedule}), engines)
        cells = []
        for n in slots:
            mine = partition_hit(schedule, hashed, stage, n, block) / bound
            spread = [partition_hit(schedule, p, stage, n, block) / bound for p in even]
            cells.append(f"{n} blocks: {mine:.3f} vs {min(spread):.3f}-{max(spread):.3f}" if spread else f"{mine:.3f}")
        parts.append(f"seed {seed}: " + "; ".join(cells))
    return (
        f"What the split alone allows at {stage}, of the bound (content tokens; every group kept on its engine, one "
        f"LRU cache per engine, `partition_hit`), the hash's split vs every even split, with each engine's "
        f"{slots[0]} blocks and with {slots[1]} (an eighth left to running requests): " + "; ".join(parts)
    )


def _tie_rule(
    schedules: Mapping[int, Sequence[BenchRequest]], stage: str, urls: Sequence[str], tie_cache_bound: float
) -> str:
    """Where each seed's groups go with placement's tie rule at ``tie_cache_bound`` (``hash_partition``), and what
    that split allows."""
    from bench.real_engines import BLOCK_SIZE, KV_BLOCKS, MODEL, TOKENIZER

    slots = KV_BLOCKS - KV_BLOCKS // 8
    parts = []
    for seed, schedule in schedules.items():
        home = hash_partition(
            urls, schedule, MODEL, TOKENIZER, BLOCK_SIZE, tie_cache_bound=tie_cache_bound, kv_blocks=KV_BLOCKS
        )
        reqs = [r for r in schedule if r.stage == stage]
        bound = sum(r.reusable_tokens for r in reqs) / sum(r.prompt_tokens for r in reqs)
        by_engine: dict[str, list[str]] = {}
        for system, endpoint in sorted(home.items()):
            by_engine.setdefault(endpoint.rsplit(":", 1)[-1], []).append(system)
        split = "; ".join(f"{port}: {', '.join(g)}" for port, g in sorted(by_engine.items()))
        parts.append(
            f"seed {seed}: {split} ({partition_hit(schedule, home, stage, KV_BLOCKS, BLOCK_SIZE) / bound:.3f}, "
            f"{partition_hit(schedule, home, stage, slots, BLOCK_SIZE) / bound:.3f})"
        )
    shipped = ", the shipped default" if tie_cache_bound == SHIPPED_TIE_CACHE_BOUND else ""
    return (
        f"With the tie rule (`placement.tie_cache_bound: {tie_cache_bound:g}`{shipped}; among tied engines the hash "
        f"leaves out any whose prefix cache holds more than {tie_cache_bound:g} x its {KV_BLOCKS} blocks beyond the "
        "emptiest's), placement's own code replayed on each seed's arrivals (the fleet idle at each group's first "
        "request; groups stay where their first request went; each engine's snapshot carries the blocks its groups "
        f"sent it, one LRU cache of {KV_BLOCKS} blocks per engine). Its split, and what it allows at {stage} with "
        f"{KV_BLOCKS} and {slots} blocks: " + "; ".join(parts)
    )


def _bound(text: str) -> float | None:
    return None if text.strip().lower() in ("none", "null") else float(text)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hit_gap", description=__doc__.splitlines()[0])
    p.add_argument("--prefix", type=Path, default=ROOT / "bench" / "results" / "real_engines")
    p.add_argument("--seeds", default="20251130,20251201,20251202")
    p.add_argument("--stages", default="1 rps,2 rps,3 rps", help="comma-separated stage labels")
    p.add_argument("--targets", default="cognitora-envoy,cognitora-litellm,cognitora-litellm-redis-1w")
    p.add_argument(
        "--partition", action="store_true", help="also where placement puts each group: the hash alone, the tie rule"
    )
    p.add_argument(
        "--tie-cache-bound",
        type=_bound,
        default=SHIPPED_TIE_CACHE_BOUND,
        help="the tie rule's placement.tie_cache_bound for --partition ('none': the hash alone only; default: the "
        f"shipped {SHIPPED_TIE_CACHE_BOUND})",
    )
    p.add_argument("--out", type=Path, help="write the markdown here (default: stdout)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    targets = [t for t in args.targets.split(",") if t.strip()]
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    text = render(args.prefix, seeds, stages, targets, args.partition, args.tie_cache_bound)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
