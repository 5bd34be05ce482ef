"""The block-key memo (kvstate/key_memo.py): exactly the hashed keys, reused for shared prefixes, bounded."""

from __future__ import annotations

import random

import pytest

from cognitora.config import config_from_dict
from cognitora.preflight import prompt_keyers
from kvstate.key_memo import BlockKeyMemo
from kvstate.keys import chain_block_keys, root_key

ROOT = root_key("m")


def test_memo_gives_exactly_the_hashed_keys_for_shared_and_new_prefixes() -> None:
    rng = random.Random(3)
    systems = [[rng.randrange(50_000) for _ in range(8_000)] for _ in range(3)]
    memo = BlockKeyMemo(32 << 20)
    for i in range(60):
        ids = systems[i % 3] + [rng.randrange(50_000) for _ in range(rng.randrange(0, 300))]
        if i % 5 == 4:
            ids = ids[: rng.randrange(1, len(ids))]  # a prefix of it, ending mid-block
        if i % 7 == 6:
            ids = [rng.randrange(50_000) for _ in range(rng.randrange(0, 900))]  # nothing shared
        assert memo.chain(ROOT, ids, 16) == chain_block_keys(ROOT, ids, 16), i
    assert memo.reused_blocks > 30 * 490  # each shared 500-block system prompt was hashed about once
    lora = root_key("m", "lora")  # another parent: its own chain, never the base model's keys
    assert memo.chain(lora, systems[0], 16) == chain_block_keys(lora, systems[0], 16)


def test_memo_stays_within_its_bound_and_still_answers_right() -> None:
    memo = BlockKeyMemo(200_000)
    for i in range(40):
        ids = list(range(i * 1000, i * 1000 + 800))
        assert memo.chain(ROOT, ids, 16) == chain_block_keys(ROOT, ids, 16)
        assert memo.held_bytes <= 200_000
    huge = list(range(10**6, 10**6 + 100_000))  # more than a quarter of the bound: keyed, not kept
    assert memo.chain(ROOT, huge, 16) == chain_block_keys(ROOT, huge, 16) and memo.held_bytes <= 200_000


def test_memo_off_and_bad_block_size() -> None:
    off = BlockKeyMemo(0)
    assert off.chain(ROOT, list(range(64)), 16) == chain_block_keys(ROOT, list(range(64)), 16)
    assert off.held_bytes == 0
    with pytest.raises(ValueError, match="block_size must be positive"):
        BlockKeyMemo(10).chain(ROOT, [1, 2], 0)


def test_the_config_bound_reaches_every_keyer() -> None:
    models = [{"name": "m", "endpoints": [{"url": "http://a:1"}]}]
    assert prompt_keyers(config_from_dict({"models": models}))["m"].key_memo.max_bytes == 32 << 20
    keyer = prompt_keyers(config_from_dict({"models": models, "limits": {"block_key_memo_bytes": 0}}))["m"]
    assert keyer.key_memo.max_bytes == 0
    assert keyer.keys_for_tokens(list(range(32))) == chain_block_keys(ROOT, list(range(32)), 16)
