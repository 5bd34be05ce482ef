"""Router benchmark: what one placement costs a gateway, end to end and by part.

    .venv/bin/python -m bench.router_bench --redis-url redis://127.0.0.1:6379/0

For 2k- and 8k-token chats (SmolLM2 tokenizer and chat template, block size 16) over a model with 16 endpoints, 4
of which hold the chat's system prompt and 1 the whole chat:

- ``Router.place`` end to end (keys + the three store reads + placement), on ``MemoryStore`` and ``RedisStore``;
- ``placement.place`` alone (the pure decision, state already fetched).

Same run, same machine: compare rows with each other, not with other machines. Writes
``<out>/router_bench.md``. Redis keys go under a fresh prefix, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.placement import FleetState, place
from cognitora.request import RouteRequest
from cognitora.router import Router
from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer, PromptKeyer
from kvstate.redis_store import RedisStore
from kvstate.store import Store

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct"
MODEL = "smollm2"
ENDPOINTS = [f"10.0.0.{i}:8000" for i in range(1, 17)]


def make_config() -> CognitoraConfig:
    return config_from_dict(
        {
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(SMOLLM2 / "tokenizer.json"),
                    "endpoints": [{"url": f"http://{e}"} for e in ENDPOINTS],
                }
            ],
            "placement": {"store_timeout_s": 5.0},
        }
    )


def chat(tokens: int) -> RouteRequest:
    # ~1.2 tokens per word of this text with the SmolLM2 tokenizer; the exact count is printed
    system = " ".join(f"Rule {i}: answer carefully, cite the section, keep it short." for i in range(tokens // 14))
    return RouteRequest(
        model=MODEL,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Which rule covers refunds?"}],
    )


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    for _ in range(min(20, n)):
        await fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def row(name: str, samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100)
    return f"| {name} | {len(samples)} | {q[49]:.2f} | {q[89]:.2f} | {q[98]:.2f} |"


async def seed(store: Store, router: Router, req: RouteRequest) -> None:
    keys = list((await router.place(req)).keys)
    system_part = keys[: max(1, len(keys) - 2)]
    for e in ENDPOINTS[:4]:
        await store.add_blocks(MODEL, e, system_part)
    await store.add_blocks(MODEL, ENDPOINTS[4], keys)


async def bench_router(config: CognitoraConfig, store: Store, name: str, req: RouteRequest, n: int) -> str:
    router = Router(config, store)
    await seed(store, router, req)
    decision = await router.place(req)
    assert decision.endpoint == ENDPOINTS[4] and not decision.degraded, decision.explain()
    label = f"Router.place, {name}, {decision.prompt_tokens} tokens / {len(decision.keys)} keys"
    return row(label, await timed(lambda: router.place(req), n))


async def bench_pure(config: CognitoraConfig, store: Store, req: RouteRequest, n: int) -> str:
    """The pure decision over the state the router would fetch (from the seeded memory store)."""
    keyer = PromptKeyer(MODEL, 16, ChatTokenizer(SMOLLM2 / "tokenizer.json"))
    prompt = keyer.keys_for_chat(req.messages or [])
    state = FleetState(
        now=time.time(),
        matches=await store.match_prefix(MODEL, prompt.keys, ENDPOINTS),
        inflight=await store.inflight(ENDPOINTS),
    )

    async def pure() -> None:
        place(req, prompt, config, state)

    return row(f"placement.place only, 16 endpoints, {prompt.prompt_tokens} tokens", await timed(pure, n))


async def run(redis_url: str, n: int) -> list[str]:
    config = make_config()
    lines = [
        "| what | n | p50 ms | p90 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    prefix = f"routerbench-{uuid.uuid4().hex[:8]}"
    backends: list[tuple[str, Store]] = [
        ("memory", MemoryStore()),
        ("redis", RedisStore.from_url(redis_url, key_prefix=prefix)),
    ]
    try:
        for tokens in (2048, 8192):
            req = chat(tokens)
            for name, store in backends:
                lines.append(await bench_router(config, store, name, req, n))
            lines.append(await bench_pure(config, backends[0][1], req, n))
    finally:
        redis_store = backends[1][1]
        assert isinstance(redis_store, RedisStore)
        await redis_store.delete_everything()
        await redis_store.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("-n", type=int, default=500, help="samples per row")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    lines = asyncio.run(run(args.redis_url, args.n))
    text = "\n".join(
        [
            "# Router benchmark",
            "",
            f"Command: `.venv/bin/python -m bench.router_bench --redis-url {args.redis_url} -n {args.n}`",
            "",
            "Machine shared with other jobs while running: compare rows with each other.",
            "",
            *lines,
            "",
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router_bench.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
