"""KV tiers that mean something: blocks offloaded to CPU memory or disk, announced with vLLM's ``medium``, removed
per tier, and placement pricing their reload in seconds from the configured bandwidths.

The event bytes follow vLLM's current map encoding (``shared/reference/engines.md`` 1.3: a ``BlockStored`` map with
``medium``; CPU offload events may carry no ``token_ids``, 1.3 "KV offloading"), packed with msgpack here.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from cognitora.config import KvTiersConfig, config_from_dict
from cognitora.placement import FleetState, place
from cognitora.placement.tier_reload import priced_prefix
from cognitora.request import RouteRequest
from cognitora_sim.block_hash import BlockHasher
from cognitora_sim.kv_cache import BlockRemoved as SimRemoved
from cognitora_sim.kv_cache import BlockStored as SimStored
from cognitora_sim.kv_cache import PrefixCache
from cognitora_sim.kv_events import encode_event
from cognitora_sim.scheduler import Scheduler, SimRequest
from kvstate.events.ingest import EventIngestor
from kvstate.events.vllm import decode_batch
from kvstate.keys import chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from kvstate.prompt import PromptKeys
from kvstate.store import PrefixMatch

BLOCK = 16
TIERS = KvTiersConfig(kv_bytes_per_token=131_072, cpu_gb_per_s=25.0, disk_gb_per_s=3.0)


def test_reload_time_is_bytes_over_bandwidth_and_the_blocks_count_whole() -> None:
    # 10 blocks held: 4 on the GPU, 4 only in CPU memory, 2 only on disk (store weights 1.0, 0.8, 0.5)
    match = PrefixMatch(10, 4 * 1.0 + 4 * 0.8 + 2 * 0.5, cpu_blocks=4, disk_blocks=2)
    cached, reload_s = priced_prefix(match, 1000, BLOCK, TIERS)
    assert cached == pytest.approx(160)
    block_bytes = BLOCK * 131_072
    assert reload_s == pytest.approx(4 * block_bytes / 25e9 + 2 * block_bytes / 3e9)
    # without tier pricing the store's weights stand, and nothing is reloaded
    assert priced_prefix(match, 1000, BLOCK, None) == (pytest.approx(8.2 * BLOCK), 0.0)


def test_a_prompt_shorter_than_the_held_prefix_reloads_only_its_part() -> None:
    match = PrefixMatch(10, 10 * 0.5, cpu_blocks=0, disk_blocks=10)
    cached, reload_s = priced_prefix(match, 80, BLOCK, TIERS)  # 5 blocks of the 10
    assert cached == 80
    assert reload_s == pytest.approx(80 * 131_072 / 3e9)


def config(*rates: float) -> Any:
    return config_from_dict(
        {
            "models": [
                {
                    "name": "m",
                    "block_size": BLOCK,
                    "endpoints": [
                        {"url": f"http://127.0.0.1:{8001 + i}", "prefill_tokens_per_s": r} for i, r in enumerate(rates)
                    ],
                }
            ],
            "placement": {"recompute_weight": 0.0},
        }
    )


def decide(cfg: Any, matches: dict[str, PrefixMatch], tokens: int) -> Any:
    keys = list(range(1, tokens // BLOCK + 1))
    prompt = PromptKeys(keys=keys, prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK)
    state = FleetState(now=1.0, matches=matches, inflight={}, snapshots={})
    return place(RouteRequest(model="m", prompt="x"), prompt, cfg, state)


def test_a_slow_engine_holding_the_prefix_on_disk_beats_recomputing_it() -> None:
    # A Mac (1,200 tokens/s) holds a 4,096-token prefix on disk: reloading 512 MiB at 3 GB/s takes 0.18 s,
    # recomputing it there 3.4 s; an H100 (30,000 tokens/s) recomputes it in 0.14 s.
    cfg = config(1200, 30000)
    held = PrefixMatch(256, 256 * 0.5, disk_blocks=256)
    d = decide(cfg, {"127.0.0.1:8001": held}, 4096)
    mac = next(c for c in d.candidates if c.endpoint == "127.0.0.1:8001")
    assert mac.cached_tokens == 4096
    assert mac.reload_s == pytest.approx(4096 * 131_072 / 3e9)
    assert mac.predicted_ttft_s == pytest.approx(mac.reload_s + mac.decode_penalty_s)
    # the H100 is still faster: recomputing 4,096 tokens at 30,000/s is less than the Mac's disk reload
    assert d.endpoint == "127.0.0.1:8002"
    # the same prefix in host memory loads in 21 ms: now the Mac holding it wins
    in_ram = PrefixMatch(256, 256 * 0.8, cpu_blocks=256)
    assert decide(cfg, {"127.0.0.1:8001": in_ram}, 4096).endpoint == "127.0.0.1:8001"
    assert "reload from CPU/disk" in decide(cfg, {"127.0.0.1:8001": in_ram}, 4096).explain()


def test_bandwidths_are_checked_at_load() -> None:
    with pytest.raises(ValueError, match="cpu_gb_per_s"):
        config_from_dict(
            {"models": [{"name": "m", "endpoints": [{"url": "http://h:1"}]}], "kv_tiers": {"cpu_gb_per_s": 0}}
        )


def _stored(hashes: list[int], parent: int | None, tokens: list[int], medium: str) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BLOCK,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }


async def test_vllm_offload_events_move_blocks_between_tiers_and_remove_them_per_tier() -> None:
    store = MemoryStore()
    ingest = EventIngestor(store, "m", BLOCK)
    tokens = list(range(1000, 1064))  # 4 blocks
    keys = chain_block_keys(root_key("m"), tokens, BLOCK)

    async def apply(*events: dict[str, Any]) -> PrefixMatch:
        payload = msgpack.packb([1.5, list(events), 0])
        await ingest.apply("gpu:1", decode_batch(payload))
        return (await store.match_prefix("m", keys)).get("gpu:1", PrefixMatch(0, 0.0))

    held = await apply(_stored([11, 12, 13, 14], None, tokens, "GPU"))
    assert (held.blocks, held.cpu_blocks, held.disk_blocks) == (4, 0, 0)
    # the CPU offloading connector copies the last two blocks to host memory (no token ids), then the GPU evicts
    held = await apply(
        _stored([13, 14], None, [], "CPU"),
        {"type": "BlockRemoved", "block_hashes": [13, 14], "medium": "GPU"},
    )
    assert (held.blocks, held.cpu_blocks, held.disk_blocks) == (4, 2, 0)
    # host memory evicts one of them: the prefix ends before it
    held = await apply({"type": "BlockRemoved", "block_hashes": [14], "medium": "CPU"})
    assert (held.blocks, held.cpu_blocks) == (3, 1)


# -- the simulated vLLM engine's CPU offload tier ------------------------------------------------------------------
def _run(s: Scheduler, req: SimRequest) -> list[int]:
    """Run ``req`` to its end; the reload tokens of each step."""
    s.add(req)
    reloads, t = [], 0.0
    while not req.finished:
        step = s.schedule()
        reloads.append(step.reload_tokens)
        t += 1
        s.commit(step, t)
    return reloads


def _req(tokens: list[int]) -> SimRequest:
    return SimRequest(rid="r", tokens=list(tokens), prompt_len=len(tokens), max_tokens=1, arrival=0.0)


def test_sim_offloads_evicted_blocks_to_cpu_announces_them_and_loads_them_back() -> None:
    cache = PrefixCache(num_blocks=6, block_size=4, cpu_blocks=8)
    s = Scheduler(cache, BlockHasher(4), [(900, " x")], max_num_seqs=4, max_num_batched_tokens=64)
    first = list(range(100, 117))  # 4 full blocks + 1 token
    _run(s, _req(first))
    cache.drain()
    _run(s, _req(list(range(500, 517))))  # another 4 blocks: the GPU (6 blocks) evicts the first prompt's
    events = cache.drain()
    offloaded = [e for e in events if isinstance(e, SimStored) and e.medium == "CPU"]
    assert offloaded and all(e.token_ids == [] for e in offloaded)  # copies of known blocks: no token ids
    removed_gpu = [h for e in events if isinstance(e, SimRemoved) and e.medium == "GPU" for h in e.block_hashes]
    assert set(removed_gpu) <= {h for e in offloaded for h in e.block_hashes}  # kept in host memory first
    again = _req(first)
    reloads = _run(s, again)
    assert again.cached_tokens == 16  # all 4 blocks: part from the GPU, the rest loaded back from host memory
    assert sum(reloads) >= 4  # at least one block came back from host memory, priced as a reload
    # the loaded blocks are GPU blocks again, announced with their tokens
    assert any(isinstance(e, SimStored) and e.medium == "GPU" and e.token_ids for e in cache.drain())


def test_sim_cpu_tier_evicts_in_lru_order_with_a_cpu_removal() -> None:
    cache = PrefixCache(num_blocks=4, block_size=4, cpu_blocks=2)
    s = Scheduler(cache, BlockHasher(4), [(900, " x")], max_num_seqs=4, max_num_batched_tokens=64)
    for base in (100, 200, 300):
        _run(s, _req(list(range(base, base + 13))))  # 3 full blocks each
    events = cache.drain()
    assert any(isinstance(e, SimRemoved) and e.medium == "CPU" for e in events)
    assert len(cache.cpu) == 2


def test_sim_offload_events_encode_their_medium() -> None:
    wire = encode_event(SimStored([7], None, [], 16, "CPU"), legacy=False)
    assert (wire["medium"], wire["token_ids"]) == ("CPU", [])
    assert encode_event(SimRemoved([7], "CPU"), legacy=True) == ["BlockRemoved", [7], "CPU"]
