from __future__ import annotations

from pathlib import Path

import pytest

from kvstate.keys import chain_block_keys, root_key
from kvstate.prompt import ChatTokenizer, PromptError, PromptKeyer

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
