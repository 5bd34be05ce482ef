"""``make demo``: round-robin, sglang-router and Cognitora on the same simulated fleet and workload, in minutes.

What it does, in order:

1. builds a short B2B-SaaS shared-prefix workload (llm-d's 150 x 5, 6,000 / 1,200 / 1,000 tokens), scaled to a
   4-engine fleet (groups and rates in proportion to the published 8-engine setup);
2. for each of three targets, starts a fresh simulated fleet (4 engines of Qwen3-32B on 2 x H100, vLLM-like), the
   router, and sends the same open-loop Poisson schedule (a tqdm bar per target shows requests answered: a first
   token, or an end without one):
   - round-robin: Envoy ``ROUND_ROBIN`` (what a Kubernetes Service does);
   - sglang-router: the strongest cache-aware peer, ``--policy cache_aware`` with its documented defaults;
   - Cognitora: the LiteLLM proxy with ``routing_strategy: cognitora`` and the embedded (in-process) store;
3. prints, per router, the requests served (a first token arrived) and their TTFT, goodput and prefix-cache hit
   rate side by side, and the verdict: is Cognitora ahead of round-robin?
4. writes ``demo.md`` (the full report), ``demo.json``, ``demo.png`` (each request's TTFT per router: the
   distribution and the timeline, ``bench/ttft_plot.py``) and ``demo.requests.jsonl.gz`` (every request) into a new
   directory, ``$XDG_CACHE_HOME/cognitora/demo/<time>-*`` (``~/.cache/...``), or ``--out DIR`` (a directory that
   does not exist yet or is empty): never into the checkout's committed results.

Answers are 1,000 tokens long, longer than the demo waits after the last request: a stream still running at the
deadline is cut there by the demo and counts as served, judged on what had arrived (its TTFT, its pace). A request
with no first token by then counts as queued, with its wait so far as a lower bound of its TTFT.

Exit status: 0 when Cognitora is ahead of round-robin (lower TTFT p90, goodput at least as high); 2 when it is not
(the results are still written, to look at); 1 when a target could not run (its fleet or router did not start, or
not one request succeeded: the error is printed, nothing is written).

The full side-by-side benchmark with every peer is ``make bench`` (bench/run_all.py; bench/README.md).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import run_all
from bench import workloads as wl
from bench.loadgen import RequestResult
from bench.report import Report, Slo, StageSummary, TargetRun, render_markdown, report_json, why_unusable
from bench.ttft_plot import plot_ttft

ENGINES = 4
PROFILE = "h100x2"
KV_TOKENS = 300_000
# The published ladder is for 8 engines; the demo's 4 engines get half of its 15-QPS warm-up and 20-QPS stage.
WARMUP = (7.5, 8.0)
STAGE_RATE = 10.0
STAGE_S = 16.0
MAX_WALL_RPS = 5.0
DRAIN_S = 20.0  # engine seconds after the last request; still running then: cut, judged on what streamed
BASELINE = "envoy-rr"
LABELS = {
    "envoy-rr": "round-robin (Envoy)",
    "sglang-cache-aware": "sglang-router (cache_aware)",
    "cognitora-litellm": "Cognitora (LiteLLM)",
    "cognitora-envoy": "Cognitora (Envoy)",
}
EXIT_NOT_AHEAD = 2
"""Exit status when every target ran and Cognitora is not ahead of round-robin."""

HEADER = [
    "target",
    "sent",
    "served",
    "TTFT p50 s",
    "TTFT p90 s",
    "queued at deadline",
    "failed",
    "goodput req/s",
    "cache hit*",
    "reuse bound*",
]


def served(s: StageSummary) -> int:
    """Requests whose first token arrived: finished, or still streaming when the demo's deadline cut them."""
    return s.ok + s.streaming_at_cut


