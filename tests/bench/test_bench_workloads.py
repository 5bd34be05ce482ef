"""Benchmark workloads: exact prompt lengths, the reuse bound, Mooncake hash_ids expansion."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.workloads import (
    B2B_SAAS,
    VOCAB,
    BenchRequest,
    MessageSpec,
    MultiTurnProfile,
    Segment,
    TextBank,
    TraceError,
    annotate_reuse,
    ladder,
    mooncake_schedule,
    multi_turn_schedule,
    shared_prefix_schedule,
)
from kvstate.prompt import ChatTokenizer


def _write_trace(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_every_vocabulary_word_is_one_smollm2_token(smollm2_dir: Path) -> None:
    tok = ChatTokenizer(smollm2_dir / "tokenizer.json")
    assert len(set(VOCAB)) == 1024
    text = " ".join(VOCAB)
    assert len(tok.encode(text)) == len(VOCAB)
    assert all(len(tok.encode(w)) == 1 for w in VOCAB)


def test_b2b_prompts_tokenize_to_intended_lengths(smollm2_dir: Path) -> None:
    tok = ChatTokenizer(smollm2_dir / "tokenizer.json")
    sched = shared_prefix_schedule(B2B_SAAS, ladder([5], 2))
    body = sched.requests[0].body(TextBank(7), "m")
    system, user = body["messages"]
    assert len(tok.encode(system["content"])) == 6000
    assert len(tok.encode(user["content"])) == 1200
    assert body["max_tokens"] == 1000 and body["stream_options"] == {"include_usage": True}


def test_prompts_tokenize_exactly_with_the_sim_builtin_tokenizer() -> None:
    from cognitora_sim import tokenizer as sim_tok  # make test installs the sim: a missing one is a failure, not a skip

    words = random.Random(3).choices(VOCAB, k=777)
    assert len(sim_tok.BuiltinTokenizer().encode(" ".join(words))) == 777


def test_same_segment_name_is_same_text_and_shorter_use_is_a_prefix() -> None:
    bank = TextBank(11)
    assert bank.words("blk:5", 512) == TextBank(11).words("blk:5", 512)
    assert bank.words("blk:5", 100) == bank.words("blk:5", 512)[:100]
    assert bank.words("blk:6", 512) != bank.words("blk:5", 512)


def _req(i: int, *segments: tuple[str, int]) -> BenchRequest:
    msg = MessageSpec("user", tuple(Segment(n, t) for n, t in segments))
    return BenchRequest(i, float(i), "s", "chat", (msg,), 1, "x")


def test_reuse_bound_counts_prefix_seen_earlier_in_arrival_order() -> None:
    reqs = [
        _req(0, ("a", 100), ("b", 50)),  # nothing seen: 0
        _req(1, ("a", 100), ("c", 50)),  # a: 100
        _req(2, ("a", 100), ("b", 50)),  # a + b: 150
        _req(3, ("b", 50), ("a", 100)),  # b is not a prefix of anything yet at the root: 0
        _req(4, ("a", 60)),  # a shorter use of a is a prefix of a: 60
        _req(5, ("a", 100), ("c", 20)),  # a, then c was seen with 50 after a: 20
    ]
    annotate_reuse(reqs)
    assert [r.reusable_tokens for r in reqs] == [0, 100, 150, 0, 60, 120]


def test_reuse_after_a_partial_segment_stops_there() -> None:
    # Request 0 used a for 60 tokens then b; request 1 uses all of a then b: only the 60 shared tokens count,
    # because b followed a different point of a's text.
    reqs = [_req(0, ("a", 60), ("b", 50)), _req(1, ("a", 100), ("b", 50))]
    annotate_reuse(reqs)
    assert reqs[1].reusable_tokens == 60


def test_mooncake_expansion_and_bound_on_a_handmade_trace(tmp_path: Path) -> None:
    trace = _write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": 1024, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 1000, "input_length": 600, "output_length": 0, "hash_ids": [1, 9]},
            {"timestamp": 4000, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]},
        ],
    )
    sched = mooncake_schedule(trace, speed=2.0)
    r = sched.requests
    assert [s.tokens for s in r[0].messages[0].segments] == [512, 512, 76]
    assert [x.prompt_tokens for x in r] == [1100, 1024, 600, 1536]
    assert [x.arrival_s for x in r] == [0.0, 0.25, 0.5, 2.0]
    assert r[2].max_tokens == 1  # output_length 0 still asks for one token
    # Reused: -, blocks 1+2, block 1, blocks 1+2 + the 76 tokens of block 3 seen before.
    assert [x.reusable_tokens for x in r] == [0, 1024, 512, 1100]
    assert sched.reuse_bound() == pytest.approx((1024 + 512 + 1100) / (1100 + 1024 + 600 + 1536))
    # Same hash id -> same text; different hash -> different text.
    bank = TextBank(1)
    body0, body3 = r[0].body(bank, "m"), r[3].body(bank, "m")
    text0, text3 = body0["messages"][0]["content"], body3["messages"][0]["content"]
    assert text3.startswith(text0)
    assert len(text3.split()) == 1536


def test_mooncake_rejects_lines_that_do_not_match_their_block_count(tmp_path: Path) -> None:
    trace = _write_trace(
        tmp_path / "bad.jsonl", [{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1]}]
    )
    with pytest.raises(TraceError, match=r"bad.jsonl:1: 1 hash_ids for input_length 2000"):
        mooncake_schedule(trace)


def test_shared_prefix_stage_bounds_and_multi_turn_reuse() -> None:
    sched = shared_prefix_schedule(B2B_SAAS, ladder([10, 20], 20, warmup_rate=15, warmup_s=20))
    assert sched.stage_labels() == ["warmup", "10 rps", "20 rps"]
    assert not any(r.measured for r in sched.requests if r.stage == "warmup")
    for label in sched.stage_labels():
        assert 0.0 < sched.reuse_bound(label) < 1.0
    # Later stages reuse more: every group's system prompt has been seen.
    assert sched.reuse_bound("20 rps") > sched.reuse_bound("warmup")
    mt = multi_turn_schedule(MultiTurnProfile(groups=1, users_per_group=2), ladder([2], 10))
    # Turn k of a user reuses everything up to and including its previous question.
    later = [r for r in mt.requests if len(r.messages) >= 4]
    assert later and all(r.reusable_tokens >= 1000 + 200 for r in later)


def test_stage_summary_judges_requests_cut_by_the_deadline_on_what_streamed() -> None:
    from bench.loadgen import RequestResult
    from bench.report import Slo, summarize_stage

    def res(i: int, **kw: object) -> RequestResult:
        r = RequestResult(index=i, stage="s", measured=True, arrival_s=float(i), content_tokens=100)
        for k, v in kw.items():
            setattr(r, k, v)
        return r

    results = [
        # finished within the SLO
        res(0, status=200, ttft_s=0.5, itl_s=0.05, e2e_s=10.0, end_s=10.0, prompt_tokens=100, cached_tokens=50,
            completion_tokens=200, tokens_received=200),
        # cut while streaming, pace within the SLO: good
        res(1, status=200, error="not finished", censored=True, ttft_s=1.0, itl_s=0.05, tokens_received=100,
            end_s=20.0),
        # cut before its first token after waiting 30 s: not good, and its wait counts in TTFT
        res(2, status=200, error="not finished", censored=True, ttft_s=30.0, end_s=32.0),
        # refused by the router: not good, no TTFT
        res(3, status=503, error="no endpoint"),
    ]  # fmt: skip
    s = summarize_stage("s", 2.0, 2.0, results, 0.5, Slo(ttft_s=2.0, itl_s=0.1))
    assert (s.requests, s.ok, s.failed) == (4, 1, 3)
    assert s.goodput_rps == pytest.approx(2 / 2.0)
    assert s.ttft_p99 is not None and s.ttft_p99 > 25  # the cut request's wait is not hidden
    assert s.hit_rate == pytest.approx(0.5)
    assert s.output_tps == pytest.approx(300 / (32.0 - 0.0))
