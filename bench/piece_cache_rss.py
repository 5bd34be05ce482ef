"""Prompt keying's memory and cost alone, outside any gateway: what the tokenizer's piece cache
(``limits.tokenizer_cache_bytes``, bounded) holds, how often it hits, and what its admission policy costs.

    python -m bench.piece_cache_rss                                   # soak-like chats, pieces seen once on probation
    python -m bench.piece_cache_rss --admission first                 # every new piece cached at once (before)
    python -m bench.piece_cache_rss --workload multi-turn-chat        # prompts that do recur
    python -m bench.piece_cache_rss --cache-bytes 0                   # no cache

``--workload soak`` is the soak's load (bench/soak.py): each user message new (a conversation of 20, a shared text, a
question number). ``b2b-saas`` and ``multi-turn-chat`` are bench.workloads' schedules (one of 150 system prompts
and a question; ``--users`` users, by default ``--chats`` / 8 in 8-turn chats, each turn resending the whole
history; a user's next turn comes ``--users`` prompts later), in arrival order.
Every ``--every`` prompts: RSS, the cache's accounted bytes, and over those prompts the share of characters found
cached (``ChatTokenizer.uncached_chars`` before each prompt) and the CPU time keying took
(bench/results/memory_growth.md).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from collections.abc import Iterator

from bench.workloads import B2B_SAAS, MultiTurnProfile, Stage, TextBank, multi_turn_schedule, shared_prefix_schedule
from cognitora_sim.tokenizer import SMOLLM2_DIR
from kvstate.prompt import PIECE_CACHE_BYTES, PROBATION_SHARE, ChatPrompt, ChatTokenizer, Message, PromptKeyer

WORKLOADS = ("soak", "b2b-saas", "multi-turn-chat")
TURNS = 8
"""Turns of each multi-turn chat."""


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def chats(workload: str, n: int, users: int | None = None) -> Iterator[list[Message]]:
    """``n`` chats of ``workload``, in arrival order (``users``: multi-turn-chat's, default ``n / TURNS``)."""
    if workload == "soak":
        rng = random.Random(1)
        for i in range(1, n + 1):
            text = f"conversation {rng.randrange(20)}: " + "shared system context " * 20 + f"question {i}"
            yield [{"role": "user", "content": text}]
        return
    # A long enough stage at 1 request a second yields n arrivals or more (Poisson); the surplus is not keyed.
    stages = [Stage("all", 1.0, n * 1.2 + 100)]
    if workload == "b2b-saas":
        schedule = shared_prefix_schedule(B2B_SAAS, stages)
    else:
        # As many users as make each one's chat TURNS turns long (the profile's 32 would grow histories without end);
        # fewer users come back sooner (a user's next turn is ``users`` prompts later) and chat for longer.
        per_group = max(1, (users or n // TURNS) // MultiTurnProfile.groups)
        schedule = multi_turn_schedule(MultiTurnProfile(users_per_group=per_group), stages)
    bank = TextBank(schedule.params["seed"])
    for request in schedule.requests[:n]:
        yield [{"role": m.role, "content": bank.text(m.segments)} for m in request.messages]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-bytes", type=int, default=PIECE_CACHE_BYTES)
    p.add_argument(
        "--admission",
        choices=("first", "second"),
        default="second",
        help="first: a piece enters the cache when first seen; second (the default): on probation until seen again",
    )
    p.add_argument(
        "--probation-share",
        type=float,
        default=PROBATION_SHARE,
        help="with --admission second: the cache's share for pieces seen once (limits.tokenizer_cache_probation_share)",
    )
    p.add_argument("--workload", choices=WORKLOADS, default="soak")
    p.add_argument("--chats", type=int, default=30_000)
    p.add_argument("--users", type=int, default=None, help=f"multi-turn-chat's users (default chats / {TURNS})")
    p.add_argument("--every", type=int, default=5_000)
    args = p.parse_args(argv)
    tokenizer = ChatTokenizer(
        SMOLLM2_DIR / "tokenizer.json",
        cache_bytes=args.cache_bytes,
        probation_share=args.probation_share if args.admission == "second" else 0.0,
    )
    keyer = PromptKeyer("smollm2", 16, tokenizer)
    chars = missed = 0  # since the last line
    cpu = 0.0
    for i, messages in enumerate(chats(args.workload, args.chats, args.users), start=1):
        prompt = ChatPrompt(messages)
        text = tokenizer.render_chat(prompt)
        chars += len(text)
        missed += tokenizer.uncached_chars(text)
        started = time.process_time()
        keyer.keys(prompt)
        cpu += time.process_time() - started
        if i % args.every == 0:
            gc.collect()
            cached = tokenizer.cached_bytes / 2**20
            print(
                f"{i} chats: RSS {rss_mib():.1f} MiB, piece cache {cached:.1f} MiB; over the last {args.every}: "
                f"characters found cached {1 - missed / chars:.1%}, keying CPU {cpu / args.every * 1e3:.3f} ms a chat",
                flush=True,
            )
            chars = missed = 0
            cpu = 0.0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
