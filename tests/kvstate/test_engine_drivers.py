"""Each engine kind's driver fed its real wire format, and what the router learns of engines that report nothing.

The bodies below are built byte for byte from ``shared/reference/engines.md`` section 4 (the project never reads
that folder: the bytes are copied here): 4.2 for llama.cpp's ``/slots``, 4.3 for TensorRT-LLM's ``/metrics`` JSON
iteration stats and ``POST /kv_cache_events``, 4.4 for MLX-LM (no metrics, ``cached_tokens`` in responses only).
"""

from __future__ import annotations

import json

import pytest

from cognitora.outcome_rates import WINDOW, OutcomeRates
from cognitora.placement.tier_reload import priced_prefix
from kvstate.engines import ENGINES, llamacpp, trtllm
from kvstate.events import EventDecodeError
from kvstate.events.ingest import EventIngestor
from kvstate.events.model import AllBlocksCleared, BlockRemoved, BlockStored
from kvstate.events.trtllm import decode_events
from kvstate.keys import chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot, PrefixMatch

# -- llama.cpp /slots (engines.md 4.2: per-slot JSON with id, n_ctx, is_processing, params, next_token) ----------
SLOTS_BODY = (
    b'[{"id":0,"id_task":12,"n_ctx":4096,"speculative":false,"is_processing":true,'
    b'"params":{"n_predict":128,"cache_prompt":true},"next_token":{"has_next_token":true,"n_remain":100,'
    b'"n_decoded":28}},'
    b'{"id":1,"id_task":-1,"n_ctx":4096,"speculative":false,"is_processing":false,'
    b'"params":{"n_predict":-1,"cache_prompt":true},"next_token":{"has_next_token":false,"n_remain":-1,'
    b'"n_decoded":0}}]'
)


def test_llamacpp_slots_say_how_many_of_its_slots_are_busy() -> None:
    load = llamacpp.slots_load(SLOTS_BODY)
    assert (load.slots, load.busy, load.free) == (2, 1, 1)
    assert load.n_ctx == 4096  # each slot's context; two slots do not make 8192 (a --kv-unified cache is shared)


@pytest.mark.parametrize(
    ("body", "says"),
    [(b"not json", "not JSON"), (b'{"slots": []}', "JSON list"), (b'[{"id": 0}]', "slot 0")],
)
def test_llamacpp_slots_of_another_shape_say_what_is_wrong(body: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        llamacpp.slots_load(body)


# -- TensorRT-LLM /metrics JSON iteration stats (engines.md 4.3) ------------------------------------------------
ITERATION_STATS_BODY = json.dumps(
    [
        {
            "iter": 41,
            "iterLatencyMS": 12.5,
            "timestamp": "12-01-2026 12:00:00",
            "numActiveRequests": 3,
            "numQueuedRequests": 1,
            "numCompletedRequests": 7,
            "maxNumActiveRequests": 64,
            "gpuMemUsage": 1,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "maxBatchSizeStatic": 64,
            "maxBatchSizeRuntime": 64,
            "maxNumTokensRuntime": 8192,
            "kvCacheStats": {
                "maxNumBlocks": 1000,
                "freeNumBlocks": 600,
                "usedNumBlocks": 400,
                "tokensPerBlock": 32,
                "allocTotalBlocks": 450,
                "allocNewBlocks": 10,
                "reusedBlocks": 20,
                "missedBlocks": 5,
                "cacheHitRate": 0.8,
            },
            "inflightBatchingStats": {
                "numContextRequests": 1,
                "numGenRequests": 2,
                "numPausedRequests": 2,
                "numScheduledRequests": 3,
                "numCtxTokens": 512,
                "avgNumDecodedTokensPerIter": 1.0,
            },
        }
    ]
).encode()


def test_trtllm_iteration_stats_read_as_dynamo_reads_them() -> None:
    load = trtllm.load_from_iteration_stats(ITERATION_STATS_BODY)
    assert load is not None
    assert load.running == 3
    assert load.waiting == 3  # queued 1 + paused 2
    assert load.kv_usage == pytest.approx(0.45)  # allocTotalBlocks / maxNumBlocks
    assert load.block_size == 32


def test_trtllm_iteration_stats_drained_read_is_no_load_and_garbage_is_an_error() -> None:
    assert trtllm.load_from_iteration_stats(b"[]") is None  # a second read, before another iteration
    with pytest.raises(ValueError, match="JSON list"):
        trtllm.load_from_iteration_stats(b'{"iter": 1}')
    # the Prometheus page is what the scraper polls: the JSON one is drained by every read
    assert ENGINES.get("trtllm").metrics_path == "/prometheus/metrics"


# -- TensorRT-LLM POST /kv_cache_events (engines.md 4.3, tensorrt_llm/_utils.py KVCacheEventSerializer) ------------
def _stored_block(block_hash: int, tokens: list[int], level: int = 0) -> dict[str, object]:
    return {
        "type": "stored_block",
        "block_hash": block_hash,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
        "cache_level": level,
        "priority": 35,
    }


TOKENS = list(range(100, 164))  # two 32-token blocks (TRT-LLM's default tokens_per_block)
EVENTS_BODY = json.dumps(
    [
        {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [1000, 4000]}, "window_size": 4096},
        {
            "event_id": 1,
            "data": {
                "type": "stored",
                "parent_hash": None,
                "blocks": [_stored_block(-7, TOKENS[:32]), _stored_block(2**63 + 5, TOKENS[32:])],
            },
            "window_size": 4096,
        },
        {
            "event_id": 2,
            "data": {
                "type": "updated",
                "block_hash": 2**63 + 5,
                "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0},
                "priority": {"type": "event_diff", "new_value": 35, "old_value": 35},
            },
            "window_size": 4096,
        },
        {"event_id": 3, "data": {"type": "removed", "block_hashes": [-7]}, "window_size": 4096},
    ]
).encode()