def _row(label: str, run: TargetRun, s: StageSummary | None, note: str = "") -> list[str]:
    if s is None:
        return [label, note or "-", *[""] * (len(HEADER) - 2)]

    def f(v: float | None, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    return [
        label,
        str(s.requests),
        str(served(s)),
        f(s.ttft_p50),
        f(s.ttft_p90),
        str(s.waiting_at_cut),
        str(s.errored),
        f"{s.goodput_rps:.2f}",
        "-" if run.engine_hit_rate is None else f"{run.engine_hit_rate:.0%}",
        "-" if run.engine_reuse_bound is None else f"{run.engine_reuse_bound:.0%}",
    ]


def _table(rows: Sequence[Sequence[str]]) -> str:
    header = HEADER
    cols = [header, *rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |", line]
    for r in rows:
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    out.append(line)
    return "\n".join(out)


@dataclass(frozen=True)
class Verdict:
    ahead: bool
    reason: str


def verdict(cognitora: StageSummary | None, round_robin: StageSummary | None) -> Verdict:
    """Is Cognitora ahead of round-robin on the measured stage: a lower TTFT p90 and at least its goodput?

    TTFT p90 counts requests still queued at the deadline with their wait so far, so a router cannot look fast by
    leaving requests unserved.
    """
    if cognitora is None or round_robin is None:
        return Verdict(False, "the measured stage is missing from a run")
    cog, rr = cognitora.ttft_p90, round_robin.ttft_p90
    if cog is None:
        return Verdict(False, "Cognitora served no request in the measured stage")
    if rr is None:  # round-robin served nothing: anything served is ahead of it
        return Verdict(True, "round-robin served no request in the measured stage")
    numbers = (
        f"TTFT p90 {cog:.2f} s vs {rr:.2f} s, goodput {cognitora.goodput_rps:.2f} vs {round_robin.goodput_rps:.2f} "
        "req/s"
    )
    if cog >= rr:
        return Verdict(False, f"its TTFT p90 is not lower: {numbers}")
    if cognitora.goodput_rps < round_robin.goodput_rps:
        return Verdict(False, f"its goodput is lower: {numbers}")
    return Verdict(True, numbers)


def default_out_dir() -> Path:
    """A new directory under ``$XDG_CACHE_HOME/cognitora/demo`` (``~/.cache`` when unset), named by the time."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cognitora" / "demo"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base))


def check_out(requested: str | None) -> None:
    """Refuse, before anything runs, an ``--out`` that holds files: the demo never overwrites any."""
    if requested is None:
        return
    path = Path(requested)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise SystemExit(f"--out {requested}: exists and is not an empty directory; the demo never overwrites files")


def out_dir(requested: str | None) -> Path:
    """Where this run's files go: ``requested`` (checked by ``check_out``), else a new default directory."""
    if requested is None:
        return default_out_dir()
    check_out(requested)
    path = Path(requested)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_results(
    directory: Path, report: Report, raw: Sequence[dict[str, Any]], measured: str, labels: dict[str, str]
) -> list[Path]:
    """``demo.md``, ``demo.json``, ``demo.png`` and ``demo.requests.jsonl.gz`` in ``directory``."""
    md, js, png, requests = (directory / f"demo{s}" for s in (".md", ".json", ".png", ".requests.jsonl.gz"))
    md.write_text(render_markdown(report))
    js.write_text(json.dumps(report_json(report), indent=1))
    by_target: dict[str, list[RequestResult]] = {}
    for row in raw:
        fields = {k: v for k, v in row.items() if k != "target"}
        by_target.setdefault(row["target"], []).append(RequestResult(**fields))
    title = (
        f"make demo: time to first token of every request at {measured} ({report.workload}, "
        f"{report.fleet.get('engines')} simulated engines, engine seconds), each router on its own fresh fleet"
    )
    plot_ttft(by_target, labels, measured, report.slo.ttft_s, title, png)
    with gzip.open(requests, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in raw)
    return [md, js, png, requests]


def _take(argv: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` from ``argv`` and return VALUE (None when absent)."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    if i + 1 >= len(argv):
        raise SystemExit(f"{flag} needs a value")
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    t0 = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--via envoy` shows Cognitora behind Envoy (ext_proc) instead of inside LiteLLM; other flags go to run_all.
    via = _take(argv, "--via") or "litellm"
    if via not in ("litellm", "envoy"):
        raise SystemExit("--via must be 'litellm' or 'envoy'")
    requested_out = _take(argv, "--out")
    check_out(requested_out)
    targets = (BASELINE, "sglang-cache-aware", f"cognitora-{via}")
    args = run_all.parse_args(
        [
            "--engines", str(ENGINES), "--profile", PROFILE, "--kv-tokens-per-engine", str(KV_TOKENS),
            "--max-wall-rps", str(MAX_WALL_RPS), "--drain", str(DRAIN_S), *argv,
        ]
    )  # fmt: skip
    profile = wl.B2B_SAAS.scaled_to(ENGINES, KV_TOKENS)
    stages = wl.ladder([STAGE_RATE], STAGE_S, *WARMUP)
    schedule = wl.shared_prefix_schedule(profile, stages, seed=args.seed)
    time_scale = run_all.pick_time_scale(schedule, args.time_scale, args.max_wall_rps)
    spec = run_all.FleetSpec(ENGINES, PROFILE, args.model, time_scale, args.stream_chunk_tokens, args.tokenizer)
    slo = Slo(args.slo_ttft, args.slo_itl)
    print(
        f"Cognitora demo: {ENGINES} simulated engines ({PROFILE}: Qwen3-32B on 2 x H100), workload "
        f"{schedule.description}\n  {len(schedule.requests)} requests: warm-up {WARMUP[0]:g} req/s x {WARMUP[1]:g} s, "
        f"then {STAGE_RATE:g} req/s x {STAGE_S:g} s (engine time; the sim runs at time scale {time_scale:g})\n",
        flush=True,
    )
    report = Report(
        command="make demo  # python -m bench.demo " + " ".join([*argv, "--via", via]),
        workload=schedule.workload,
        description=schedule.description,
        started_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        time_scale=time_scale,
        slo=slo,
        fleet=spec.as_dict(),
        stages=[{"label": s.label, "rate": s.rate, "duration_s": s.duration_s, "measured": s.measured} for s in stages],
        reuse_bound={label: schedule.reuse_bound(label) for label in schedule.stage_labels()},
    )
    rows: list[list[str]] = []
    failed: list[str] = []
    raw: list[dict[str, Any]] = []
    measured = stages[-1].label
    for name in targets:
        print(f"== {LABELS[name]}: starting a fresh fleet and the router", flush=True)
        run: TargetRun = run_all.run_target(name, schedule, spec, args, slo, raw=raw)
        report.runs.append(run)
        stage = next((s for s in run.stages if s.stage == measured), None)
        why = why_unusable(run)
        if why:
            failed.append(f"{LABELS[name]} could not run: {why}")
            print(f"   FAILED: {why}", file=sys.stderr, flush=True)
            rows.append(_row(LABELS[name], run, None, "FAILED (see above)"))
        else:
            rows.append(_row(LABELS[name], run, stage))
            if run.health is not None and run.health.saturated:
                print(f"   WARNING: this machine could not keep up ({run.health.reason})", flush=True)
    if failed:
        print(_table(rows))
        for line in failed:
            print(f"FAILED: {line}", file=sys.stderr)
        # A report of a run that did not happen would read as a result.
        print("No report written: the demo did not run every target.", file=sys.stderr)
        return 1
    directory = out_dir(requested_out)
    paths = write_results(directory, report, raw, measured, LABELS)
    print(
        f"\nMeasured stage ({measured}), engine seconds; goodput = requests with TTFT <= {slo.ttft_s:g} s and "
        f"ITL <= {slo.itl_s * 1000:g} ms per second:"
    )
    print(_table(rows))
    print(
        "Served: the first token arrived. Answers are 1,000 tokens, longer than the demo waits: streams still running"
    )
    print("  at the deadline are cut there and count as served (judged on what arrived), not as failures. Queued at")
    print("  deadline: no first token yet; TTFT counts their wait so far (a lower bound).")
    print("* cache hit: the engines' own prefix-cache counters over the whole run; reuse bound: the most any router")
    print("  could hit on the same requests (bench/README.md).")
    by_target = {r.target: next((s for s in r.stages if s.stage == measured), None) for r in report.runs}
    cog = by_target.get(targets[-1])
    for peer in targets[:-1]:
        other = by_target.get(peer)
        if other and cog and other.ttft_p90 and cog.ttft_p90:
            goodput = f"{cog.goodput_rps / other.goodput_rps:.2f}x" if other.goodput_rps else "n/a (peer: 0)"
            print(
                f"Cognitora vs {LABELS[peer]}: TTFT p90 {cog.ttft_p90:.2f} s vs {other.ttft_p90:.2f} s, "
                f"goodput {goodput} (one run: the benchmark protocol, bench/README.md, repeats runs)."
            )
    print(f"\nResults: {directory}/ ({', '.join(p.name for p in paths)}; {time.monotonic() - t0:.0f} s)")
    print(f"  the plot: {paths[2]}")
    result = verdict(cog, by_target.get(BASELINE))
    if result.ahead:
        print(f"Verdict: Cognitora is ahead of {LABELS[BASELINE]}: {result.reason}.")
        return 0
    print(f"Verdict: Cognitora is NOT ahead of {LABELS[BASELINE]}: {result.reason}.", file=sys.stderr)
    return EXIT_NOT_AHEAD


if __name__ == "__main__":
    raise SystemExit(main())
