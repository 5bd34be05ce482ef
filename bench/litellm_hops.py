"""Join the hop timestamps of a run made with ``COGNITORA_BENCH_HOPS=DIR`` (issue 45) into a per-hop table.

``python -m bench.litellm_hops DIR TARGET [TARGET ...]``: the targets in the order the run started their proxies
(``--targets``). Each proxy wrote ``DIR/proxy-PID.jsonl`` (bench/litellm_hop_callback.py), the load generator
``DIR/client-PID.jsonl``; requests are matched on their ``x-bench-id``. Per target, mean and p90 in seconds of:

- ``to_pre``: client send -> the proxy's pre-call hook;
- ``pre_to_api``: pre-call hook -> LiteLLM's ``api_call_start_time`` (the request leaves for the engine);
- ``engine``: ``api_call_start_time`` -> ``completion_start_time`` (the engine's first chunk is in the proxy);
- ``to_iter``: ``completion_start_time`` -> the first chunk through the streaming-iterator hook (when logged);
- ``out``: ``completion_start_time`` -> the client's first token;
- ``proxy``: the client's TTFT minus ``engine``: what the proxy and the network add.

Each target's loop stalls too (``lag``: a 10 ms timer late by over 20 ms) and garbage collections over 5 ms (``gc``):
count, sum and max over the measured stage.

Only requests sent after ``--skip`` seconds (the warm-up) count.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

HOPS = ("to_pre", "pre_to_api", "engine", "to_iter", "out", "ttft", "proxy")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    p90 = values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]
    return f"{sum(values) / len(values):.2f} ({p90:.2f})"


def hop_rows(where: Path, targets: list[str], skip_s: float) -> list[tuple[str, int, dict[str, str]]]:
    clients = {r["id"]: r for p in where.glob("client-*.jsonl") for r in _lines(p)}
    proxies = sorted((_lines(p) for p in where.glob("proxy-*.jsonl")), key=lambda recs: recs[0]["t"] if recs else 0)
    rows = []
    for target, recs in zip(targets, proxies, strict=False):
        by_call: dict[str, dict[str, Any]] = {}
        for r in recs:
            by_call.setdefault(str(r.get("call")), {}).update(
                {k: v for k, v in r.items() if v is not None} | {r["ev"]: r["t"]}
            )
        joined = [(clients[c["id"]], c) for c in by_call.values() if c.get("id") in clients]
        if not joined:
            continue
        t0 = min(cl["sent"] for cl, _ in joined)
        hops: dict[str, list[float]] = {h: [] for h in HOPS}
        for cl, px in joined:
            if cl["sent"] < t0 + skip_s:
                continue
            ttft = cl["first"] - cl["sent"]
            hops["ttft"].append(ttft)
            if "pre" in px:
                hops["to_pre"].append(px["pre"] - cl["sent"])
            if "pre" in px and "api_call_start" in px:
                hops["pre_to_api"].append(px["api_call_start"] - px["pre"])
            if "api_call_start" in px and "completion_start" in px:
                engine = px["completion_start"] - px["api_call_start"]
                hops["engine"].append(engine)
                hops["out"].append(cl["first"] - px["completion_start"])
                hops["proxy"].append(ttft - engine)
                if "first" in px:
                    hops["to_iter"].append(px["first"] - px["completion_start"])
        stats = {h: _stats(v) for h, v in hops.items()}
        t_end = max(cl["first"] for cl, _ in joined)
        for ev, key in (("lag", "lag"), ("gc", "dur")):
            vals = [r[key] for r in recs if r["ev"] == ev and t0 + skip_s <= r["t"] <= t_end]
            stats[ev] = f"{len(vals)}, {sum(vals):.2f}, {max(vals, default=0):.2f}"
        gen2 = [r for r in recs if r["ev"] == "gc" and r.get("gen") == 2 and t0 + skip_s <= r["t"] <= t_end]
        stats["gc2"] = (
            f"{len(gen2)}, {sum(r['dur'] for r in gen2):.2f} ({','.join(sorted({r['thread'] for r in gen2}))})"
        )
        rows.append((target, len(hops["ttft"]), stats))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--skip", type=float, default=20.0, help="seconds of warm-up to leave out")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    cols = (*HOPS, "lag", "gc", "gc2")
    print("| run | target | n | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for target, n, stats in hop_rows(args.dir, args.targets, args.skip):
        print(f"| {args.label} | {target} | {n} | " + " | ".join(stats[h] for h in cols) + " |")


if __name__ == "__main__":
    main()
