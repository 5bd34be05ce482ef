"""Issue 42's overload bar, read from protocol runs: the ratio at the overload stage, "never worse" below it, the
same bar on reachable requests, and the 429s.

    python -m bench.overload_bar [PREFIX[,OTHER...] ...] [--out FILE]

Each argument is one workload: a ``bench.protocol --out`` prefix (``PREFIX_seedN.json`` for every seed found, and
``PREFIX_seedN.requests.jsonl.gz`` where the run kept its requests); ``,OTHER`` adds another prefix's targets to
each seed, the first prefix that has a target wins (``bench.protocol --merge``). Without arguments it reads the
flow-control reruns docs/flow_control.md ("Overload ladders") lists, those that exist. Offline: starts nothing.
Per workload, per seed and as median [range] over the seeds (engine seconds, as the results):

1. **The bar**: at the first stage where the best peer misses the TTFT SLO (``bench.protocol``'s rule: the peer
   with the highest median goodput, ties by the lower median TTFT p90, its median TTFT p90 over the SLO), each
   Cognitora target's goodput over the peer's: the ratio of the medians (what ``bench.protocol`` prints) and the
   per-seed ratios; the bar is 1.3x.
2. **Never worse below saturation**: at every stage before that one, each flow-control target (``flow_control``
   in its name) against plain Cognitora (the first ``cognitora-envoy`` target without it, or ``--plain``):
   goodput and TTFT p90 with ``bench.protocol``'s verdict (worse only when the ranges do not overlap).
3. **The bar on reachable requests** (the issue's proposal): the same reading with every target's stages
   recomputed (``bench.report.summarize_stage``) over the requests some router could serve in time: a request is
   *unreachable* when its prefill alone, on an idle engine of the fleet's profile with everything an unlimited
   cache would hold (``reusable_tokens``), is over the TTFT objective (``bench.overload_why.idle_ttft_s``, the
   simulator's step model), or when every target's engines refused it (400: over the model's context). A
   request's prompt tokens are the engines' count from any target's record of it (one answered with a 429 or cut
   before its first token has none), else its content tokens. Needs every peer's and the Cognitora target's
   records; it says which it lacks instead of guessing.
4. **429s** per Cognitora target and stage, from the records (the whole message) or else the stage's error
   counts in the JSON (the first 80 characters): *queue timeout* (waited its bound, flow control), *queue full*
   (``max_queued`` / ``max_queued_per_flow``), *shed at admission* (``fleet saturated``: the class's objective,
   no queue), other.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from bench.loadgen import RequestResult
from bench.overload_why import idle_ttft_s
from bench.protocol import (
    Spread,
    best_peer,
    first_missed_stage,
    measured_stages,
    show,
    spread,
    spread_of,
    stages_lookup,
    verdict,
)
from bench.report import Report, StageSummary, TargetRun, load_report, summarize_stage

BAR = 1.3
RESULTS = Path("bench/results")
RERUNS = (
    "protocol_shared-prefix-32x32_flow",
    "protocol_mooncake1000_speed2_flow",
    "protocol_long-context_flow",
    "protocol_b2b-saas_flow",
)
"""The flow-control reruns (docs/flow_control.md, "Overload ladders"), read when no prefix is given."""

_FIELDS = {f.name for f in dataclasses.fields(RequestResult)}


@dataclass(frozen=True)
class SeedRun:
    """One seed of a workload: its report (the targets of every prefix merged) and the records it kept."""

    seed: int
    report: Report
    records: dict[str, list[RequestResult]]
    """target -> its requests, every stage; a target absent here kept none."""


def seeds_of(prefix: str) -> list[int]:
    """The seeds ``PREFIX_seedN.json`` exist for, ascending."""
    path = Path(prefix)
    found = []
    for p in path.parent.glob(f"{path.name}_seed*.json"):
        m = re.fullmatch(re.escape(path.name) + r"_seed(\d+)\.json", p.name)
        if m:
            found.append(int(m.group(1)))
    return sorted(found)


def _records(prefix: str, seed: int) -> dict[str, list[RequestResult]]:
    path = Path(f"{prefix}_seed{seed}.requests.jsonl.gz")
    out: dict[str, list[RequestResult]] = {}
    if not path.exists():
        return out
    with gzip.open(path, "rt") as fh:
        for line in fh:
            row = json.loads(line)
            out.setdefault(row["target"], []).append(RequestResult(**{k: row[k] for k in row if k in _FIELDS}))
    return out


def load(prefixes: Sequence[str]) -> list[SeedRun]:
    """Every seed of ``prefixes[0]``, each with the targets of the later prefixes it lacks (first wins)."""
    out = []
    for seed in seeds_of(prefixes[0]):
        report: Report | None = None
        records: dict[str, list[RequestResult]] = {}
        for prefix in prefixes:
            path = Path(f"{prefix}_seed{seed}.json")
            if not path.exists():
                continue
            rep = load_report(json.loads(path.read_text()))
            kept = _records(prefix, seed)
            if report is None:
                report = rep
                new = [r for r in rep.runs if not r.skipped]
            else:
                have = {r.target for r in report.runs}
                new = [r for r in rep.runs if r.target not in have and not r.skipped]
                report.runs += new
            records.update({r.target: kept[r.target] for r in new if r.target in kept})
        if report is not None:
            out.append(SeedRun(seed, report, records))
    return out


# --------------------------------------------------------------------------------------------------------------------
# Reachable requests


def _profile(report: Report) -> str:
    return str(report.fleet.get("profile", "h100x2")).split(",")[0]


@cache
def _idle_ttft(profile: str, prompt_tokens: int, reusable_tokens: int) -> float:
    return idle_ttft_s(profile, prompt_tokens, reusable_tokens)


def reachable_indices(run: SeedRun) -> set[int]:
    """The requests of this seed some router could serve within the TTFT objective (the module docstring)."""
    prompt: dict[int, int] = {}
    reusable: dict[int, int] = {}
    served: set[int] = set()
    for recs in run.records.values():
        for r in recs:
            # A request answered before its prefill (429) or cut before its first token has no usage: another
            # target's record of the same request has the engines' count.
            prompt[r.index] = max(prompt.get(r.index, 0), r.prompt_tokens or r.content_tokens)
            reusable[r.index] = max(reusable.get(r.index, 0), r.reusable_tokens)
            if r.status != 400:
                served.add(r.index)
    profile, slo = _profile(run.report), run.report.slo.ttft_s
    # A prompt every target's engines refused (400: over the model's context, the Mooncake trace's longest) is
    # unreachable too, however much of it a cache would hold.
    return {i for i, n in prompt.items() if i in served and _idle_ttft(profile, n, reusable[i]) <= slo}


def reachable_report(run: SeedRun) -> Report:
    """The seed's report with each stage of every target that kept records recomputed over its reachable requests
    (``bench.report.summarize_stage``); targets without records are left out."""
    keep = reachable_indices(run)
    rep = run.report
    runs = []
    for tr in rep.runs:
        recs = run.records.get(tr.target)
        if recs is None:
            continue
        stages = [
            summarize_stage(
                st["label"],
                st["rate"],
                st["duration_s"],
                [r for r in recs if r.stage == st["label"] and r.index in keep],
                rep.reuse_bound.get(st["label"], 0.0),
                rep.slo,
            )
            for st in rep.stages
            if st.get("measured", True)
        ]
        runs.append(TargetRun(target=tr.target, settings=tr.settings, stages=stages))
    return replace(rep, runs=runs)


# --------------------------------------------------------------------------------------------------------------------
# Reading


def _per_seed(reports: Sequence[Report], seeds: Sequence[int], target: str, label: str) -> dict[int, float]:
    out = {}
    for seed, rep in zip(seeds, reports, strict=True):
        for tr in rep.runs:
            if tr.target == target:
                for st in tr.stages:
                    if st.stage == label:
                        out[seed] = st.goodput_rps
    return out


def _seeds_cell(values: dict[int, float], seeds: Sequence[int]) -> str:
    """One value per seed in the header's order, '-' for a seed whose run lacks it (a rerun still going)."""
    return ", ".join(f"{values[s]:.2f}" if s in values else "-" for s in seeds)


