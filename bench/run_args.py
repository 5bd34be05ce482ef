"""``bench.run_all``'s command line: its arguments, and the schedule and fleet they describe.

Apart from the runner because more than the runner rebuilds a run from its command: ``bench.capacity_bound`` (the
bounds of a run's schedule on its fleet), ``bench.report`` (an old raw file's ``max_tokens``) and the protocol.
The runner imports them from here; nothing here imports the runner.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench import workloads as wl
from bench.long_context import LongContextProfile, long_context_schedule
from bench.targets import all_targets
from cognitora_sim.profiles import profiles_for_fleet
from cognitora_sim.tokenizer import SMOLLM2_DIR

__all__ = ["BLOCK_SIZE", "DEFAULT_RATES", "SMOLLM2_TOKENIZER", "build_schedule", "fleet_kv_tokens", "parse_args"]

SMOLLM2_TOKENIZER = SMOLLM2_DIR / "tokenizer.json"
BLOCK_SIZE = 16
"""Tokens per KV block of the simulated fleet (``cognitora sim fleet --block-size``; ``run_all.FleetSpec``)."""
_DESCRIPTION = (
    "Side-by-side benchmark runner: every target, each in front of an identical fresh simulated fleet, same workload."
)
"""``--help``'s line: the first line of ``bench.run_all``'s docstring."""

# The published B2B ladder (llm-d guide): 3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60 QPS.
DEFAULT_RATES = {
    "b2b-saas": "3,10,20,30,45,60",
    "shared-prefix-32x32": "5,10,20,40",
    "multi-turn-chat": "2,5,10",
    # 8 h100x2 engines prefill ~7 requests/s of the profile's ~13k-token prompts: past that, every router queues.
    "long-context": "2,4,6,8",
}


def build_schedule(args: argparse.Namespace) -> wl.Schedule:
    if args.trace is not None or args.workload == "mooncake":
        if args.trace is None:
            # The trace is not shipped (1 MB of someone else's data): the user names the copy they fetched.
            raise SystemExit(
                "--workload mooncake needs --trace FILE: a Mooncake-format JSONL trace, e.g. "
                "FAST25-release/traces/synthetic_trace.jsonl from https://github.com/kvcache-ai/Mooncake"
            )
        return wl.mooncake_schedule(Path(args.trace), speed=args.speed, max_requests=args.max_requests)
    rates = [float(x) for x in (args.rates or DEFAULT_RATES[args.workload]).split(",") if x.strip()]
    warmup_rate, warmup_s = (float(x) for x in args.warmup.split(":")) if args.warmup else (0.0, 0.0)
    stages = wl.ladder(rates, args.stage_duration, warmup_rate, warmup_s)
    if args.workload == "long-context":
        return long_context_schedule(LongContextProfile(), stages, seed=args.seed)
    if args.workload == "multi-turn-chat":
        return wl.multi_turn_schedule(wl.MultiTurnProfile(), stages, seed=args.seed)
    profile = wl.PROFILES[args.workload].scaled_to(args.engines, args.kv_tokens_per_engine)
    return wl.shared_prefix_schedule(profile, stages, seed=args.seed)


def fleet_kv_tokens(args: argparse.Namespace) -> int:
    """The KV cache of the whole simulated fleet, in tokens (each engine's profile's capacity)."""
    return sum(p.kv_capacity_tokens for p in profiles_for_fleet(args.profile, args.engines))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run_all", description=_DESCRIPTION)
    workloads = [*wl.PROFILES, "multi-turn-chat", "long-context", "mooncake"]
    p.add_argument("--workload", default="b2b-saas", choices=workloads)
    p.add_argument("--rates", help="ladder of offered loads, requests per engine second (default per workload)")
    p.add_argument("--stage-duration", type=float, default=20.0, help="engine seconds per ladder stage")
    p.add_argument("--warmup", default="15:20", help="RATE:SECONDS unmeasured warm-up ('' for none)")
    p.add_argument(
        "--targets",
        default="all",
        help="comma list, 'all' or 'peers' (a Cognitora target takes placement overrides: "
        "'cognitora-envoy@power_ttft_slack_s=0;tie_band_s=0.01'); known: " + ", ".join(all_targets()),
    )
    p.add_argument("--duration", type=float, help="stop sending after this many wall seconds per target")
    p.add_argument("--max-requests", type=int, help="send at most this many requests per target")
    p.add_argument("--time-scale", default="auto", help="sim time scale X (engine time = X * wall time) or 'auto'")
    p.add_argument("--max-wall-rps", type=float, default=4.0, help="with --time-scale auto: wall req/s ceiling")
    p.add_argument("--trace", help="Mooncake-format JSONL trace to replay (implies --workload mooncake)")
    p.add_argument("--speed", type=float, default=1.0, help="trace replay speed factor (timestamps / speed)")
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--profile", default="h100x2", help="sim hardware profile (sim/cognitora_sim/profiles.py)")
    p.add_argument(
        "--engine-kind",
        default="vllm",
        help="sim engine kinds, a comma list cycled over engines (vllm, sglang, llamacpp, mlx, trtllm)",
    )
    p.add_argument("--kv-tokens-per-engine", type=int, default=300_000, help="used to scale shared-prefix groups")
    p.add_argument("--model", default="sim-qwen3-32b", help="served model name")
    p.add_argument(
        "--tokenizer",
        default=str(SMOLLM2_TOKENIZER),
        help="tokenizer.json shared by the sim and Cognitora (default SmolLM2's), or 'builtin'",
    )
    p.add_argument("--stream-chunk-tokens", type=int, default=32, help="tokens per SSE chunk from the sim")
    p.add_argument("--request-timeout", type=float, default=600.0, help="engine seconds")
    p.add_argument(
        "--drain",
        type=float,
        default=180.0,
        help="engine seconds to wait for requests still running after the last one was sent; then they are cut",
    )
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-itl", type=float, default=0.100)
    p.add_argument("--seed", type=int, default=20251130)
    p.add_argument("--out", help="output prefix (default bench/results/side_by_side_<workload>)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p.parse_args(list(argv))
