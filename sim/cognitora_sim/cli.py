"""``cognitora sim fleet|engine|cloud``: run simulated vLLM engines, or a simulated cloud provider (docs/sim.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys

import prometheus_client

from cognitora import jsonlog
from cognitora_sim.disagg import DEFAULT_LINK, ROLES, SIM_KV_BYTES_PER_TOKEN, KvLink
from cognitora_sim.engine import EngineConfig
from cognitora_sim.engine_kinds import KINDS, UnknownEngineKindError, kinds_for_fleet
from cognitora_sim.fleet import Fleet, PdSettings, serve
from cognitora_sim.profiles import PROFILES, UnknownProfileError, profiles_for_fleet
from cognitora_sim.tokenizer import BUILTIN, DEFAULT_TOKENIZER, load_tokenizer


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="served model name (requests naming another get 404)")
    p.add_argument(
        "--profile",
        default="h100",
        help=f"hardware profile, or a comma list cycled over engines; one of {', '.join(PROFILES)}",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="engine time runs X times faster than wall time (10 = ten times faster than real)",
    )
    p.add_argument(
        "--kv-capacity-tokens",
        default=None,
        help="KV cache size in tokens per engine, or a comma list cycled over engines (default: the profile's)",
    )
    p.add_argument(
        "--engine-kind",
        default="vllm",
        help=f"what each engine shows (routes, metric names, events), or a comma list cycled over engines; one of "
        f"{', '.join(KINDS)}",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--cpu-offload-tokens",
        type=int,
        default=0,
        help="vLLM engines: a CPU offload tier of this many tokens (its events carry medium CPU); default none",
    )
    p.add_argument("--cpu-offload-gb-per-s", type=float, default=25.0, help="reload bandwidth of that tier (GB/s)")
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help="a HuggingFace tokenizer.json (chat template read from beside it), the id of a model whose tokenizer "
        f"ships with Cognitora, or '{BUILTIN}' (no files; a router cannot match it token for token); "
        f"default: {DEFAULT_TOKENIZER}, the model the examples name",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated text")
    p.add_argument(
        "--events-base-port",
        type=int,
        default=None,
        help="engine i publishes KV events on Q+2i and serves replay on Q+2i+1 (default: no events)",
    )
    p.add_argument(
        "--legacy-events",
        action="store_true",
        help="encode events as tagged arrays (vLLM before #42892) instead of maps",
    )
    p.add_argument(
        "--stream-chunk-tokens",
        type=int,
        default=1,
        help="tokens per SSE chunk (higher = cheaper simulation, coarser streaming)",
    )
    p.add_argument(
        "--default-max-tokens", type=int, default=128, help="completion length when a request gives no max_tokens"
    )
    p.add_argument("--max-num-seqs", type=int, default=None, help="sequences per batch (default: the profile's)")
    p.add_argument(
        "--disable-scale-out",
        action="store_true",
        help="answer the /render routes 403, as vLLM 0.32 does without --enable-scale-out (default: served)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget of one step, i.e. the prefill chunk (default: the profile's)",
    )
    p.add_argument("--accept-any-model", action="store_true", help="serve any requested model name")
    p.add_argument(
        "--responses-store",
        action="store_true",
        help="keep Responses answers for previous_response_id (vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1)",
    )
    p.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help="fleet admin listener for faults (POST /sim/fault {engine, kind}) and GET /sim/state",
    )
    p.add_argument(
        "--roles",
        default="both",
        help="prefill/decode role per engine, a comma list cycled over engines: both, prefill, decode (default both)",
    )
    p.add_argument(
        "--link-gbps", type=float, default=None, help="KV link bandwidth of every P/D pair (default: by profile pair)"
    )
    p.add_argument("--link-latency-ms", type=float, default=None, help="KV link latency of every P/D pair")
    p.add_argument("--kv-bytes-per-token", type=int, default=SIM_KV_BYTES_PER_TOKEN, help="KV size of one token")
    p.add_argument(
        "--kv-transfer-timeout-s", type=float, default=10.0, help="a decode engine waits this long for its KV (wall s)"
    )
    p.add_argument("--kv-park-s", type=float, default=30.0, help="a prefill engine keeps KV for its decode this long")
    p.add_argument("--log-level", default="WARNING")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cognitora sim", description="simulated engines (vLLM, SGLang, llama.cpp, MLX-LM, TensorRT-LLM)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fleet = sub.add_parser("fleet", help="N engines in one process on ports P..P+N-1")
    fleet.add_argument("--engines", type=int, required=True)
    fleet.add_argument("--base-port", type=int, required=True)
    fleet.add_argument(
        "--host-cores",
        type=int,
        default=None,
        help="the engines share a host of this many cores: while k of them are busy, each step takes max(1, k/N) "
        "times as long (processor sharing, cognitora_sim.host_cores); default: each engine has its own",
    )
    _add_common(fleet)
    sub.add_parser("cloud", help="a simulated cloud provider (`cognitora sim cloud --help`)", add_help=False)
    engine = sub.add_parser("engine", help="one engine")
    engine.add_argument("--port", type=int, required=True)
    _add_common(engine)
    return parser


def main(argv: list[str]) -> int:
    if argv[:1] == ["cloud"]:  # a provider, not engines: its own options (cognitora_sim.cloud)
        from cognitora_sim import cloud

        return cloud.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    jsonlog.configure(args.log_level)
    prometheus_client.disable_created_metrics()  # vLLM exposes no *_created series
    n = args.engines if args.command == "fleet" else 1
    base_port = args.base_port if args.command == "fleet" else args.port
    if n < 1:
        parser.error("--engines must be at least 1")
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive")
    host_cores = getattr(args, "host_cores", None)  # fleet only
    if host_cores is not None and host_cores < 1:
        parser.error("--host-cores must be at least 1")
    if args.block_size < 1:
        parser.error("--block-size must be at least 1")
    if args.cpu_offload_tokens < 0 or args.cpu_offload_gb_per_s <= 0:
        parser.error("--cpu-offload-tokens must be 0 or more and --cpu-offload-gb-per-s positive")
    if args.stream_chunk_tokens < 1:
        parser.error("--stream-chunk-tokens must be at least 1")
    for flag in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    capacities: list[int | None] = [None]
    if args.kv_capacity_tokens is not None:
        try:
            capacities = [int(x) for x in str(args.kv_capacity_tokens).split(",") if x.strip()]
        except ValueError:
            parser.error(
                f"--kv-capacity-tokens takes integers, e.g. 400000 or 1024,4096; got {args.kv_capacity_tokens}"
            )
        if not capacities or min(c for c in capacities if c is not None) < args.block_size:
            parser.error("--kv-capacity-tokens must hold at least one block")
    try:
        profiles = profiles_for_fleet(args.profile, n)
        kinds = kinds_for_fleet(args.engine_kind, n)
        tokenizer = load_tokenizer(args.tokenizer)
    except (UnknownProfileError, UnknownEngineKindError, FileNotFoundError) as exc:
        parser.error(str(exc))
    configs = [
        EngineConfig(
            index=i,
            port=base_port + i,
            model=args.model,
            profile=profiles[i],
            block_size=args.block_size,
            kv_capacity_tokens=capacities[i % len(capacities)],
            events_port=None if args.events_base_port is None else args.events_base_port + 2 * i,
            replay_port=None if args.events_base_port is None else args.events_base_port + 2 * i + 1,
            legacy_events=args.legacy_events,
            stream_chunk_tokens=args.stream_chunk_tokens,
            seed=args.seed,
            default_max_tokens=args.default_max_tokens,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            engine_kind=kinds[i],
            cpu_offload_tokens=args.cpu_offload_tokens if kinds[i] == "vllm" else 0,
            cpu_offload_gb_per_s=args.cpu_offload_gb_per_s,
            responses_store=args.responses_store,
            scale_out=not args.disable_scale_out,
        )
        for i in range(n)
    ]
    roles = tuple(r.strip() for r in str(args.roles).split(",") if r.strip())
    if not roles or any(r not in ROLES for r in roles):
        parser.error(f"--roles takes a comma list of {', '.join(ROLES)}; got {args.roles!r}")
    if (args.link_gbps is not None and args.link_gbps <= 0) or (args.link_latency_ms or 0) < 0:
        parser.error("--link-gbps must be positive and --link-latency-ms at least 0")
    link = None
    if args.link_gbps is not None or args.link_latency_ms is not None:
        link = KvLink(
            gbps=args.link_gbps or DEFAULT_LINK.gbps,
            latency_s=DEFAULT_LINK.latency_s if args.link_latency_ms is None else args.link_latency_ms / 1000,
        )
    pd = PdSettings(roles, link, args.kv_bytes_per_token, args.kv_park_s, args.kv_transfer_timeout_s)
    fleet = Fleet(
        configs,
        tokenizer,
        args.time_scale,
        accept_any_model=args.accept_any_model,
        admin_port=args.admin_port,
        pd=pd,
        host_cores=host_cores,
    )
    try:
        import uvloop  # optional: a cheaper event loop when installed
    except ImportError:
        return asyncio.run(serve(fleet))
    return uvloop.run(serve(fleet))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