def bar_lines(reports: Sequence[Report], seeds: Sequence[int], what: str) -> list[str]:
    """The bar at the first stage where the best peer misses the TTFT SLO over ``reports`` (one per seed)."""
    first = reports[0]
    if not _peers(first):
        return ["No peer in this run: the bar needs one (`PREFIX,OTHER` merges a run that has it).", ""]
    missed = first_missed_stage(reports)
    if missed is None:
        return [
            f"The best peer meets the TTFT SLO ({what}; median TTFT p90 <= {first.slo.ttft_s:g} s) at every stage: "
            "the ladder does not reach overload for it, no bar to read.",
            "",
        ]
    label, peer = missed
    stages_of = stages_lookup(reports)
    p90 = spread(stages_of(peer, label), "ttft_p90")
    theirs = _per_seed(reports, seeds, peer, label)
    lines = [
        f"First stage where the best peer misses the TTFT SLO ({what}): **{label}**, {peer} (TTFT p90 {show(p90)} s, "
        f"goodput {show(spread_of(list(theirs.values())))} req/s).",
        "",
        f"| target | goodput {label}, median [range] | per seed ({', '.join(map(str, seeds))}) | ratio of medians "
        f"| per-seed ratios, median [range] | bar {BAR:g}x |",
        "|---|---|---|---|---|---|",
    ]
    peer_med = spread_of(list(theirs.values()))
    for t in _cognitora(first):
        ours = _per_seed(reports, seeds, t, label)
        good = spread_of(list(ours.values()))
        if good is None or peer_med is None:
            lines.append(f"| {t} | - | - | - | - | not run at {label} |")
            continue
        ratios = spread_of([ours[s] / theirs[s] for s in ours if theirs.get(s)])
        if peer_med.median > 0:
            ratio = good.median / peer_med.median
            met = f"**met** ({ratio:.2f}x)" if ratio >= BAR else f"not met ({ratio:.2f}x)"
            ratio_s = f"{ratio:.2f}x"
        else:
            met, ratio_s = f"no ratio: the peer serves 0, {t} {good.median:.2f} req/s", "-"
        lines.append(f"| {t} | {show(good)} | {_seeds_cell(ours, seeds)} | {ratio_s} | {show(ratios)} | {met} |")
    return [*lines, ""]


