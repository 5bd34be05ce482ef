"""The hit-rate yardsticks of a finite fleet (bench/capacity_bound.py): Belady's MIN and one pooled LRU cache."""

from __future__ import annotations

import pytest

from bench.capacity_bound import capacity_bounds, request_blocks
from bench.workloads import (
    BenchRequest,
    MessageSpec,
    MultiTurnProfile,
    Segment,
    annotate_reuse,
    ladder,
    multi_turn_schedule,
)


def request(index: int, *segments: tuple[str, int]) -> BenchRequest:
    return BenchRequest(
        index=index,
        arrival_s=float(index),
        stage="s",
        api="chat",
        messages=(MessageSpec("user", tuple(Segment(n, t) for n, t in segments)),),
        max_tokens=8,
        session=f"r{index}",
    )


def test_a_prefix_evicted_by_lru_between_its_uses_is_still_within_the_capacity_bound() -> None:
    # Four blocks of cache. P (2 blocks), then Q (3 blocks) pushes P's tail out of an LRU cache (P's head was
    # touched last), then P again: LRU serves its first block only; MIN evicts one of Q's never-reused blocks.
    reqs = [request(0, ("p", 32)), request(1, ("q", 48)), request(2, ("p", 32))]
    annotate_reuse(reqs)
    bound = capacity_bounds(reqs, kv_tokens=64, block_tokens=16)
    assert bound.capacity["s"] == pytest.approx(32 / 112)  # = the unlimited reuse bound here
    assert bound.pooled_lru["s"] == pytest.approx(16 / 112)
    assert sum(r.reusable_tokens for r in reqs) / sum(r.prompt_tokens for r in reqs) == pytest.approx(32 / 112)


def test_blocks_are_shared_exactly_as_far_as_the_prompts_agree() -> None:
    # "a" used for 40 tokens then 24: a shorter use of a name is a prefix of a longer one, so one block is shared;
    # after a different first segment, the same second segment is a different block.
    first = request_blocks(request(0, ("a", 40), ("b", 32)), 16)
    shorter = request_blocks(request(1, ("a", 24)), 16)
    other_head = request_blocks(request(2, ("c", 40), ("b", 32)), 16)
    assert len(first) == 4 and len(shorter) == 1 and len(other_head) == 4
    assert shorter[0] == first[0]
    assert not set(other_head) & set(first)


def test_with_room_for_everything_both_reach_the_reuse_bound_and_min_never_trails_lru() -> None:
    schedule = multi_turn_schedule(MultiTurnProfile(), ladder([4.0], 40.0), seed=3)
    total = sum(r.prompt_tokens for r in schedule.requests)
    unlimited = capacity_bounds(schedule.requests, kv_tokens=10**9, block_tokens=16)
    # whole blocks only: at most one partial block per request below the token-exact bound
    slack = 16 * len(schedule.requests) / total
    bound = schedule.reuse_bound("4 rps")
    assert bound - slack <= unlimited.capacity["4 rps"] <= bound + 1e-9
    assert unlimited.pooled_lru["4 rps"] == pytest.approx(unlimited.capacity["4 rps"])
    tight = capacity_bounds(schedule.requests, kv_tokens=20_000, block_tokens=16)
    assert tight.pooled_lru["4 rps"] < unlimited.pooled_lru["4 rps"]
    assert tight.capacity["4 rps"] >= tight.pooled_lru["4 rps"]


def test_a_cache_without_room_is_refused_with_what_was_given() -> None:
    with pytest.raises(ValueError, match="kv_tokens and block_tokens must be positive, got 0 and 16"):
        capacity_bounds([request(0, ("p", 32))], kv_tokens=0)
