"""A request naming a LoRA adapter is keyed where the engine's KV events for that adapter land, and placed there."""

from __future__ import annotations

from pathlib import Path

import pytest

from cognitora.config import CognitoraConfig, ConfigError, config_from_dict
from cognitora.core.router import Router
from cognitora.request import RouteRequest
from kvstate.events.ingest import EventIngestor
from kvstate.events.vllm import decode_batch
from kvstate.keys import chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer
from tests.support.events_fake_engine import envelope, vllm_stored_map

BASE, ADAPTER = "smollm2", "sql-adapter"
A, B = "127.0.0.1:8001", "127.0.0.1:8002"
MESSAGES = [
    {"role": "system", "content": "You translate questions about the orders table into SQL. " * 30},
    {"role": "user", "content": "How many orders shipped in May?"},
]


def config(smollm2_dir: Path) -> CognitoraConfig:
    return config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0},
            "models": [
                {
                    "name": BASE,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "loras": [ADAPTER],
                    "endpoints": [{"url": f"http://{A}"}, {"url": f"http://{B}"}],
                }
            ],
        }
    )


async def test_lora_request_keys_match_the_ingested_lora_blockstored(smollm2_dir: Path) -> None:
    store = MemoryStore()
    # What engine B publishes after prefilling this chat under the adapter: a vLLM BlockStored with lora_name.
    ids = ChatTokenizer(smollm2_dir / "tokenizer.json").encode_chat(MESSAGES)
    full = len(ids) // 16
    event = vllm_stored_map(list(range(1, full + 1)), None, ids[: full * 16], lora_name=ADAPTER)
    await EventIngestor(store, BASE, 16).apply(B, decode_batch(envelope([event])))

    router = Router(config(smollm2_dir), store)
    lora = await router.place(RouteRequest(model=ADAPTER, messages=MESSAGES))
    assert list(lora.keys) == chain_block_keys(root_key(BASE, ADAPTER), ids, 16)
    # The keys are the ones the ingest stored: the adapter's prefix is found on B, and the request goes there.
    held = await store.match_prefix(BASE, list(lora.keys), [A, B])
    assert held[B].blocks == full and A not in held
    assert lora.endpoint == B and lora.predicted_cached_tokens == full * 16
    assert lora.model == ADAPTER  # the engine is still asked for the adapter

    # The base model's cache never holds the adapter's blocks (its KV differs): no hit for the same chat.
    base = await router.place(RouteRequest(model=BASE, messages=MESSAGES))
    assert base.rejection is None and base.predicted_cached_tokens == 0
    await router.close()


async def test_a_dispatched_lora_request_draws_the_next_one_with_the_same_prefix(smollm2_dir: Path) -> None:
    """The dispatch's speculative keys land in the base model's block index, where the next placement reads."""
    store = MemoryStore()
    router = Router(config(smollm2_dir), store)
    first, attempt = await router.admit(RouteRequest(model=ADAPTER, messages=MESSAGES, candidates=[A]))
    assert attempt is not None and first.endpoint == A
    await attempt.settled()
    held = await store.match_prefix(BASE, list(first.keys), [A, B])
    assert held[A].blocks == len(first.keys)
    again = await router.place(RouteRequest(model=ADAPTER, messages=MESSAGES))
    assert again.endpoint == A and again.predicted_cached_tokens == len(first.keys) * 16, again.explain()
    await router.close()


def test_a_lora_name_must_not_shadow_another_model(smollm2_dir: Path) -> None:
    endpoints = [{"url": f"http://{A}"}]
    with pytest.raises(ConfigError, match="'other' is already a name"):
        config_from_dict(
            {
                "models": [
                    {"name": "other", "endpoints": endpoints},
                    {"name": BASE, "loras": ["other"], "endpoints": endpoints},
                ]
            }
        )
    cfg = config_from_dict({"models": [{"name": BASE, "loras": [ADAPTER], "endpoints": endpoints}]})
    assert cfg.model(ADAPTER) is cfg.model(BASE) and ADAPTER in cfg.model_names()