def _missed(reports: Sequence[Report]) -> str | None:
    missed = first_missed_stage(reports)
    return missed[0] if missed else None


def _cognitora(report: Report) -> list[str]:
    return [r.target for r in report.runs if not r.skipped and r.target.startswith("cognitora")]


def plain_target(report: Report, asked: str | None) -> str | None:
    """Cognitora without flow control: ``asked``, else the first ``cognitora-envoy`` target without
    ``flow_control`` in its name (on long context and B2B it carries the class's objectives), else any such."""
    names = _cognitora(report)
    if asked is not None:
        return asked if asked in names else None
    plain = [t for t in names if "flow_control" not in t]
    return next((t for t in plain if t.startswith("cognitora-envoy")), plain[0] if plain else None)


def never_worse_lines(reports: Sequence[Report], plain: str | None, saturated: str | None) -> list[str]:
    """Flow-control targets against ``plain`` at the stages before ``saturated`` (every stage when None):
    goodput and TTFT p90 over all requests, ``bench.protocol``'s verdicts. With no stage before it, the figures at
    ``saturated`` itself, for reference, and no verdict on the bar."""
    first = reports[0]
    flow = [t for t in _cognitora(first) if "flow_control" in t]
    if plain is None or not flow:
        return [f"No {'flow-control target' if plain else 'plain Cognitora target'} in this run: nothing to check.", ""]
    labels = measured_stages(first)
    below = labels[: labels.index(saturated)] if saturated else labels
    shown = below or labels[:1]
    stages_of = stages_lookup(reports)
    few = " (fewer than 3 seeds: a range is narrow, a small difference may read as worse)" if len(reports) < 3 else ""
    lines = [
        f"Stages {', '.join(shown)}, against {plain}: goodput and TTFT p90 (all requests), median [range] (per seed); "
        f"'worse' only when the ranges do not overlap{few}.",
        "",
        "| stage | target | goodput | vs plain | verdict | TTFT p90 | vs plain | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fails: list[str] = []
    for label in shown:
        pg, pp = spread(stages_of(plain, label), "goodput_rps"), spread(stages_of(plain, label), "ttft_p90")
        for t in flow:
            g, p = spread(stages_of(t, label), "goodput_rps"), spread(stages_of(t, label), "ttft_p90")
            vg, vp = verdict(g, pg, True), verdict(p, pp, False)
            lines.append(
                f"| {label} | {t} | {_with_seeds(g)} | {_with_seeds(pg)} | {vg} | {_with_seeds(p)} | "
                f"{_with_seeds(pp)} | {vp} |"
            )
            fails += [
                f"{t} at {label} ({what} worse)" for what, v in (("goodput", vg), ("TTFT p90", vp)) if v == "worse"
            ]
    lines.append("")
    if not below:
        lines.append(
            f"No stage below {saturated} on this ladder (the peer misses at its first stage): 'never worse below "
            f"saturation' cannot be read here; {saturated} is shown for reference only."
        )
    elif fails:
        lines.append("**Never worse below saturation: fails**: " + "; ".join(fails) + ".")
    else:
        lines.append(f"Never worse below saturation: holds at {', '.join(below)} (within range or better).")
    return [*lines, ""]


def _with_seeds(s: Spread | None) -> str:
    if s is None or len(s.values) == 1:
        return show(s)
    return f"{show(s)} ({', '.join(f'{v:.2f}' for v in s.values)})"


def reachable_lines(runs: Sequence[SeedRun], plain: str | None) -> list[str]:
    first = runs[0].report
    peers = _peers(first)
    targets = [r.target for r in first.runs if not r.skipped]
    missing = {t: [sr.seed for sr in runs if t not in sr.records] for t in targets}
    kept = [t for t in targets if not missing[t]]
    lines = ["Per-request records kept by: " + (", ".join(kept) or "none")]
    if any(missing.values()):
        lines[0] += "; not by: " + "; ".join(f"{t} (seeds {', '.join(map(str, s))})" for t, s in missing.items() if s)
    lines[0] += "."
    lines.append("")
    if not any(sr.records for sr in runs):
        return [*lines, "The bar on reachable requests is not read: no target kept records.", ""]
    lines += _unreachable_table(runs)
    lacking = [p for p in peers if missing[p]]
    if not peers or lacking:
        why = f"{', '.join(lacking)} kept no records" if lacking else "this run has no peer"
        return [*lines, f"The bar on reachable requests is not read: it needs every peer's records, and {why}.", ""]
    reps = [reachable_report(sr) for sr in runs]
    lines += bar_lines(reps, [sr.seed for sr in runs], "on reachable requests")
    no_rec = [t for t in _cognitora(first) if len(missing[t]) == len(runs)]
    if no_rec:
        lines += [f"Left out, no records: {', '.join(no_rec)}.", ""]
    saturated = _missed(reps)
    if saturated != _missed([sr.report for sr in runs]):
        lines += [
            f"Never worse below saturation, read below {saturated or 'no stage'} (where the peer misses on reachable "
            "requests):",
            "",
            *never_worse_lines([sr.report for sr in runs], plain, saturated),
        ]
    return lines


def _peers(report: Report) -> list[str]:
    return [r.target for r in report.runs if not r.skipped and not r.target.startswith("cognitora")]


def _unreachable_table(runs: Sequence[SeedRun]) -> list[str]:
    """Per stage: the unreachable requests of each seed, and the best peer's reading on the rest where it kept
    records."""
    first = runs[0].report
    peers = [p for p in _peers(first) if all(p in sr.records for sr in runs)]
    keep = [reachable_indices(sr) for sr in runs]
    reps = [reachable_report(sr) for sr in runs]
    stages_of = stages_lookup(reps)
    stages_all = stages_lookup([sr.report for sr in runs])
    lines = [
        f"Unreachable: the fleet profile's idle prefill over the {first.slo.ttft_s:g} s objective, every target's "
        "records pooled per request.",
        "",
        "| stage | unreachable / arrivals, per seed | best peer on reachable requests | its goodput there "
        "| its TTFT p90 there | its TTFT p90, all requests |",
        "|---|---|---|---|---|---|",
    ]
    for label in measured_stages(first):
        counts = []
        for sr, k in zip(runs, keep, strict=True):
            idx = {r.index for recs in sr.records.values() for r in recs if r.stage == label}
            counts.append(f"{len(idx - k)} / {len(idx)}")
        bp = best_peer(peers, label, stages_of)
        cells = (
            [
                bp,
                show(spread(stages_of(bp, label), "goodput_rps")),
                show(spread(stages_of(bp, label), "ttft_p90")),
                show(spread(stages_all(bp, label), "ttft_p90")),
            ]
            if bp
            else ["- (no peer with records)", "-", "-", "-"]
        )
        lines.append(f"| {label} | {', '.join(counts)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


_KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("queue timeout", lambda m: "waited" in m),
    ("queue full", lambda m: "queue is full" in m or "max_queued" in m or "requests waiting" in m),
    ("shed at admission", lambda m: "fleet saturated" in m),
)


def kind_429(message: str) -> str:
    """Which refusal a 429's message says (the module docstring)."""
    return next((name for name, test in _KINDS if test(message)), "other")


def refusal_lines(runs: Sequence[SeedRun]) -> list[str]:
    first = runs[0].report
    names = [*(k for k, _ in _KINDS), "other"]
    lines = [
        "| target | stage | 429s per seed | of the requests | " + " / ".join(names) + " (seeds summed) | from |",
        "|---|---|---|---|---|---|",
    ]
    for t in _cognitora(first):
        any_row = False
        for label in measured_stages(first):
            per_seed: list[int | None] = []
            total: list[int | None] = []
            kinds, source = dict.fromkeys(names, 0), set()
            for sr in runs:
                recs = sr.records.get(t)
                if recs is not None:
                    here = [r for r in recs if r.stage == label]
                    msgs = [r.error for r in here if r.status == 429]
                    total.append(len(here))
                    source.add("records")
                else:
                    st = _stage(sr.report, t, label)
                    if st is None:  # this seed's run lacks the target (a rerun still going)
                        per_seed.append(None)
                        total.append(None)
                        continue
                    msgs = [k for k, n in st.errors.items() if k.startswith("429") for _ in range(n)]
                    total.append(st.requests)
                    source.add("JSON")
                per_seed.append(len(msgs))
                for m in msgs:
                    kinds[kind_429(m)] += 1
            if any(per_seed):
                any_row = True
                lines.append(
                    f"| {t} | {label} | {_counts(per_seed)} | {_counts(total)} | "
                    + " / ".join(str(kinds[k]) for k in names)
                    + f" | {', '.join(sorted(source))} |"
                )
        if not any_row:
            lines.append(f"| {t} | every stage | 0 | | | |")
    return [*lines, ""]


def _counts(values: Sequence[int | None]) -> str:
    return ", ".join("-" if v is None else str(v) for v in values)


def _stage(report: Report, target: str, label: str) -> StageSummary | None:
    return next((s for tr in report.runs if tr.target == target for s in tr.stages if s.stage == label), None)


def read_workload(prefixes: Sequence[str], plain: str | None = None) -> list[str]:
    runs = load(prefixes)
    name = ", ".join(f"`{p}`" for p in prefixes)
    if not runs:
        return [f"## {name}", "", "No `_seedN.json` found.", ""]
    first = runs[0].report
    reports = [sr.report for sr in runs]
    seeds = [sr.seed for sr in runs]
    stages = ", ".join(f"{s['label']} x {s['duration_s']:g} s" for s in first.stages if s.get("measured", True))
    lines = [
        f"## {first.workload}: {name}",
        "",
        f"Seeds {', '.join(map(str, seeds))}; stages {stages}; SLO TTFT {first.slo.ttft_s:g} s, ITL "
        f"{first.slo.itl_s:g} s; time scale {first.time_scale:g}; targets "
        f"{', '.join(r.target for r in first.runs if not r.skipped)}.",
        "",
        "### 1. The bar (goodput >= 1.3x the best peer's where it misses the TTFT SLO)",
        "",
        *bar_lines(reports, seeds, "all requests"),
        "### 2. Never worse than plain Cognitora below saturation",
        "",
        *never_worse_lines(reports, plain_target(first, plain), _missed(reports)),
        "### 3. The bar on reachable requests (the issue's proposal)",
        "",
        *reachable_lines(runs, plain_target(first, plain)),
        "### 4. 429s per Cognitora target",
        "",
        *refusal_lines(runs),
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overload_bar", description=__doc__.split("\n")[0])
    p.add_argument(
        "prefixes",
        nargs="*",
        help="one workload each: a bench.protocol --out prefix, ',OTHER' merges another's targets (first wins); "
        "default: the flow-control reruns in bench/results that exist",
    )
    p.add_argument("--plain", default=None, help="the Cognitora target without flow control to compare against")
    p.add_argument("--out", default=None, help="also write the report here (markdown)")
    given = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(given)
    workloads = [a.split(",") for a in args.prefixes] or [
        [str(RESULTS / r)] for r in RERUNS if seeds_of(str(RESULTS / r))
    ]
    if not workloads:
        raise SystemExit("no protocol run given and none of the flow-control reruns is in bench/results")
    lines = ["# Issue 42's overload bar (bench.overload_bar)", ""]
    lines += ["Command: `" + " ".join(["python -m bench.overload_bar", *given]) + "`", ""]
    for w in workloads:
        lines += read_workload(w, args.plain)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
