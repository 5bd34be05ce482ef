"""Summarize repeated side-by-side runs on a mixed fleet: TTFT p90, goodput, J per output token, and where the
requests went, per target, as the median and range (min-max) over the runs.

    python -m bench.mixed_fleet bench/results/mixed_fleet_run1 bench/results/mixed_fleet_run2 ... \\
        --out bench/results/mixed_fleet

Each argument is a ``bench.run_all --out`` prefix (its ``.json``), run on the same mixed fleet
(``--profile h100,h100,mac,mac,mac --engine-kind vllm,vllm,mlx,mlx,llamacpp``). Latency and goodput are the measured
stage's (engine seconds; goodput under the run's SLO); J per output token is the whole fleet's energy over its
output tokens (``bench.run_all``'s figure); the share is the fraction of requests each engine kind served.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def summarize(prefix: Path) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    report = json.loads(prefix.with_suffix(".json").read_text())
    kinds = _engine_kinds(report)
    out: dict[str, dict[str, float]] = {}
    for run in report["runs"]:
        if run["skipped"] or not run["stages"]:
            continue
        stage = run["stages"][-1]
        per_engine = [e["requests"] for e in run["engines"]]
        total = sum(per_engine) or 1
        row = {
            "ttft_p90": stage["ttft_p90"],
            "ttft_p50": stage["ttft_p50"],
            "goodput_rps": stage["goodput_rps"],
            "j_per_output_token": run["energy_per_output_token_j"],
            "hit_rate": stage["hit_rate"],
        }
        for kind in sorted(set(kinds)):
            row[f"share_{kind}"] = sum(n for n, k in zip(per_engine, kinds, strict=False) if k == kind) / total
        out[run["target"]] = row
    return out, report


def _engine_kinds(report: dict[str, Any]) -> list[str]:
    fleet = report["fleet"]
    kinds = [k for k in str(fleet.get("engine_kind", "vllm")).split(",") if k]
    return [kinds[i % len(kinds)] for i in range(int(fleet["engines"]))]


def cell(values: Sequence[float], digits: int) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    med = statistics.median(vals)
    return f"{med:.{digits}f} ({min(vals):.{digits}f}-{max(vals):.{digits}f})"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mixed_fleet", description=__doc__.splitlines()[0])
    p.add_argument("prefixes", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs = [summarize(prefix) for prefix in args.prefixes]
    targets: list[str] = []
    for rows, _ in runs:
        targets += [t for t in rows if t not in targets]
    kinds = sorted({k for _, report in runs for k in _engine_kinds(report)})
    columns = [
        ("TTFT p50 s", "ttft_p50", 3),
        ("TTFT p90 s", "ttft_p90", 3),
        ("goodput rps", "goodput_rps", 2),
        ("J / output token", "j_per_output_token", 3),
        ("engine hit rate", "hit_rate", 2),
        *[(f"share {k}", f"share_{k}", 2) for k in kinds],
    ]
    first = runs[0][1]
    lines = [
        "# Mixed fleet: Cognitora against round-robin, least-request and sglang-router",
        "",
        f"Fleet: {first['fleet']}. Workload: {first['description']}. SLO for goodput: TTFT <= "
        f"{first['slo']['ttft_s']:g} s, ITL <= {first['slo']['itl_s'] * 1000:g} ms.",
        "",
        f"{len(runs)} runs (each a fresh fleet per target, its own seed); each cell is the median and the range "
        "(min-max) over the runs. The machine is a shared 2-core box with other test suites running: absolute "
        "numbers are noisy, compare targets within a run.",
        "",
        "Commands:",
        "",
        "```bash",
        *[report["command"] for _, report in runs],
        "python -m bench.mixed_fleet " + " ".join(str(x) for x in args.prefixes) + f" --out {args.out}",
        "```",
        "",
        "| target | " + " | ".join(c[0] for c in columns) + " | runs |",
        "|---" * (len(columns) + 2) + "|",
    ]
    summary: dict[str, dict[str, list[float]]] = {}
    for target in targets:
        present = [rows[target] for rows, _ in runs if target in rows]
        summary[target] = {key: [r.get(key) for r in present] for _, key, _ in columns}  # type: ignore[misc]
        cells = [cell(summary[target][key], digits) for _, key, digits in columns]
        lines.append(f"| {target} | " + " | ".join(cells) + f" | {len(present)} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"runs": [str(x) for x in args.prefixes], "summary": summary}))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
