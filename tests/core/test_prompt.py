"""The one prompt normalizer (kvstate.prompt, kvstate.chat_template): vLLM's rules, case by case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstate.chat_template import ChatTemplate, conversation, detect_content_format, tool_schemas
from kvstate.keys import chain_block_keys, root_key
from kvstate.prompt import (
    ChatPrompt,
    ChatTokenizer,
    CompletionPrompt,
    PromptError,
    PromptKeyer,
    prompt_token_ids,
    read_prompt,
)
from tests.support.bos_model import BOS, BOS_ID, write_bos_model

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> ChatTokenizer:
    return ChatTokenizer(smollm2_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def bos_tok(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return ChatTokenizer(write_bos_model(tmp_path_factory.mktemp("bos-model")))


def test_smollm2_chat_ids_are_the_ones_its_provenance_records(smollm2: ChatTokenizer) -> None:
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello there"}]
    expected = [1, 9690, 198, 2683, 359, 5356, 30, 2, 198, 1, 4093, 198, 19556, 665, 2, 198, 1, 520, 9531, 198]
    assert prompt_token_ids(smollm2, read_prompt(messages=messages)) == [expected]


def test_chat_template_sees_bos_and_eos_tokens_and_no_bos_is_added_on_top(bos_tok: ChatTokenizer) -> None:
    chat = read_prompt(messages=[{"role": "user", "content": "Hi"}])
    text = bos_tok.render_chat(chat)  # type: ignore[arg-type]
    assert text == f"{BOS}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    (ids,) = prompt_token_ids(bos_tok, chat)
    # The template wrote the BOS; vLLM's chat default (add_special_tokens=False) adds no second one.
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1
    (doubled,) = prompt_token_ids(
        bos_tok, read_prompt(messages=[{"role": "user", "content": "Hi"}], add_special_tokens=True)
    )
    assert doubled == [BOS_ID, *ids]


def test_completion_text_gets_the_post_processors_bos_and_token_ids_get_nothing(bos_tok: ChatTokenizer) -> None:
    plain = bos_tok.tokenizer.encode("once upon a time", add_special_tokens=False).ids
    assert prompt_token_ids(bos_tok, read_prompt(prompt="once upon a time")) == [[BOS_ID, *plain]]
    assert prompt_token_ids(bos_tok, read_prompt(prompt="once upon a time", add_special_tokens=False)) == [plain]
    assert prompt_token_ids(bos_tok, read_prompt(prompt=plain)) == [plain]
    # The piece-cached encoder equals the tokenizer's own, special tokens included.
    assert (
        bos_tok.encode("once upon a time", add_special_tokens=True) == bos_tok.tokenizer.encode("once upon a time").ids
    )


def test_a_completions_batch_counts_every_prompt_and_is_keyed_by_the_first(bos_tok: ChatTokenizer) -> None:
    batch = read_prompt(prompt=["first prompt here", "a second one"])
    assert isinstance(batch, CompletionPrompt) and len(batch.prompts) == 2
    first, second = prompt_token_ids(bos_tok, batch)
    assert first[0] == BOS_ID and second[0] == BOS_ID
    keyer = PromptKeyer("m", 4, bos_tok)
    keys = keyer.keys(batch)
    assert keys.prompt_tokens == len(first) + len(second)
    assert keys.keys == chain_block_keys(root_key("m"), first, 4)
    ids = read_prompt(prompt=[[5, 6, 7, 8, 9], [1, 2]])
    assert prompt_token_ids(bos_tok, ids) == [[5, 6, 7, 8, 9], [1, 2]]


def test_token_id_prompts_are_exact_even_without_a_tokenizer() -> None:
    keys = PromptKeyer("m", 4).keys(read_prompt(prompt=list(range(10))))
    assert keys.exact and keys.prompt_tokens == 10
    assert keys.keys == chain_block_keys(root_key("m"), list(range(10)), 4)
    text = PromptKeyer("m", 4).keys(read_prompt(prompt=["x" * 64, "y" * 32]))
    assert not text.exact and text.prompt_tokens == 16 + 8


def test_tools_reach_the_template_as_vllm_dumps_them(bos_tok: ChatTokenizer) -> None:
    schemas = tool_schemas([WEATHER])
    # vLLM's pydantic model writes the optional fields it knows, as null, before anything else.
    assert schemas == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": None, "parameters": WEATHER["function"]["parameters"]},
        }
    ]
    text = bos_tok.render(
        [{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER],
    )
    assert f"Tools you may call: {json.dumps(schemas, ensure_ascii=False)}<|im_end|>" in text
    without = bos_tok.render([{"role": "user", "content": "Weather in Oslo?"}])
    assert "Tools" not in without and text.endswith(without.removeprefix(BOS))


def test_tool_call_arguments_become_objects_and_empty_tool_calls_vanish() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"city": "Oslo"}'}}]
    messages = [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "assistant", "content": "ok", "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
        {"role": "assistant", "content": "x", "tool_calls": [{"type": "function", "function": {"arguments": "{bad"}}]},
    ]
    conv = conversation(messages)
    assert conv[0] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{**calls[0], "function": {"name": "f", "arguments": {"city": "Oslo"}}}],
    }
    assert conv[1] == {"role": "assistant", "content": "ok"}
    assert conv[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert conv[3]["tool_calls"][0]["function"]["arguments"] == {}
    assert calls[0]["function"]["arguments"] == '{"city": "Oslo"}'  # the client's request is left as it came


def test_content_parts_join_with_newlines_for_a_string_template_and_stay_parts_for_one_that_loops() -> None:
    parts = [
        {"type": "text", "text": "one"},
        {"type": "image_url", "image_url": {"url": "x"}},
        "two",
        {"type": "text", "text": ""},
    ]
    assert conversation([{"role": "user", "content": parts}])[0]["content"] == "one\ntwo"
    assert conversation([{"role": "user", "content": parts}], "openai")[0]["content"] == [
        {"type": "text", "text": "one"},
        {"type": "image"},
        {"type": "text", "text": "two"},
        {"type": "text", "text": ""},
    ]
    assert conversation([{"role": "user", "content": "plain"}], "openai")[0]["content"] == [
        {"type": "text", "text": "plain"}
    ]


@pytest.mark.parametrize(
    ("source", "fmt"),
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "string"),
        ("{% for m in messages %}{% for c in m['content'] %}{{ c['text'] }}{% endfor %}{% endfor %}", "openai"),
        ("{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}", "openai"),
        # Llama 3.x: the loop runs over an alias of a slice of messages
        (
            "{% set loop_messages = messages[1:] %}{% for message in loop_messages %}"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for c in message['content'] %}{{ c['text'] }}{% endfor %}{% endif %}{% endfor %}",
            "openai",
        ),
        ("{% for c in content %}{{ c }}{% endfor %}", "string"),
    ],
)
def test_content_format_is_detected_from_the_template_like_vllm(source: str, fmt: str) -> None:
    assert detect_content_format(source) == fmt


def test_an_openai_format_template_renders_parts(bos_tok: ChatTokenizer) -> None:
    template = ChatTemplate(
        "{% for m in messages %}[{% for c in m['content'] %}<{{ c['text'] }}>{% endfor %}]{% endfor %}", {}
    )
    text = template.render([{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}])
    assert text == "[<a><b>]"


def test_continue_final_message_and_template_kwargs(smollm2: ChatTokenizer) -> None:
    messages = [{"role": "user", "content": "Name a color"}, {"role": "assistant", "content": "The color is"}]
    text = smollm2.render_chat(ChatPrompt(messages, add_generation_prompt=False, continue_final_message=True))
    assert text.endswith("<|im_start|>assistant\nThe color is")
    with pytest.raises(PromptError, match="cannot set both"):
        smollm2.render_chat(ChatPrompt(messages, continue_final_message=True))
    template = ChatTemplate("{{ greeting }}{{ bos_token }}", {"bos_token": "<s>"})
    assert template.render([{"role": "user", "content": "x"}], template_kwargs={"greeting": "hey"}) == "hey<s>"


def test_lora_requests_are_keyed_in_the_adapters_key_space(smollm2: ChatTokenizer) -> None:
    keyer = PromptKeyer("smollm2", 16, smollm2)
    chat = read_prompt(messages=[{"role": "user", "content": "Hello there, " * 20}])
    (ids,) = prompt_token_ids(smollm2, chat)
    assert keyer.keys(chat, "sql-adapter").keys == chain_block_keys(root_key("smollm2", "sql-adapter"), ids, 16)
    assert keyer.keys(chat, "sql-adapter").keys != keyer.keys(chat).keys


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "neither 'messages' nor 'prompt'"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"content": "x"}]}, "string 'role'"),
        ({"messages": [{"role": "user", "content": 42}]}, "content must be a string"),
        ({"messages": [{"role": "user", "content": [{"type": "video_game"}]}]}, "unsupported content part"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]}, "name"),
        ({"prompt": []}, "empty"),
        ({"prompt": [[]]}, "empty token list"),
        ({"prompt": [1, "a"]}, "must be a string"),
        ({"prompt": {"text": "x"}}, "must be a string"),
    ],
)
def test_bad_prompts_are_clear_client_errors(fields: dict[str, object], says: str, smollm2: ChatTokenizer) -> None:
    with pytest.raises(PromptError, match=says):
        prompt_token_ids(smollm2, read_prompt(**fields))  # type: ignore[arg-type]
