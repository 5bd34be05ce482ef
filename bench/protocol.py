"""The benchmark protocol: one side-by-side comparison run with several seeds, reported as median and range.

    python -m bench.protocol --seeds 3 -- --workload long-context --engines 8 --targets envoy-rr,...

Everything after ``--`` goes to ``bench.run_all`` unchanged, once per seed (``--seed`` and ``--out`` are set here:
``PREFIX_seedN``). Then, per stage and target, the median and the range (min-max) over the seeds of TTFT p90,
goodput and hit rate, and for each Cognitora target against the best peer at each stage (the peer with the highest
median goodput, ties by the lower median TTFT p90):

- **better** / **worse** when the medians differ and the two ranges do not overlap;
- **within range** when they overlap: the difference is not more than the run-to-run spread shows.

It also names the first stage where the best peer misses the TTFT SLO (its median TTFT p90 over ``--slo-ttft``)
and the goodput ratio there, the issue's overload bar. ``--aggregate PREFIX`` re-reads seeds already run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import run_all
from bench.capacity_bound import fleet_capacity_bounds
from bench.report import Report, StageSummary, load_report
from bench.run_args import build_schedule, parse_args

DEFAULT_SEEDS = (20251130, 20251201, 20251202, 20251203, 20251204)


@dataclass(frozen=True)
class Spread:
    """Median and range of one figure over the seeds."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def overlaps(self, other: Spread) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi

    def show(self, digits: int = 2) -> str:
        if len(self.values) == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} [{self.lo:.{digits}f}-{self.hi:.{digits}f}]"


def spread(stages: Sequence[StageSummary], field: str) -> Spread | None:
    return spread_of([getattr(s, field) for s in stages])


def spread_of(values: Sequence[float | None]) -> Spread | None:
    """The spread of the values that are known (None when none is)."""
    kept = tuple(v for v in values if v is not None)
    return Spread(kept) if kept else None


def show(s: Spread | None, digits: int = 2) -> str:
    return "-" if s is None else s.show(digits)


def verdict(mine: Spread | None, theirs: Spread | None, higher_is_better: bool) -> str:
    if mine is None or theirs is None:
        return "n/a"
    if mine.overlaps(theirs) or mine.median == theirs.median:
        return "within range"
    better = mine.median > theirs.median if higher_is_better else mine.median < theirs.median
    return "better" if better else "worse"


