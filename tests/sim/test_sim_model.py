"""The simulated engine's pure parts: vLLM block hashing, the paged prefix cache, the scheduler, the step model."""

from __future__ import annotations

import pytest

from cognitora_sim.block_hash import BlockHasher, cbor_encode, event_hash, none_hash
from cognitora_sim.kv_cache import AllBlocksCleared, BlockRemoved, BlockStored, BlockTable, OutOfBlocks, PrefixCache
from cognitora_sim.profiles import PROFILES, get_profile, predicted_itl, predicted_ttft, profiles_for_fleet
from cognitora_sim.scheduler import Scheduler, SimRequest
from cognitora_sim.tokenizer import BuiltinTokenizer, HFSimTokenizer
from kvstate.prompt import prompt_token_ids, read_prompt


def test_none_hash_matches_vllm_sha256_cbor_with_seed_42() -> None:
    assert none_hash("42").hex() == "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780"


def test_block_hashes_match_vllm_test_vector() -> None:
    digests: list[bytes] = []
    BlockHasher(16, seed="42").extend(digests, list(range(32)))
    assert [event_hash(d) for d in digests] == [2863503375995570957, 13957787785847563040]


def test_partial_block_gets_no_hash_and_extend_is_incremental() -> None:
    hasher = BlockHasher(16)
    digests: list[bytes] = []
    hasher.extend(digests, list(range(31)))
    assert len(digests) == 1
    hasher.extend(digests, list(range(40)))
    again: list[bytes] = []
    hasher.extend(again, list(range(40)))
    assert digests == again and len(digests) == 2


def test_cbor_uses_shortest_heads() -> None:
    assert cbor_encode(23) == b"\x17"
    assert cbor_encode(24) == b"\x18\x18"
    assert cbor_encode(70000) == b"\x1a\x00\x01\x11\x70"
    assert cbor_encode((b"ab", [1], None)) == b"\x83\x42ab\x81\x01\xf6"


def _cache_with(num_blocks: int) -> PrefixCache:
    return PrefixCache(num_blocks, 4)


def test_full_blocks_are_stored_with_parent_and_their_own_tokens_only() -> None:
    cache = _cache_with(8)
    t = BlockTable()
    cache.allocate(t, 3)
    cache.commit_full(t, 0, [11], [1, 2, 3, 4], None)
    cache.commit_full(t, 1, [12, 13], [5, 6, 7, 8, 9, 10, 11, 12], 11)
    assert cache.drain() == [BlockStored([11], None, [1, 2, 3, 4], 4), BlockStored([12, 13], 11, list(range(5, 13)), 4)]


def test_lru_evicts_unreferenced_blocks_tail_first() -> None:
    cache = _cache_with(4)
    a = BlockTable()
    cache.allocate(a, 4)
    cache.commit_full(a, 0, [1, 2, 3, 4], list(range(16)), None)
    cache.free(a)
    assert cache.free_blocks == 4 and cache.cached_blocks == 4
    cache.drain()
    b = BlockTable()
    cache.allocate(b, 2)
    assert cache.drain() == [BlockRemoved([4, 3])]  # the sequence's tail goes first, its prefix survives
    assert cache.longest_prefix([1, 2, 3]) == 2


def test_referenced_blocks_are_never_evicted() -> None:
    cache = _cache_with(3)
    a = BlockTable()
    cache.allocate(a, 2)
    cache.commit_full(a, 0, [1, 2], list(range(8)), None)
    b = BlockTable()
    cache.allocate(b, 1)
    with pytest.raises(OutOfBlocks):
        cache.allocate(b, 1)
    cache.free(a)
    cache.allocate(b, 1)
    assert isinstance(cache.drain()[-1], BlockRemoved)