def test_trtllm_events_decode_to_blocks_with_their_own_hashes_and_cache_levels() -> None:
    batch = decode_events(EVENTS_BODY)
    created, stored, to_cpu, off_gpu, removed = batch.events
    assert isinstance(created, AllBlocksCleared)  # a new cache is empty: what an earlier process held is gone
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == ((-7) & (2**64 - 1), 2**63 + 5)  # TRT-LLM's hashes, as unsigned 64-bit
    assert stored.parent_block_hash is None
    assert stored.token_ids == tuple(TOKENS) and stored.block_size == 32
    assert stored.medium == "GPU"
    # "updated" to cache level 1: the block moved to host memory
    assert isinstance(to_cpu, BlockStored) and to_cpu.token_ids == () and to_cpu.medium == "CPU"
    assert isinstance(off_gpu, BlockRemoved) and off_gpu.medium == "GPU"
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == ((-7) & (2**64 - 1),)


async def test_trtllm_events_index_the_prompt_under_our_keys_with_the_tier_it_moved_to() -> None:
    store = MemoryStore()
    ingest = EventIngestor(store, "m", block_size=32)
    batch = decode_events(EVENTS_BODY)
    ingest.stage("trt:1", type(batch)(batch.ts, batch.events[:4], batch.dp_rank))
    await ingest.flush("trt:1")
    keys = chain_block_keys(root_key("m"), TOKENS, 32)
    match = await store.match_prefix("m", keys)
    # block 0 on the GPU, block 1 only in host memory now: weighted GPU 1.0 + CPU 0.8
    assert match["trt:1"].blocks == 2
    assert match["trt:1"].weighted_blocks == pytest.approx(1.8)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{}", "JSON list"),
        (b'[{"event_id": 1}]', "no 'data'"),
        (b'[{"data": {"type": "stored", "parent_hash": null, "blocks": [{"block_hash": "x", "tokens": []}]}}]', "hash"),
        (b'[{"data": {"type": "removed", "block_hashes": 5}}]', "not a list"),
    ],
)
def test_trtllm_events_of_another_shape_say_what_is_wrong(body: bytes, says: str) -> None:
    with pytest.raises(EventDecodeError, match=says):
        decode_events(body)


# -- MLX-LM and engine: openai: what the router learns from its own attempts (engines.md 4.4) -----------------------
def test_engines_without_metrics_are_never_scraped() -> None:
    assert ENGINES.get("mlx").metrics_path is None
    assert ENGINES.get("openai").metrics_path is None


def test_outcomes_teach_prefill_rate_decode_speed_and_delivered_reuse() -> None:
    rates = OutcomeRates(["mac:1"])
    # 1,000 tokens queued ahead plus 3,000 uncached (4,000 prompt, 1,000 cached) in 2 s: 2,000 tokens/s;
    # 51 tokens, the last 50 in 1 s: 50 tokens/s; the response reused 1,000 of the 2,000 tokens predicted cached
    rates.observe(
        "mac:1",
        queued_prefill_tokens=1000,
        prompt_tokens=4000,
        predicted_cached_tokens=2000,
        cached_tokens=1000,
        ttft_s=2.0,
        completion_tokens=51,
        e2e_s=3.0,
    )
    learned = rates.learned("mac:1")
    assert learned is not None
    assert learned.prefill_tokens_per_s == pytest.approx(2000)
    assert learned.decode_tokens_per_s == pytest.approx(50)
    assert learned.reuse_ratio == pytest.approx(0.5)
    snaps = rates.overlay({}, ["mac:1"], now=100.0)
    assert snaps["mac:1"].prefill_tokens_per_s == pytest.approx(2000)
    assert snaps["mac:1"].healthy and snaps["mac:1"].last_seen == 100.0
    # the routing history's prefix match on it is scaled by the reuse it delivers
    assert rates.discount({"mac:1": PrefixMatch(10, 10.0)})["mac:1"].weighted_blocks == pytest.approx(5.0)


