"""The block-key memo (kvstate/key_memo.py): the same keys as hashing, bounded, and through the Router."""

from __future__ import annotations

import random

import pytest

from cognitora.config import config_from_dict
from kvstate.key_memo import BlockKeyMemo
from kvstate.keys import chain_block_keys, root_key
from kvstate.prompt import PromptKeyer

ROOT = root_key("m")


def test_memo_gives_exactly_the_hashed_keys_for_shared_and_new_prefixes() -> None:
    rng = random.Random(3)
    system = [rng.randrange(50_000) for _ in range(8_000)]
    memo = BlockKeyMemo(1 << 16)
    for i in range(20):
        ids = system + [rng.randrange(50_000) for _ in range(rng.randrange(0, 300))]
        if i % 5 == 4:
            ids = ids[: rng.randrange(1, len(ids))]  # a prefix of it, ending mid-block
        assert memo.chain(ROOT, ids, 16) == chain_block_keys(ROOT, ids, 16)
    assert memo.hits > 19 * 400  # the shared 500 blocks were hashed once
    assert memo.chain(root_key("m", "lora"), system, 16) == chain_block_keys(root_key("m", "lora"), system, 16)


def test_memo_stays_within_its_bound_and_still_answers_right() -> None:
    memo = BlockKeyMemo(100)
    for i in range(30):
        ids = list(range(i * 1000, i * 1000 + 800))  # 50 blocks each, all new
        assert memo.chain(ROOT, ids, 16) == chain_block_keys(ROOT, ids, 16)
        assert len(memo) <= 100


def test_memo_off_and_bad_block_size() -> None:
    off = BlockKeyMemo(0)
    assert off.chain(ROOT, list(range(64)), 16) == chain_block_keys(ROOT, list(range(64)), 16) and len(off) == 0
    with pytest.raises(ValueError, match="block_size must be positive"):
        BlockKeyMemo(10).chain(ROOT, [1, 2], 0)


def test_the_config_bound_reaches_every_keyer() -> None:
    from cognitora.preflight import prompt_keyers

    config = config_from_dict({"models": [{"name": "m", "endpoints": [{"url": "http://a:1"}]}]})
    assert prompt_keyers(config)["m"].key_memo.max_entries == 1 << 17
    off = config_from_dict(
        {"models": [{"name": "m", "endpoints": [{"url": "http://a:1"}]}], "limits": {"block_key_memo_entries": 0}}
    )
    keyer: PromptKeyer = prompt_keyers(off)["m"]
    assert keyer.key_memo.max_entries == 0 and keyer.keys_for_tokens(list(range(32))) == chain_block_keys(
        ROOT, list(range(32)), 16
    )