def test_duplicate_block_is_shared_not_announced_twice() -> None:
    cache = _cache_with(4)
    a, b = BlockTable(), BlockTable()
    cache.allocate(a, 1)
    cache.allocate(b, 1)
    cache.commit_full(a, 0, [7], [1, 2, 3, 4], None)
    cache.commit_full(b, 0, [7], [1, 2, 3, 4], None)
    assert cache.drain() == [BlockStored([7], None, [1, 2, 3, 4], 4)]
    assert cache.used_blocks == 1 and cache.refs[7] == 2


def test_reset_announces_all_blocks_cleared_and_forgets_hashes() -> None:
    cache = _cache_with(4)
    a = BlockTable()
    cache.allocate(a, 2)
    cache.commit_full(a, 0, [1], [1, 2, 3, 4], None)
    cache.drain()
    cache.reset([a])
    assert cache.drain() == [AllBlocksCleared()]
    assert cache.cached_blocks == 0 and cache.used_blocks == 2
    cache.free(a)
    assert cache.used_blocks == 0


def _scheduler(blocks: int, *, seqs: int = 8, budget: int = 64) -> Scheduler:
    cache = PrefixCache(blocks, 4)
    return Scheduler(cache, BlockHasher(4), [(900, " x")], max_num_seqs=seqs, max_num_batched_tokens=budget)


def _req(tokens: list[int], max_tokens: int = 2) -> SimRequest:
    return SimRequest(rid="r", tokens=list(tokens), prompt_len=len(tokens), max_tokens=max_tokens, arrival=0.0)


def _run(s: Scheduler, req: SimRequest) -> None:
    s.add(req)
    t = 0.0
    while not req.finished:
        step = s.schedule()
        t += 1
        s.commit(step, t)


def test_prefix_hit_never_covers_the_whole_prompt() -> None:
    s = _scheduler(32)
    _run(s, _req(list(range(8))))
    again = _req(list(range(8)))
    _run(s, again)
    assert again.cached_tokens == 4  # 2 full blocks cached, but one token must be computed: 1 block reused


def test_chunked_prefill_respects_the_token_budget() -> None:
    s = _scheduler(64, budget=10)
    req = _req(list(range(25)), max_tokens=1)
    s.add(req)
    sizes = []
    while not req.finished:
        step = s.schedule()
        sizes.append(step.batched_tokens)
        s.commit(step, 1.0)
    assert sizes == [10, 10, 5]


def test_decode_filled_blocks_are_cached() -> None:
    s = _scheduler(32)
    req = _req([1, 2, 3], max_tokens=6)
    _run(s, req)
    stored = [e for e in s.cache.drain() if isinstance(e, BlockStored)]
    tokens = [t for e in stored for t in e.token_ids]
    assert tokens == req.tokens[:8]  # prompt + generated tokens, full blocks only (the last token has no KV)


def test_full_kv_preempts_the_newest_running_request() -> None:
    s = _scheduler(6, budget=64)
    first, second = _req(list(range(100, 108)), 8), _req(list(range(200, 208)), 8)
    first.rid, second.rid = "first", "second"
    s.add(first)
    s.add(second)
    t = 0.0
    while not (first.finished and second.finished):
        t += 1
        s.commit(s.schedule(), t)
    assert s.preemptions >= 1 and second.preemptions >= 1 and first.preemptions == 0


def test_max_num_seqs_queues_the_rest() -> None:
    s = _scheduler(64, seqs=2)
    for i in range(3):
        s.add(_req([i] * 5))
    s.schedule()
    assert len(s.running) == 2 and len(s.waiting) == 1


def test_step_model_shapes() -> None:
    h100 = get_profile("h100")
    assert predicted_itl(h100, 64, 1000) > predicted_itl(h100, 1, 1000)
    assert predicted_itl(h100, 8, 1000) < 1.3 * predicted_itl(h100, 1, 1000)  # memory bound: batching is cheap
    assert predicted_ttft(h100, 8000) > 5 * predicted_ttft(h100, 1000) > 0
    assert predicted_ttft(get_profile("mac"), 1000) > 10 * predicted_ttft(h100, 1000)
    assert [p.name for p in profiles_for_fleet("h100, mac", 3)] == ["h100", "mac", "h100"]
    with pytest.raises(ValueError, match="unknown profile"):
        profiles_for_fleet("h100,tpu", 2)
    assert set(PROFILES) >= {"h100", "h100x2", "mac"}


