from __future__ import annotations

from pathlib import Path

import pytest

from kvstate.key_memo import BlockKeyMemo
from kvstate.keys import PAUSE_EVERY_BLOCKS, chain_block_keys, root_key
from kvstate.prompt import ChatTokenizer, PromptError, PromptKeyer

ROOT = root_key("m")
CHAT = [
    {"role": "system", "content": "You are a careful assistant for ACME's billing team. " * 40},
    {"role": "user", "content": "Why was I charged twice in March?"},
]


def test_same_tokens_same_keys_whether_from_request_or_event() -> None:
    tokens = list(range(100))
    root = root_key("m")
    whole = chain_block_keys(root, tokens, 16)
    # A BlockStored event for blocks 2.. carries only their tokens, chained from the parent block's key.
    tail = chain_block_keys(whole[1], tokens[32:], 16)
    assert whole[2:] == tail
    assert len(whole) == 6  # 100 // 16: the partial last block gets no key


def test_keys_are_the_values_they_always_were() -> None:
    # Pinned from the hashing before it was reworked to hold the GIL less (one blake2b per block, each key converted
    # on the way): a store's keys outlive a gateway's upgrade, and engines' events are keyed the same way, so a
    # change of a single key would orphan every cached block already indexed.
    ids = [(i * 7919) % 49152 for i in range(80)]
    assert chain_block_keys(root_key("m"), ids, 16) == [
        14726747671806145300,
        13631136619806604965,
        17817283408449894615,
        9339021063836953697,
        3405288236900904829,
    ]
    assert chain_block_keys(root_key("m", "lora1"), ids, 32) == [14590087591298670727, 14971958357269806390]


@pytest.mark.parametrize("blocks", [0, 1, PAUSE_EVERY_BLOCKS - 1, PAUSE_EVERY_BLOCKS, PAUSE_EVERY_BLOCKS + 1, 1_000])
def test_hashing_in_slices_gives_the_same_keys_and_pauses_between_them(blocks: int) -> None:
    ids = [(i * 7919) % 49152 for i in range(blocks * 16 + 5)]
    pauses: list[int] = []
    memo = BlockKeyMemo(32 << 20)
    sliced, _ = memo.chain_reusing(ROOT, ids, 16, pause=lambda: pauses.append(1))
    assert sliced == chain_block_keys(ROOT, ids, 16)
    assert len(pauses) == -(-blocks // PAUSE_EVERY_BLOCKS)  # one before each slice: none for nothing to hash
    pauses.clear()
    longer = ids + [7] * 16 * PAUSE_EVERY_BLOCKS  # its first blocks reused from the memo, the rest hashed in slices
    assert memo.chain_reusing(ROOT, longer, 16, pause=lambda: pauses.append(1))[0] == chain_block_keys(ROOT, longer, 16)
    assert len(pauses) == -(-(len(longer) // 16 - blocks) // PAUSE_EVERY_BLOCKS)


def test_keys_are_rooted_at_model_and_lora() -> None:
    tokens = list(range(32))
    assert chain_block_keys(root_key("a"), tokens, 16) != chain_block_keys(root_key("b"), tokens, 16)
    assert chain_block_keys(root_key("a"), tokens, 16) != chain_block_keys(root_key("a", "lora1"), tokens, 16)


def test_prefix_sharing_prompts_share_leading_keys(smollm2_dir: Path) -> None:
    keyer = PromptKeyer("smollm2", 16, ChatTokenizer(smollm2_dir / "tokenizer.json"))
    a = keyer.keys_for_chat(CHAT)
    b = keyer.keys_for_chat([CHAT[0], {"role": "user", "content": "Cancel my plan."}])
    assert a.exact and b.exact
    shared = 0
    while a.keys[shared] == b.keys[shared]:
        shared += 1
    # Every full block of the system turn is shared; the question blocks differ.
    assert shared >= (a.prompt_tokens - 30) // 16 - 1
    assert a.keys != b.keys


def test_piece_cache_tokenizes_exactly_like_the_whole_text(smollm2_dir: Path) -> None:
    tok = ChatTokenizer(smollm2_dir / "tokenizer.json")
    text = tok.render(CHAT)
    assert text.startswith("<|im_start|>system\n")
    expected = tok.tokenizer.encode(text, add_special_tokens=False).ids
    assert tok.encode(text) == expected
    assert tok.encode(text) == expected  # second call served from the cache


def test_text_approximate_keys_without_tokenizer() -> None:
    keyer = PromptKeyer("m", 16)
    a = keyer.keys_for_chat(CHAT)
    assert not a.exact and len(a.keys) > 10
    assert keyer.keys_for_chat(CHAT).keys == a.keys


def test_bad_message_content_is_a_clear_error() -> None:
    keyer = PromptKeyer("m", 16)
    with pytest.raises(PromptError, match="content must be a string"):
        keyer.keys_for_chat([{"role": "user", "content": 42}])
