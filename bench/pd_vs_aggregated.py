"""Prefill/decode disaggregation against aggregated serving, at equal engine count, through Envoy + Cognitora.

    python -m bench.pd_vs_aggregated --trace PATH/TO/synthetic_trace.jsonl --runs 3
    python -m bench.pd_vs_aggregated --workload b2b-saas --runs 3

Each run starts a fresh 4-engine simulated fleet (h100 profile, KV events, SmolLM2's tokenizer), Envoy on
examples/envoy.yaml and ``cognitora extproc --collector``, and sends the same schedule open-loop:

- ``aggregated``: 4 engines ``role: both``;
- ``pd``: 2 ``role: prefill`` + 2 ``role: decode`` engines, each decode engine behind ``cognitora pd-sidecar``;
  Cognitora places each request as a pair or whole on a decode engine, by predicted cost (docs/disaggregation.md);
- ``pd-split``: the same fleet with ``disaggregation.whole_on_decode: false``: every request split (classic P/D).
  The KV link is the h100 profile's (400 Gb/s, 0.5 ms), in the sim and in cognitora.yaml alike.

Workloads: the Mooncake synthetic trace (``--trace``: the FAST'25 release's ``synthetic_trace.jsonl``, replayed
``--speed`` times faster, the first ``--duration`` seconds) and B2B SaaS (``bench.workloads.B2B_SAAS`` scaled to the
fleet, one stage of ``--rate``). Reported per configuration: TTFT and ITL p50/p90 (engine seconds), goodput (requests
per second meeting TTFT <= ``--slo-ttft`` and mean ITL <= ``--slo-itl``), how many requests were split; with several
runs, the median and the range (min-max) across them. Results: ``--out`` ``.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import workloads as wl
from bench.loadgen import LoadResult, run_load
from cognitora_sim.harness.disagg_launch import start_sidecars
from cognitora_sim.harness.envoy_launch import render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import start_fleet
from cognitora_sim.tokenizer import SMOLLM2_DIR

MODEL = "smollm2"
ENGINES = 4
CONFIGS = ("aggregated", "pd", "pd-split")
LINK = {"link_gbps": 400.0, "link_latency_s": 0.0005}
H100_PREFILL_TOKENS_PER_S = 30000.0


@contextmanager
def gateway(config: str, time_scale: float, workdir: Path) -> Iterator[tuple[str, list[str]]]:
    """A fresh fleet in ``config``, with Envoy + ``cognitora extproc`` in front; yields (URL, sidecar URLs)."""
    roles = "both" if config == "aggregated" else "prefill,prefill,decode,decode"
    tokenizer = SMOLLM2_DIR / "tokenizer.json"
    with start_fleet(
        ENGINES,
        time_scale=time_scale,
        tokenizer=tokenizer,
        extra_args=["--roles", roles, "--stream-chunk-tokens", "8"],
        log_dir=workdir,
    ) as fleet:
        decode = [2, 3] if config != "aggregated" else []
        sidecar, sidecar_urls = (None, []) if not decode else start_sidecars([fleet.urls[i] for i in decode], workdir)
        role_of = roles.split(",") * ENGINES
        endpoints = []
        for i in range(ENGINES):
            url = sidecar_urls[decode.index(i)] if i in decode else fleet.urls[i]
            endpoints.append(
                {
                    "url": url,
                    "role": role_of[i],
                    "kv_events": fleet.events_addresses[i],
                    "kv_events_replay": fleet.replay_addresses[i],
                    # What an h100 prefills (tokens/s), as an operator would state it: an endpoint that never
                    # prefilled has nothing learned yet, and the default prior would keep a prefill pool unused.
                    "prefill_tokens_per_s": H100_PREFILL_TOKENS_PER_S,
                }
            )
        doc = {
            "models": [{"name": MODEL, "block_size": 16, "tokenizer": str(tokenizer), "endpoints": endpoints}],
            "scrape": {"interval_s": 1.0, "timeout_s": 1.0},
            "disaggregation": {**LINK, "whole_on_decode": config != "pd-split"},
        }
        path = workdir / f"cognitora-{config}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        port, listen, admin = free_port(), free_port(), free_port()
        argv = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(path), "--listen"]
        extproc = ManagedProcess([*argv, f"127.0.0.1:{port}", "--collector"], workdir / f"extproc-{config}.log")
        envoy = None
        try:
            wait_listening(port, extproc, timeout_s=60)
            engines = [e["url"].removeprefix("http://") for e in endpoints]
            text = render_config(listen_port=listen, admin_port=admin, extproc_port=port, engines=engines)
            envoy = start_envoy(text, workdir / f"envoy-{config}", admin)
            url = f"http://127.0.0.1:{listen}"
            wait_until(lambda: httpx.get(f"{url}/v1/models", timeout=2).status_code < 500, 30, "Envoy to route")
            yield url, sidecar_urls
        finally:
            if envoy is not None:
                envoy.stop()
            extproc.stop()
            if sidecar is not None:
                sidecar.stop()


def schedule(args: argparse.Namespace) -> wl.Schedule:
    if args.trace is not None:
        return wl.mooncake_schedule(args.trace, speed=args.speed, max_duration_s=args.duration)
    profile = wl.B2B_SAAS.scaled_to(ENGINES, 400_000)
    return wl.shared_prefix_schedule(profile, [wl.Stage("load", args.rate, args.duration)])


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(load: LoadResult, duration_s: float, slo_ttft: float, slo_itl: float, split: int) -> dict[str, Any]:
    ok = [r for r in load.results if r.ok and r.measured and not r.censored]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [r.itl_s for r in ok if r.itl_s is not None]
    good = [r for r in ok if (r.ttft_s or 0) <= slo_ttft and (r.itl_s or 0) <= slo_itl]
    return {
        "requests": len(load.results),
        "ok": len(ok),
        "failed": len([r for r in load.results if not r.ok]),
        "split": split,
        "ttft_p50": quantile(ttft, 0.5),
        "ttft_p90": quantile(ttft, 0.9),
        "itl_p50": quantile(itl, 0.5),
        "itl_p90": quantile(itl, 0.9),
        "goodput_rps": len(good) / duration_s,
        "harness_saturated": load.health.saturated,
        "errors": dict(Counter(f"{r.status} {r.error[:80]}".strip() for r in load.results if not r.ok).most_common(3)),
    }


async def one_run(args: argparse.Namespace, config: str, sched: wl.Schedule, workdir: Path) -> dict[str, Any]:
    with gateway(config, args.time_scale, workdir) as (url, sidecars):
        load = await run_load(url, sched, MODEL, time_scale=args.time_scale, drain_wall_s=args.drain)
        split = sum(httpx.get(f"{s}/sidecar/stats", timeout=5).json()["split"] for s in sidecars)
    span = max((r.arrival_s for r in sched.requests), default=0.0) or args.duration
    return summarize(load, span, args.slo_ttft, args.slo_itl, split)


def _cell(values: list[float | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    if len(got) == 1:
        return format(got[0], fmt)
    return f"{format(statistics.median(got), fmt)} ({format(min(got), fmt)}-{format(max(got), fmt)})"


def render(command: str, description: str, runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [
        f"# P/D against aggregated serving: {description}",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{ENGINES} simulated h100 engines per configuration (aggregated: 4 `both`; pd: 2 `prefill` + 2 `decode` "
        "behind `cognitora pd-sidecar`, split or whole by predicted cost; pd-split: the same, every request split), "
        "Envoy + `cognitora extproc --collector`, the KV link 400 Gb/s / 0.5 ms. "
        f"Time scale {args.time_scale:g}; latencies in engine seconds. Goodput: requests/s with TTFT <= "
        f"{args.slo_ttft:g} s and mean ITL <= {args.slo_itl:g} s. Each cell: median (min-max) over "
        f"{len(next(iter(runs.values())))} runs, configurations alternating, on a shared 2-core machine (noisy).",
        "",
        "| config | ok / sent | split | TTFT p50 | TTFT p90 | ITL p50 | ITL p90 | goodput rps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config, got in runs.items():
        ok = f"{_cell([g['ok'] for g in got], '.0f')} / {got[0]['requests']}"
        split = _cell([g["split"] for g in got], ".0f")
        cells = [_cell([g[k] for g in got], ".3f") for k in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90")]
        lines.append(
            f"| `{config}` | {ok} | {split} | "
            + " | ".join(cells)
            + f" | {_cell([g['goodput_rps'] for g in got], '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pd_vs_aggregated", description=__doc__.split("\n")[0])
    p.add_argument("--trace", type=Path, default=None, help="a Mooncake-format JSONL trace (else --workload)")
    p.add_argument("--workload", choices=["b2b-saas"], default="b2b-saas")
    p.add_argument("--speed", type=float, default=1.0, help="trace arrivals this many times faster")
    p.add_argument("--duration", type=float, default=30.0, help="engine seconds of schedule")
    p.add_argument("--rate", type=float, default=1.0, help="B2B SaaS requests per engine second")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--drain", type=float, default=60.0, help="wall seconds to wait for the last requests")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-itl", type=float, default=0.05)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sched = schedule(args)
    name = "mooncake" if args.trace is not None else args.workload
    out = args.out or Path(f"bench/results/pd_vs_aggregated_{name}")
    command = "python -m bench.pd_vs_aggregated " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    for i in range(args.runs):
        for config in CONFIGS if i % 2 == 0 else reversed(CONFIGS):
            workdir = Path(tempfile.mkdtemp(prefix=f"pd-bench-{config}-"))
            got = asyncio.run(one_run(args, config, sched, workdir))
            print(json.dumps({"run": i, "config": config, **got}), flush=True)
            runs[config].append(got)
    description = f"{name}, {len(sched.requests)} requests ({sched.description})"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(render(command, description, runs, args))
    out.with_suffix(".json").write_text(json.dumps({"command": command, "runs": runs}, indent=1))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    random.seed(0)
    sys.exit(main())