def test_builtin_tokenizer_is_deterministic_and_chat_uses_chatml() -> None:
    tok = BuiltinTokenizer()
    assert tok.encode("hello world") == tok.encode("hello world")
    (ids,) = prompt_token_ids(tok, read_prompt(messages=[{"role": "user", "content": "hi"}]))
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1
    assert prompt_token_ids(tok, read_prompt(prompt=[5, 6])) == [[5, 6]]
    for token_id, text in tok.output_vocabulary():
        assert tok.encode(text) == [token_id]


def test_hf_tokenizer_output_words_round_trip(smollm2_dir) -> None:  # type: ignore[no-untyped-def]
    tok = HFSimTokenizer(smollm2_dir / "tokenizer.json")
    vocab = tok.output_vocabulary()
    assert len(vocab) > 50
    for token_id, text in vocab[:20]:
        assert tok.encode(text) == [token_id]


def test_legacy_and_map_event_encodings_follow_engines_md() -> None:
    import msgpack

    from cognitora_sim.kv_events import encode_batch

    events = [BlockStored([11], None, list(range(16)), 16), BlockRemoved([11]), AllBlocksCleared()]
    new = msgpack.unpackb(encode_batch(1.5, events, 0, legacy=False), raw=False)
    assert new[0] == 1.5 and new[2] == 0
    assert new[1][0] == {
        "type": "BlockStored",
        "block_hashes": [11],
        "parent_block_hash": None,
        "token_ids": list(range(16)),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    assert new[1][1:] == [{"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}, {"type": "AllBlocksCleared"}]
    old = msgpack.unpackb(encode_batch(1.5, events, 0, legacy=True), raw=False)
    assert old[1] == [
        ["BlockStored", [11], None, list(range(16)), 16, None, "GPU", None],
        ["BlockRemoved", [11], "GPU"],
        ["AllBlocksCleared"],
    ]


def test_energy_meter_integrates_steps_and_idle_and_reports_one_second_averages() -> None:
    from cognitora_sim.power import EnergyMeter

    meter = EnergyMeter(idle_watts=100.0, start=0.0)
    meter.add_step(1.0, 1.5, 500.0)  # idle 1 s, then half a second at 500 W
    assert meter.energy_joules(1.5) == pytest.approx(100 + 250)
    assert meter.energy_joules(3.0) == pytest.approx(350 + 150)  # idle afterwards
    assert meter.watts(1.5) == pytest.approx((0.5 * 100 + 0.5 * 500) / 1.0)
    assert meter.utilization(1.5) == pytest.approx(0.5)
    assert meter.watts(5.0) == pytest.approx(100.0) and meter.utilization(5.0) == 0.0


def test_fast_block_hash_path_matches_the_generic_cbor_encoding() -> None:
    import hashlib

    from cognitora_sim.block_hash import hash_block

    parent = none_hash()
    for tokens in ([0, 23, 24, 255, 256, 65535] * 3, [70000, 1, 2]):
        generic = hashlib.sha256(cbor_encode((parent, tuple(tokens), None))).digest()
        assert hash_block(parent, tokens) == generic


def test_a_request_never_joins_a_step_that_started_before_it_arrived() -> None:
    s = _scheduler(64)
    early, late = _req([1, 2, 3]), _req([4, 5, 6])
    late.arrival = 5.0
    s.add(early)
    s.add(late)
    step = s.schedule(now=1.0)
    assert [r for r, _ in step.work] == [early] and list(s.waiting) == [late]
    assert late in [r for r, _ in s.schedule(now=5.0).work]


def test_public_api() -> None:
    import cognitora_sim as sim

    assert sorted(sim.__all__) == ["HardwareProfile", "PROFILES", "SimFleet", "start_fleet"]
    assert all(hasattr(sim, name) for name in sim.__all__)