def _placed_on_history(rates: OutcomeRates, match: PrefixMatch, prompt_tokens: int, cached_tokens: int) -> None:
    """One attempt placed on the routing history's ``match``: placement predicts what the discounted match prices
    at (``priced_prefix``, 16 tokens a block), the engine reports ``cached_tokens``."""
    discounted = rates.discount({"mac:1": match})["mac:1"]
    predicted, _ = priced_prefix(discounted, prompt_tokens, 16, None)
    rates.observe(
        "mac:1",
        queued_prefill_tokens=0,
        prompt_tokens=prompt_tokens,
        predicted_cached_tokens=predicted,
        cached_tokens=cached_tokens,
        ttft_s=None,
        completion_tokens=None,
        e2e_s=None,
    )


def test_a_reuse_learned_at_nothing_comes_back_when_the_engine_reuses_again() -> None:
    """The first follow-up found MLX's small prompt cache evicted (0 of 2,000 reused). The discount then priced the
    history's match at 0 cached tokens, so no later attempt predicted any reuse there, and only attempts that
    predicted some taught the ratio: it stayed 0 for good, whatever the engine delivered after."""
    rates = OutcomeRates(["mac:1"])
    match = PrefixMatch(125, 125.0)  # 2,000 tokens of the prompt in the engine's history
    _placed_on_history(rates, match, 4000, cached_tokens=0)
    for _ in range(12):  # the engine reuses the whole prefix again
        _placed_on_history(rates, match, 4000, cached_tokens=2000)
    learned = rates.learned("mac:1")
    assert learned is not None and learned.reuse_ratio is not None
    assert learned.reuse_ratio > 0.95
    assert rates.discount({"mac:1": match})["mac:1"].weighted_blocks > 0.95 * 125


def test_the_reuse_learned_is_what_the_engine_delivers_of_the_history_not_of_the_discounted_guess() -> None:
    """An engine that reuses half of what its history holds is learned at a half. Compared with the discounted
    prediction (itself the ratio times the match), the samples chased their own tail and settled at 0.71."""
    rates = OutcomeRates(["mac:1"])
    match = PrefixMatch(125, 125.0)
    for _ in range(30):
        _placed_on_history(rates, match, 4000, cached_tokens=1000)
    learned = rates.learned("mac:1")
    assert learned is not None and learned.reuse_ratio == pytest.approx(0.5, abs=0.01)


def test_an_outcome_learned_rate_follows_the_engine_down_and_back_up() -> None:
    rates = OutcomeRates(["mac:1"])

    def attempt(ttft_s: float) -> None:
        rates.observe(
            "mac:1",
            queued_prefill_tokens=0,
            prompt_tokens=2000,
            predicted_cached_tokens=0,
            cached_tokens=0,
            ttft_s=ttft_s,
            completion_tokens=1,
            e2e_s=ttft_s,
        )

    for ttft_s in [1.0] * WINDOW + [10.0] * WINDOW:  # 2,000 tokens/s, then slowed to 200
        attempt(ttft_s)
    learned = rates.learned("mac:1")
    assert learned is not None and learned.prefill_tokens_per_s == pytest.approx(200)
    for _ in range(WINDOW):  # quick again
        attempt(1.0)
    assert learned.prefill_tokens_per_s == pytest.approx(2000)


def test_a_response_timed_only_at_its_end_teaches_no_prefill_rate() -> None:
    rates = OutcomeRates(["mac:1"])
    # a non-streamed response: the "first token" is the end of a 100-token answer
    rates.observe(
        "mac:1",
        queued_prefill_tokens=0,
        prompt_tokens=4000,
        predicted_cached_tokens=0,
        cached_tokens=0,
        ttft_s=3.0,
        completion_tokens=100,
        e2e_s=3.0,
    )
    learned = rates.learned("mac:1")
    assert learned is not None and learned.prefill_tokens_per_s == 0.0
    # a scraped endpoint's own rates are never overwritten
    scraped = {"gpu:1": EndpointSnapshot("gpu:1", prefill_tokens_per_s=9000.0)}
    assert rates.overlay(scraped, ["gpu:1"], now=1.0) == scraped
