"""Where a run's hit rate falls short of the reuse bound (bench/hit_gap.py): the engine-attainable ceiling, and each
lost token's cause from the per-request records."""

from __future__ import annotations

from typing import Any

from bench.hit_gap import (
    CAUSES,
    SHIPPED_TIE_CACHE_BOUND,
    attainable,
    even_partitions,
    gap,
    hash_partition,
    partition_hit,
)
from bench.workloads import BenchRequest, MessageSpec, Segment, annotate_reuse

BLOCK = 32
TEMPLATE = 14
"""Chat-template tokens per prompt of SmolLM2's template around one system and one user message."""


def request(index: int, arrival_s: float, group: int, question: int) -> BenchRequest:
    return BenchRequest(
        index=index,
        arrival_s=arrival_s,
        stage="s",
        api="chat",
        messages=(
            MessageSpec("system", (Segment(f"sys:{group}", 1000),)),
            MessageSpec("user", (Segment(f"q:{group}:{question}", 120),)),
        ),
        max_tokens=16,
        session=f"g{group}",
    )


def record(req: BenchRequest, cached: int, ttft_s: float = 0.3, target: str = "t") -> dict[str, Any]:
    return {
        "target": target,
        "index": req.index,
        "status": 200,
        "arrival_s": req.arrival_s,
        "ttft_s": ttft_s,
        "prompt_tokens": req.prompt_tokens + TEMPLATE,
        "content_tokens": req.prompt_tokens,
        "reusable_tokens": req.reusable_tokens,
        "cached_tokens": cached,
    }


def test_the_attainable_hit_is_whole_blocks_of_the_bound_in_engine_tokens() -> None:
    # A repeat of a whole 1,134-token prompt: vLLM computes its last token, so 35 blocks, not 1,120 + 14.
    assert attainable(1134, 1120, 1120, BLOCK) == 1120
    # Only the 1,000-token system prompt reusable: 31 whole blocks of it (with the template's header).
    assert attainable(1134, 1120, 1000, BLOCK) == 992
    assert attainable(1134, 1120, 0, BLOCK) == 0


def test_each_request_below_its_ceiling_is_charged_to_one_cause() -> None:
    schedule = [
        request(0, 0.0, 0, 0),  # first of its group: nothing reusable
        request(1, 10.0, 0, 0),  # a repeat: only the system prompt hit (its question's blocks were gone)
        request(2, 20.0, 0, 1),  # new question, system prompt reusable: went to an engine without it
        request(3, 30.0, 0, 1),  # a repeat, part of the system prompt evicted
        request(4, 40.0, 0, 2),  # new question: sent while ...
        request(5, 40.5, 0, 2),  # ... its twin was still in its prefill (first token at 41 s): nothing cached
        request(6, 50.0, 0, 2),  # a full hit
    ]
    annotate_reuse(schedule)
    cached = {0: 0, 1: 992, 2: 0, 3: 512, 4: 992, 5: 0, 6: 1120}
    records = [record(r, cached[r.index], ttft_s=1.0 if r.index == 4 else 0.3) for r in schedule]
    records.append(record(schedule[1], 1120, target="other"))  # another target's rows are not this one's

    g = gap(schedule, records, "t", "s", BLOCK)

    assert g.requests == 7 and g.cached_tokens == sum(cached.values())
    assert g.missed == {"in flight": 1, "cold": 1, "question tail": 1, "system partial": 1}
    # the twin counts its whole prompt reusable (the bound has no prefill time)
    assert g.lost == {"in flight": 1120, "cold": 992, "question tail": 128, "system partial": 1120 - 512}
    assert set(g.lost) == set(CAUSES)
    # The bound counts content tokens; the ceiling is what engines could serve of it: below the bound.
    assert g.ceiling < g.bound
    assert g.attainable_tokens == sum(cached.values()) + sum(g.lost.values())


def test_three_groups_on_one_engine_evict_their_question_tails_where_two_fit() -> None:
    # Three groups of one repeated question each, in turn: 35 blocks a prompt.
    schedule = [request(i, float(i), group=i % 3, question=0) for i in range(30)]
    for req in schedule[15:]:
        req.stage = "late"
    annotate_reuse(schedule)
    together = {"sys:0": "a", "sys:1": "a", "sys:2": "a"}
    apart = {"sys:0": "a", "sys:1": "b", "sys:2": "c"}
    # 105 blocks fit 128: every repeat hits whole (content tokens: 1,120 of 1,120) however they are split.
    assert partition_hit(schedule, together, "late", 128, BLOCK) == 1.0
    # 70 blocks hold two prompts, not three: together, each request evicts what the next one needs (a cycle longer
    # than the LRU cache); one group per engine, each stays.
    assert partition_hit(schedule, together, "late", 70, BLOCK) < 0.5
    assert partition_hit(schedule, apart, "late", 70, BLOCK) == 1.0


def test_even_partitions_are_every_equal_split_once() -> None:
    splits = even_partitions([f"g{i}" for i in range(6)], 3)
    assert len(splits) == 15  # 6! / (2!^3 * 3!)
    assert all(sorted(list(p.values()).count(e) for e in set(p.values())) == [2, 2, 2] for p in splits)
    assert len({tuple(sorted(p.items())) for p in splits}) == 15
    assert even_partitions(["a", "b", "c"], 2) == []


def test_the_prefix_hash_gave_one_engine_three_groups_and_the_tie_rule_gives_two_each() -> None:
    # The engines of the run before the tie rule and seed 20251130's schedule: the split it measured (one engine
    # served 103-106 of 210 requests) is the hash's; placement's tie rule (the shipped placement.tie_cache_bound,
    # each engine's block count on its snapshot) splits the groups two per engine.
    from bench.real_engines import BLOCK_SIZE, KV_BLOCKS, MODEL, TOKENIZER, schedule_for

    urls = ["http://127.0.0.1:37811", "http://127.0.0.1:48887", "http://127.0.0.1:45431"]
    schedule = schedule_for(20251130, [1, 2, 3], 30, (1, 20)).requests
    hashed = hash_partition(urls, schedule, MODEL, TOKENIZER, BLOCK_SIZE)
    assert sorted(list(hashed.values()).count(e) for e in set(hashed.values())) == [1, 2, 3], hashed
    assert SHIPPED_TIE_CACHE_BOUND == 0.1
    bounded = hash_partition(
        urls, schedule, MODEL, TOKENIZER, BLOCK_SIZE, tie_cache_bound=SHIPPED_TIE_CACHE_BOUND, kv_blocks=KV_BLOCKS
    )
    assert sorted(list(bounded.values()).count(e) for e in set(bounded.values())) == [2, 2, 2], bounded
    # The first group finds every engine empty: the hash alone picks it, as without the rule.
    first = min(schedule, key=lambda r: (r.arrival_s, r.index)).messages[0].segments[0].name
    assert bounded[first] == hashed[first]
    assert partition_hit(schedule, bounded, "3 rps", KV_BLOCKS, BLOCK_SIZE) > partition_hit(
        schedule, hashed, "3 rps", KV_BLOCKS, BLOCK_SIZE
    )
