"""Summarize side-by-side runs of the power trade-off: J per output token against TTFT and E2E, per target.

    python -m bench.power_tradeoff bench/results/power_tradeoff_run1 [bench/results/power_tradeoff_run2 ...] \\
        --out bench/results/power_tradeoff

Each argument is a ``bench.run_all --out`` prefix (its ``.json`` and ``.requests.jsonl.gz``), optionally with
``#target|target`` to take only those targets from it (a run whose other rows were made by older code).
Latencies are over the measured stages' successful requests (engine seconds); J per output token is the run's
whole-fleet energy over its output tokens (``bench.run_all``'s figure, warm-up included). With several runs, each
cell shows the mean and the range (min-max) across runs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import read_requests


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(prefix: Path) -> dict[str, dict[str, Any]]:
    """Per target: J/output token, TTFT and E2E p50/p90, requests per engine."""
    report = json.loads(prefix.with_suffix(".json").read_text())
    rows: dict[str, dict[str, list[float]]] = {}
    for r in read_requests(prefix):
        if not r["measured"] or r["status"] != 200 or r.get("censored"):
            continue
        got = rows.setdefault(r["target"], {"ttft": [], "e2e": []})
        got["ttft"].append(r["ttft_s"])
        got["e2e"].append(r["e2e_s"])
    out: dict[str, dict[str, Any]] = {}
    for run in report["runs"]:
        name = run["target"]
        got = rows.get(name, {"ttft": [], "e2e": []})
        out[name] = {
            "j_per_output_token": run["energy_per_output_token_j"],
            "ttft_p50": quantile(got["ttft"], 0.5),
            "ttft_p90": quantile(got["ttft"], 0.9),
            "e2e_p50": quantile(got["e2e"], 0.5),
            "e2e_p90": quantile(got["e2e"], 0.9),
            "requests": len(got["e2e"]),
            "per_engine": [e["requests"] for e in run["engines"]],
            "skipped": run["skipped"],
        }
    return out


def _cell(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.fmean(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def render(prefixes: Sequence[Path], runs: list[dict[str, dict[str, Any]]], out: Path) -> str:
    paths = [Path(str(p).partition("#")[0]) for p in prefixes]
    first = json.loads(paths[0].with_suffix(".json").read_text())
    lines = ["# Power trade-off: energy against TTFT and E2E on a mixed fleet", "", "Commands:", "", "```bash"]
    for p in dict.fromkeys(paths):
        lines.append(json.loads(p.with_suffix(".json").read_text())["command"])
    lines.append(f"python -m bench.power_tradeoff {' '.join(shlex.quote(str(p)) for p in prefixes)} --out {out}")
    lines += [
        "```",
        "",
        f"{first['description']}. Fleet: {json.dumps(first['fleet'])}. Stages: {json.dumps(first['stages'])}.",
        "",
        f"{len(runs)} run(s); with more than one, each cell is the mean (min-max). Latencies in engine seconds over",
        "the measured stage's successful requests; J per output token over the whole run (warm-up included).",
        "",
        "| target | runs | J / output token | TTFT p50 | TTFT p90 | E2E p50 | E2E p90 | per engine (1st run) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = list(dict.fromkeys(name for r in runs for name in r))
    for name in names:
        got = [r[name] for r in runs if name in r and not r[name]["skipped"]]
        if not got:
            lines.append(f"| {name} | 0 | skipped | | | | | |")
            continue
        cells = [
            str(len(got)),
            _cell([g["j_per_output_token"] for g in got], ".3f"),
            *(_cell([g[k] for g in got], ".3f") for k in ("ttft_p50", "ttft_p90", "e2e_p50", "e2e_p90")),
            " / ".join(map(str, got[0]["per_engine"])),
        ]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.power_tradeoff", description=__doc__.split("\n")[0])
    p.add_argument("prefixes", nargs="+", help="run_all --out prefixes, each optionally PREFIX#target|target")
    p.add_argument("--out", type=Path, default=Path("bench/results/power_tradeoff"))
    args = p.parse_args(argv)
    runs = []
    for arg in args.prefixes:
        prefix, _, only = str(arg).partition("#")
        got = summarize(Path(prefix))
        keep = set(only.split("|")) if only else set(got)
        runs.append({name: row for name, row in got.items() if name in keep})
    # Row order: the first run that has each target.
    order = list(dict.fromkeys(name for r in runs for name in r))
    runs = [{name: r[name] for name in order if name in r} for r in runs]
    args.out.with_suffix(".md").write_text(render(args.prefixes, runs, args.out))
    args.out.with_suffix(".json").write_text(json.dumps(dict(zip(args.prefixes, runs, strict=True)), indent=1))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
