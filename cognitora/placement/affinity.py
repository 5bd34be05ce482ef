"""Prefix affinity: which of several equally good endpoints a request goes to.

When the cost cannot tell candidates apart (predicted TTFTs within the picker's tie band), the choice is made by
rendezvous (highest-random-weight) hashing of a *prefix key* of the prompt: the block key at depth
``min(len(keys), max(affinity_prefix_tokens / tokens_per_key, affinity_prompt_share x len(keys)))``: the prefix
most of the prompt shares with its group, never only the first blocks of a 30k-token prompt (requests that share
nothing but a system prompt would all hash to one engine). Block keys are chained, so that key names the whole
prefix up to it. Hence:

- cold requests sharing a system prompt converge on one endpoint even before any KV event or speculative entry
  exists (a burst placed before the first one is counted in flight included), and build one copy of the prefix;
- different prefixes spread uniformly over the fleet, so no endpoint collects every group's prefix;
- when an endpoint leaves the candidate set, only the prefixes it was chosen for move (the rendezvous property).

A prompt shorter than one block has no key: its request id is hashed instead (a different request, a different
draw).

**Bounded loads** (``within_cache_bound``). The hash is blind to what each engine already holds: with six system
prompts on three idle engines it puts two on each only ~12% of the time, and the engine it gives three fills its KV
cache and evicts, while the others idle (docs/real_engines.md). So the tie-break is bounded-load rendezvous hashing,
after consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
Loads", SODA 2018: a bin already holding ``(1 + eps)`` times the average load is skipped and the key goes to its next
choice). Here the load is how full an engine's prefix cache is, and the bound is relative to the emptiest tied
candidate: one whose cache holds more than ``placement.tie_cache_bound`` of its KV capacity beyond that one's is left
out, and the hash picks among the rest (their order by weight is unchanged, so a key whose first choice is left out
goes to its next). The load is the store's count of the engine's blocks (KV events), carried on its
snapshot; where a tied candidate's count or capacity is not known, the hash alone picks. Requests sharing a prefix
still converge: a candidate holding the prompt's prefix predicts a lower TTFT and is not tied with a cold one.

Everything here is a pure function of its arguments.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from cognitora.decision import CandidateScore
from kvstate.prompt import PromptKeys

__all__ = ["affinity_key", "rendezvous_pick", "within_cache_bound"]


def affinity_key(prompt: PromptKeys, request_id: str, prefix_tokens: int, prompt_share: float = 0.0) -> str:
    """The prompt's prefix key for ``prefix_tokens`` of depth, or ``prompt_share`` of its keys when that is deeper
    (shorter prompts: their last full block)."""
    if not prompt.keys:
        return f"request:{request_id}"
    depth = max(1, prefix_tokens // max(1, prompt.tokens_per_key), math.ceil(prompt_share * len(prompt.keys)))
    return f"prefix:{prompt.keys[min(len(prompt.keys), depth) - 1]}"


def rendezvous_weight(key: str, endpoint: str) -> int:
    """The weight of ``endpoint`` for ``key``: a 64-bit hash of both, uniform and independent per endpoint."""
    digest = hashlib.blake2b(f"{key}\x00{endpoint}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_pick(candidates: Sequence[CandidateScore], key: str) -> CandidateScore:
    """The candidate with the highest rendezvous weight for ``key``; ``candidates`` is non-empty."""
    return max(candidates, key=lambda c: rendezvous_weight(key, c.endpoint))


def within_cache_bound(candidates: Sequence[CandidateScore], bound: float | None) -> list[CandidateScore]:
    """The candidates the hash may pick from: those whose prefix cache holds at most ``bound`` x their KV capacity
    more tokens than the emptiest one's. All of them when ``bound`` is None or any one's count or capacity is not
    known (comparing a known load with an unknown one would favour whichever reads empty). Never empty when
    ``candidates`` is not: the emptiest is always within."""
    if bound is None or len(candidates) < 2:
        return list(candidates)
    held: list[tuple[CandidateScore, float, int]] = []
    for c in candidates:
        if c.cache_held_tokens is None or not c.kv_capacity_tokens:
            return list(candidates)
        held.append((c, c.cache_held_tokens, c.kv_capacity_tokens))
    least = min(tokens for _, tokens, _ in held)
    return [c for c, tokens, capacity in held if tokens - least <= bound * capacity]
