"""Prompt keying's memory alone, outside any gateway: does the tokenizer leak native memory, or is the growth the
piece cache (``limits.tokenizer_cache_bytes``, bounded)? ``--chats`` soak-like chats, each user message new (a
conversation of 20, a shared system text, a question number), through ``PromptKeyer`` with SmolLM2's tokenizer.

    python -m bench.piece_cache_rss                  # the 64 MiB default cache
    python -m bench.piece_cache_rss --cache-bytes 0  # no cache

Prints RSS and the cache's accounted bytes every ``--every`` chats (bench/results/memory_growth.md).
"""

from __future__ import annotations

import argparse
import gc
import os
import random

from cognitora_sim.tokenizer import SMOLLM2_DIR
from kvstate.prompt import PIECE_CACHE_BYTES, ChatPrompt, ChatTokenizer, PromptKeyer


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-bytes", type=int, default=PIECE_CACHE_BYTES)
    p.add_argument("--chats", type=int, default=30_000)
    p.add_argument("--every", type=int, default=5_000)
    args = p.parse_args(argv)
    tokenizer = ChatTokenizer(SMOLLM2_DIR / "tokenizer.json", cache_bytes=args.cache_bytes)
    keyer = PromptKeyer("smollm2", 16, tokenizer)
    rng = random.Random(1)
    for i in range(1, args.chats + 1):
        text = f"conversation {rng.randrange(20)}: " + "shared system context " * 20 + f"question {i}"
        keyer.keys(ChatPrompt([{"role": "user", "content": text}]))
        if i % args.every == 0:
            gc.collect()
            cached = tokenizer.cached_bytes / 2**20
            print(f"{i} chats: RSS {rss_mib():.1f} MiB, piece cache {cached:.1f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