def aggregate(reports: Sequence[Report], command: str) -> str:
    """The protocol's Markdown report over ``reports`` (one per seed, same workload and targets)."""
    first = reports[0]
    measured = measured_stages(first)
    targets = [r.target for r in first.runs if not r.skipped]
    slo = first.slo
    stages_of = stages_lookup(reports)

    lines = [
        f"# Benchmark protocol: {first.workload}, {len(reports)} seeds",
        "",
        "Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{first.description}. Fleet: {json.dumps(first.fleet)}. SLO for goodput: TTFT <= {slo.ttft_s:g} s and "
        f"ITL <= {slo.itl_s * 1000:g} ms. Each cell: median [min-max] over the seeds (engine seconds). A verdict is "
        "'within range' when the ranges overlap: the difference is not larger than the run-to-run spread.",
        "",
        "Hit rate: the engines' cached prompt tokens over prompt tokens. Reuse bound: the prefix tokens an earlier "
        "request sent (an unlimited cache); 'of bound' is each seed's hit rate over its own bound.",
        "",
        "Router CPU: the cores the router's processes used during the stage (the LiteLLM proxy is one process: near "
        "1.0 it, not placement, is what the stage measures).",
        "",
        "| stage | target | TTFT p50 | TTFT p90 | TTFT p99 | goodput rps | hit rate | reuse bound | of bound "
        "| router CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label in measured:
        for t in targets:
            st = stages_of(t, label)
            if not st:
                continue
            lines.append(
                f"| {label} | {t} | {show(spread(st, 'ttft_p50'))} | {show(spread(st, 'ttft_p90'))} | "
                f"{show(spread(st, 'ttft_p99'))} | {show(spread(st, 'goodput_rps'))} | "
                f"{show(spread(st, 'hit_rate'), 3)} | {show(spread(st, 'reuse_bound'), 3)} | "
                f"{show(_ratios(reports, t, label, lambda rep, st: st.reuse_bound))} | "
                f"{show(spread(st, 'router_cpu_share'))} |"
            )
    peers = [t for t in targets if not t.startswith("cognitora")]
    mine = [t for t in targets if t.startswith("cognitora")]
    lines += ["", "## Cognitora against the best peer per stage", ""]
    lines += ["| stage | Cognitora target | best peer | TTFT p90 | goodput | vs round-robin (TTFT p90, goodput) |"]
    lines += ["|---|---|---|---|---|---|"]
    missed = first_missed_stage(reports)
    for label in measured:
        best = best_peer(peers, label, stages_of)
        if best is None:
            continue
        bp90 = spread(stages_of(best, label), "ttft_p90")
        for t in mine:
            st = stages_of(t, label)
            p90, good = spread(st, "ttft_p90"), spread(st, "goodput_rps")
            rr = "-"
            if "envoy-rr" in peers:
                rst = stages_of("envoy-rr", label)
                rr = (
                    f"{verdict(p90, spread(rst, 'ttft_p90'), False)}, {verdict(good, spread(rst, 'goodput_rps'), True)}"
                )
            lines.append(
                f"| {label} | {t} | {best} | {verdict(p90, bp90, False)} ({show(p90)} vs {show(bp90)}) | "
                f"{verdict(good, spread(stages_of(best, label), 'goodput_rps'), True)} "
                f"({show(good)} vs {show(spread(stages_of(best, label), 'goodput_rps'))}) | {rr} |"
            )
    lines.append("")
    if missed is None:
        lines.append(
            f"The best peer meets the TTFT SLO (median TTFT p90 <= {slo.ttft_s:g} s) at every stage: the ladder "
            "does not reach overload for it."
        )
    else:
        first_miss, best = missed
        lines.append(f"First stage where the best peer misses the TTFT SLO: **{first_miss}**. Goodput there:")
        lines.append("")
        theirs = spread(stages_of(best, first_miss), "goodput_rps")
        for t in mine:
            ours = spread(stages_of(t, first_miss), "goodput_rps")
            if ours and theirs and theirs.median > 0:
                lines.append(f"- {t}: {ours.median / theirs.median:.2f}x {best}'s (bar: 1.3x)")
            elif ours and theirs:
                # No ratio to a zero: say what each served, so the line is not silently missing.
                lines.append(
                    f"- {t}: {ours.median:.2f} req/s against {best}'s {theirs.median:.2f}: no ratio (the peer's "
                    "median goodput is 0)"
                )
        lines += _carried_over_section(reports, measured, targets, first_miss)
    lines += _capacity_section(reports, measured, mine)
    lines.append("")
    lines.append(
        "The machine has 2 cores, shared with whatever else ran: the range is the spread between seeds on it; "
        "each seed is also a different workload instance (arrivals, lengths)."
    )
    return "\n".join(lines) + "\n"


def _ratios(
    reports: Sequence[Report], target: str, label: str, bound_of: Callable[[Report, StageSummary], float | None]
) -> Spread | None:
    """Per seed, ``target``'s hit rate at ``label`` over that seed's own bound (None where either is missing)."""
    values = []
    for rep in reports:
        for run in rep.runs:
            if run.target != target:
                continue
            for st in run.stages:
                bound = bound_of(rep, st) if st.stage == label else None
                if bound and st.hit_rate is not None:
                    values.append(st.hit_rate / bound)
    return Spread(tuple(values)) if values else None


def _met_slo(reports: Sequence[Report], target: str, labels: Sequence[str]) -> Spread | None:
    """Per seed, the requests of ``target`` that met the SLO over the stages ``labels`` (goodput x duration)."""
    values = []
    for rep in reports:
        for run in rep.runs:
            if run.target == target:
                met = [st.goodput_rps * st.duration_s for st in run.stages if st.stage in labels]
                if len(met) == len(labels):
                    values.append(sum(met))
    return Spread(tuple(values)) if values else None


def _carried_over_section(
    reports: Sequence[Report], measured: Sequence[str], targets: Sequence[str], first_miss: str
) -> list[str]:
    """The requests that met the SLO in the first missed stage and the stage before it, together.

    When a stage is shorter than the time a request holds an engine's seat, the stages are not independent: the
    seats a router leaves free at the end of one stage are the goodput of the next, so a router can buy goodput
    in the overload stage with misses in the stage before. The sum says whether it did."""
    at = measured.index(first_miss)
    if at == 0:
        return []
    labels = list(measured[at - 1 : at + 1])
    lines = [
        "",
        f"Requests that met the SLO in {labels[0]} and {labels[1]} together, per seed, median [range] (a router "
        "can move goodput from one stage to the next when a request holds its seat longer than a stage lasts):",
        "",
    ]
    for t in targets:
        met = _met_slo(reports, t, labels)
        if met is not None:
            per_seed = ", ".join(f"{v:g}" for v in met.values)
            lines.append(f"- {t}: {show(met, 0)} (seeds: {per_seed})")
    return lines


def _capacity_section(reports: Sequence[Report], measured: Sequence[str], mine: Sequence[str]) -> list[str]:
    """The hit rates against what the fleet's finite KV allows (``bench.capacity_bound``), when every seed has it."""
    if not mine or not all(rep.capacity_bound for rep in reports):
        return []
    lines = [
        "",
        "## Cache hits against the fleet's KV capacity",
        "",
        "Capacity bound: Belady's MIN over one cache of the fleet's KV tokens, the most any router could serve "
        "from cache (it knows the future). Pooled LRU: one least-recently-used cache of that size, as if the "
        "engines were one (`bench/capacity_bound.py`). Median [range] over the seeds; each ratio is per seed.",
        "",
        "| stage | reuse bound | capacity bound | pooled LRU | Cognitora target | of capacity bound | of pooled LRU |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in measured:
        cap = spread_of([rep.capacity_bound.get(label) for rep in reports])
        lru = spread_of([rep.pooled_lru_bound.get(label) for rep in reports])
        reuse = spread_of([rep.reuse_bound.get(label) for rep in reports])  # (= each stage summary's)
        for t in mine:
            of_cap = _ratios(reports, t, label, lambda rep, st: rep.capacity_bound.get(st.stage))
            of_lru = _ratios(reports, t, label, lambda rep, st: rep.pooled_lru_bound.get(st.stage))
            lines.append(
                f"| {label} | {show(reuse, 3)} | {show(cap, 3)} | {show(lru, 3)} | {t} | {show(of_cap)} | "
                f"{show(of_lru)} |"
            )
    return lines


def fill_capacity_bound(report: Report) -> bool:
    """Compute ``report.capacity_bound`` from its own ``bench.run_all`` command, for a report made before the
    harness recorded it. False when the command cannot be rebuilt here (another harness, a trace not here)."""
    argv = shlex.split(report.command)
    if argv[:3] != ["python", "-m", "bench.run_all"]:
        return False
    args = parse_args(argv[3:])
    if args.trace is not None and not Path(args.trace).exists():
        return False
    schedule = build_schedule(args)
    bound = fleet_capacity_bounds(schedule, args)
    report.capacity_bound, report.pooled_lru_bound = bound.capacity, bound.pooled_lru
    return True


def measured_stages(report: Report) -> list[str]:
    """The labels of the stages ``report`` measured (a warm-up is not one), in order."""
    return [s["label"] for s in report.stages if s.get("measured", True)]


StagesOf = Callable[[str, str], list[StageSummary]]
"""(target, stage label) -> that target's summaries of the stage, one per seed that has it."""


def stages_lookup(reports: Sequence[Report]) -> StagesOf:
    """Each target's stage summaries over ``reports`` (one report per seed)."""

    def stages_of(target: str, label: str) -> list[StageSummary]:
        out = []
        for rep in reports:
            for run in rep.runs:
                if run.target == target:
                    out += [s for s in run.stages if s.stage == label]
        return out

    return stages_of


def first_missed_stage(reports: Sequence[Report]) -> tuple[str, str] | None:
    """(the first measured stage where the best peer's median TTFT p90 is over the TTFT SLO, that peer), the
    issue's overload bar's stage; None when the best peer meets the SLO at every stage. Peers: the targets of the
    first report that ran and are not Cognitora's."""
    first = reports[0]
    peers = [r.target for r in first.runs if not r.skipped and not r.target.startswith("cognitora")]
    stages_of = stages_lookup(reports)
    for label in measured_stages(first):
        best = best_peer(peers, label, stages_of)
        if best is None:
            continue
        p90 = spread(stages_of(best, label), "ttft_p90")
        if p90 is not None and p90.median > first.slo.ttft_s:
            return label, best
    return None


def best_peer(peers: Sequence[str], label: str, stages_of: StagesOf) -> str | None:
    """The peer with the highest median goodput at ``label``, ties by the lower median TTFT p90."""
    scored = []
    for p in peers:
        st = stages_of(p, label)
        good, p90 = spread(st, "goodput_rps"), spread(st, "ttft_p90")
        if good is None:
            continue
        scored.append((-good.median, p90.median if p90 else float("inf"), p))
    return min(scored)[2] if scored else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    ours, theirs = argv[:split], argv[split + 1 :]
    p = argparse.ArgumentParser(prog="python -m bench.protocol", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="runs, each with its own seed (at least 3 for a verdict)")
    p.add_argument("--out", required=True, help="output prefix: PREFIX_seedN.{md,json,png} and PREFIX.md")
    p.add_argument("--aggregate", action="store_true", help="only re-read PREFIX_seedN.json already run")
    p.add_argument(
        "--merge",
        action="append",
        default=[],
        help="also read OTHER_seedN.json and add its targets to each seed (a variant run later on the same seeds); "
        "a target this run has keeps this run's rows",
    )
    args = p.parse_args(ours)
    if any(a in ("--seed", "--out") for a in theirs):
        raise SystemExit("--seed and --out are set by the protocol: give --seeds and --out before '--'")
    prefix = Path(args.out)
    seeds = DEFAULT_SEEDS[: args.seeds] if args.seeds <= len(DEFAULT_SEEDS) else range(1, args.seeds + 1)
    reports = []
    for seed in seeds:
        out = Path(f"{prefix}_seed{seed}")
        if not args.aggregate:
            code = run_all.main([*theirs, "--seed", str(seed), "--out", str(out)])
            if code != 0:
                print(f"seed {seed}: bench.run_all exited {code}; aggregating the seeds that ran", file=sys.stderr)
        path = out.with_suffix(".json")
        if path.exists():
            rep = load_report(json.loads(path.read_text()))
            if not rep.capacity_bound:
                fill_capacity_bound(rep)
            for other in args.merge:
                extra = Path(f"{other}_seed{seed}.json")
                if extra.exists():
                    # A target this run has is this run's: a rerun of it supersedes the merged file's rows.
                    have = {run.target for run in rep.runs}
                    rep.runs += [r for r in load_report(json.loads(extra.read_text())).runs if r.target not in have]
            reports.append(rep)
    if not reports:
        raise SystemExit("no seed produced a report")
    command = shlex.join(["python", "-m", "bench.protocol", *ours, "--", *theirs])
    if args.aggregate:
        command += "\n# seeds run by:\n" + "\n".join(
            sorted({r.command for r in reports} | {f"# + variants from {m}_seedN" for m in args.merge})
        )
    text = aggregate(reports, command)
    prefix.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
