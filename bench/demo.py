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
3. prints TTFT, goodput and prefix-cache hit rate side by side, and writes
   bench/results/side_by_side_demo.{md,json,png} (or ``--out PREFIX``).

The table counts what happened to every request sent in the measured stage: finished; still streaming when the
demo's deadline came (cut by the demo, not failed: judged on the tokens that had arrived); still queued at the
deadline (no first token yet: an overloaded router's queue); and failed (an error answer).

A target that could not run (its fleet or router did not start, or not one request succeeded) is reported with
the error, no report is written (the committed one stays), and the exit status is 1.

The full side-by-side benchmark with every peer is ``make bench`` (bench/run_all.py; bench/README.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import run_all
from bench import workloads as wl
from bench.report import Report, Slo, StageSummary, TargetRun, why_unusable, write_report

ENGINES = 4
PROFILE = "h100x2"
KV_TOKENS = 300_000
# The published ladder is for 8 engines; the demo's 4 engines get half of its 15-QPS warm-up and 20-QPS stage.
WARMUP = (7.5, 8.0)
STAGE_RATE = 10.0
STAGE_S = 16.0
MAX_WALL_RPS = 5.0
DRAIN_S = 20.0  # engine seconds after the last request; still running then: cut, judged on what streamed
LABELS = {
    "envoy-rr": "round-robin (Envoy)",
    "sglang-cache-aware": "sglang-router (cache_aware)",
    "cognitora-litellm": "Cognitora (LiteLLM)",
    "cognitora-envoy": "Cognitora (Envoy)",
}


HEADER = [
    "target",
    "sent",
    "finished",
    "streaming at deadline",
    "queued at deadline",
    "failed",
    "TTFT p50 s",
    "TTFT p90 s",
    "goodput req/s",
    "cache hit*",
    "reuse bound*",
]


def _row(label: str, run: TargetRun, s: StageSummary | None, note: str = "") -> list[str]:
    if s is None:
        return [label, note or "-", *[""] * (len(HEADER) - 2)]

    def f(v: float | None, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    return [
        label,
        str(s.requests),
        str(s.ok),
        str(s.streaming_at_cut),
        str(s.waiting_at_cut),
        str(s.errored),
        f(s.ttft_p50),
        f(s.ttft_p90),
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


def main(argv: Sequence[str] | None = None) -> int:
    t0 = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--via envoy` shows Cognitora behind Envoy (ext_proc) instead of inside LiteLLM; other flags go to run_all.
    via = "litellm"
    if "--via" in argv:
        i = argv.index("--via")
        via = argv[i + 1] if i + 1 < len(argv) else ""
        if via not in ("litellm", "envoy"):
            raise SystemExit("--via must be 'litellm' or 'envoy'")
        del argv[i : i + 2]
    targets = ("envoy-rr", "sglang-cache-aware", f"cognitora-{via}")
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
    measured = stages[-1].label
    for name in targets:
        print(f"== {LABELS[name]}: starting a fresh fleet and the router", flush=True)
        run: TargetRun = run_all.run_target(name, schedule, spec, args, slo)
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
        # A report of a run that did not happen would read as a result: keep the last real one.
        print("No report written: the demo did not run every target.", file=sys.stderr)
        return 1
    paths = write_report(report, Path(args.out) if args.out else run_all.RESULTS / "side_by_side_demo")
    print(
        f"\nMeasured stage ({measured}), engine seconds; goodput = requests with TTFT <= {slo.ttft_s:g} s and "
        f"ITL <= {slo.itl_s * 1000:g} ms per second:"
    )
    print(_table(rows))
    print("Streaming at deadline: the demo stopped waiting while tokens still arrived (not a failure; judged on what")
    print("  arrived). Queued at deadline: no first token yet. TTFT of both counts the wait so far (a lower bound).")
    print("* cache hit: the engines' own prefix-cache counters over the whole run; reuse bound: the most any router")
    print("  could hit on the same requests (bench/README.md).")
    stages = {r.target: next((s for s in r.stages if s.stage == measured), None) for r in report.runs}
    cog = stages.get(targets[-1])
    for peer in targets[:-1]:
        other = stages.get(peer)
        if other and cog and other.ttft_p90 and cog.ttft_p90:
            goodput = f"{cog.goodput_rps / other.goodput_rps:.2f}x" if other.goodput_rps else "n/a (peer: 0)"
            print(
                f"Cognitora vs {LABELS[peer]}: TTFT p90 {cog.ttft_p90:.2f} s vs {other.ttft_p90:.2f} s, "
                f"goodput {goodput} (one run: the benchmark protocol, bench/README.md, repeats runs)."
            )
    print(f"\nReport: {paths[0]}  ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
