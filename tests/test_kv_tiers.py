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
