"""``kvstate.surfaces``: every surface read with vLLM's rules, into one request model, keyed alike where vLLM renders
alike. (The rendering is checked token for token against a real vLLM in
tests/real_engines/test_surfaces_real_e2e.py and against vLLM's own conversion code in
tests/core/test_surfaces_contract.py; these tests pin the behaviour itself.)"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.keys import chain_block_keys, root_key
from kvstate.prompt import ChatPrompt, ChatTokenizer, CompletionPrompt, PromptKeyer, prompt_token_ids
from kvstate.surfaces import (
    ResponseHistory,
    SurfaceError,
    read_surface,
    surface_keys,
    surface_of_path,
    surface_prompt_chars,
    surface_token_ids,
    template_traits,
)
from kvstate.surfaces.media import MEDIA_TOKEN_FLAG
from tests.support.surface_cases import (
    EFFORT_TEMPLATE,
    SAME_CONVERSATIONS,
    SYSTEM,
    SYSTEM_FIRST_TEMPLATE,
    TOOLS_TEMPLATE,
    Conversation,
    image_conversation,
    png,
)

BLOCK = 16


def _tokenizer(smollm2_dir: Path, tmp: Path, template: str | None) -> ChatTokenizer:
    if template is None:
        return ChatTokenizer(smollm2_dir / "tokenizer.json")
    path = tmp / "template.jinja"
    path.write_text(template)
    return ChatTokenizer(smollm2_dir / "tokenizer.json", path)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> ChatTokenizer:
    return ChatTokenizer(smollm2_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def tools_tok(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return _tokenizer(smollm2_dir, tmp_path_factory.mktemp("tools"), TOOLS_TEMPLATE)


def _ids(tok: ChatTokenizer, surface: str, body: dict[str, Any], **kw: Any) -> list[int]:
    request = read_surface(surface, body, traits=template_traits(tok.template), **kw)  # type: ignore[arg-type]
    (ids,) = surface_token_ids(tok, request)
    return ids


@pytest.mark.parametrize("conversation", SAME_CONVERSATIONS, ids=lambda c: c.name)
@pytest.mark.parametrize("template", ["smollm2", "tools-as-json"])
def test_one_conversation_keys_alike_through_every_surface_where_vllm_renders_it_alike(
    conversation: Conversation, template: str, smollm2: ChatTokenizer, tools_tok: ChatTokenizer
) -> None:
    tok = smollm2 if template == "smollm2" else tools_tok
    chat = _ids(tok, "chat", conversation.body("chat"))
    messages = _ids(tok, "messages", conversation.body("messages"))
    responses = _ids(tok, "responses", conversation.body("responses"))
    same_messages, same_responses = conversation.renders_alike(prints_tool_calls_as_json=template != "smollm2")
    assert (chat == messages) is same_messages
    assert (chat == responses) is same_responses
    keyer = PromptKeyer("smollm2", BLOCK, tok)
    keys = {
        s: surface_keys(keyer, read_surface(s, conversation.body(s), traits=template_traits(tok.template))).keys
        for s in ("chat", "messages", "responses")
    }
    assert keys["chat"] == chain_block_keys(root_key("smollm2"), chat, BLOCK)
    assert (keys["chat"] == keys["messages"]) is same_messages
    if not same_responses:
        # They part at the tool call's JSON; the system prompt and tools before it keep the same keys.
        shared = next(i for i, (a, b) in enumerate(zip(chat, responses, strict=False)) if a != b)
        assert shared > len(SYSTEM) // 8
        assert keys["responses"][: shared // BLOCK] == keys["chat"][: shared // BLOCK]


def test_the_tool_call_difference_is_vllms_own_key_order(tools_tok: ChatTokenizer) -> None:
    tools = next(c for c in SAME_CONVERSATIONS if c.tool_calls)
    text = {s: tools_tok.tokenizer.decode(_ids(tools_tok, s, tools.body(s))) for s in ("chat", "responses")}
    assert (
        '[{"id": "call_1", "function": {"arguments": {"invoice": "7"}, "name": "refund"}, "type": "function"}]'
        in (text["chat"])
    )
    assert (
        '[{"id": "call_1", "function": {"name": "refund", "arguments": {"invoice": "7"}}, "type": "function"}]'
        in (text["responses"])
    )


def test_anthropic_system_blocks_join_without_separator_and_drop_the_billing_header(smollm2: ChatTokenizer) -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2; hash=91f"},
            {"type": "text", "text": "One."},
            {"type": "text", "text": "Two."},
        ],
        "messages": [{"role": "user", "content": "hi"}],
    }
    prompt = read_surface("messages", body).chat
    assert prompt is not None
    assert prompt.messages[0] == {"role": "system", "content": "One.Two."}
    # A per-request billing hash must not change the keys: two requests with different hashes key alike.
    other = {**body, "system": [{"type": "text", "text": "x-anthropic-billing-header: hash=000"}, *body["system"][1:]]}
    assert _ids(smollm2, "messages", body) == _ids(smollm2, "messages", other)


def test_inline_system_messages_merge_only_where_the_template_demands_system_first(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "system": "Lead.",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Reminder."},
            {"role": "user", "content": "again"},
        ],
    }
    strict = _tokenizer(smollm2_dir, tmp_path, SYSTEM_FIRST_TEMPLATE)
    assert template_traits(strict.template).merge_inline_system
    merged = read_surface("messages", body, traits=template_traits(strict.template)).chat
    assert merged is not None and [m["role"] for m in merged.messages] == ["system", "user", "user"]
    assert merged.messages[0]["content"] == "Lead.Reminder."
    _ids(strict, "messages", body)  # renders: the template would have refused the inline system message
    smollm2 = ChatTokenizer(smollm2_dir / "tokenizer.json")
    assert not template_traits(smollm2.template).merge_inline_system
    kept = read_surface("messages", body, traits=template_traits(smollm2.template)).chat
    assert kept is not None and [m["role"] for m in kept.messages] == ["system", "user", "system", "user"]


def test_disabled_thinking_maps_to_none_only_for_a_template_that_reads_the_effort(
    smollm2_dir: Path, tmp_path: Path, smollm2: ChatTokenizer
) -> None:
    aware = _tokenizer(smollm2_dir, tmp_path, EFFORT_TEMPLATE)
    assert template_traits(aware.template).disabled_thinking_effort == "none"
    assert template_traits(smollm2.template).disabled_thinking_effort == "low"  # SmolLM2 ignores it: vLLM's "low"
    body = {"model": "m", "max_tokens": 2000, "messages": [{"role": "user", "content": "hi"}]}
    off = aware.tokenizer.decode(_ids(aware, "messages", {**body, "thinking": {"type": "disabled"}}))
    high = aware.tokenizer.decode(_ids(aware, "messages", {**body, "output_config": {"effort": "high"}}))
    assert "<no-think>" in off and "[effort none]" in off
    assert "[effort high]" in high and "<no-think>" not in high
    responses = aware.tokenizer.decode(_ids(aware, "responses", {"input": "hi", "reasoning": {"effort": "medium"}}))
    assert "[effort medium]" in responses
    chat = aware.tokenizer.decode(_ids(aware, "chat", {"messages": body["messages"], "reasoning_effort": "none"}))
    assert "<no-think>" in chat


def test_responses_items_merge_into_one_assistant_turn_as_vllm_builds_it() -> None:
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "sum"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}", "namespace": "ns"},
            {
                "type": "message",
                "role": "assistant",
                "id": "m",
                "status": "completed",
                "content": [{"type": "output_text", "text": "one"}, {"type": "output_text", "text": "two"}],
            },
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }
    prompt = read_surface("responses", body).chat
    assert prompt is not None
    assert prompt.messages[0] == {"role": "system", "content": "Be brief."}
    assert prompt.messages[2] == {
        "role": "assistant",
        "reasoning": "sum",
        "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": "{}"}, "type": "function"},
            {"id": "c2", "function": {"name": "ns__g", "arguments": "{}"}, "type": "function"},
        ],
        "content": "one",  # only the first part of an assistant message: vLLM's rule
    }
    assert prompt.messages[3] == {"role": "tool", "content": "ok", "tool_call_id": "c1"}
    assert prompt.add_generation_prompt and not prompt.continue_final_message
    partial = {**body["input"][4], "status": "incomplete"}
    cont = read_surface("responses", {"input": [{"role": "user", "content": "q"}, partial]}).chat
    assert cont is not None and cont.continue_final_message and not cont.add_generation_prompt


@pytest.mark.parametrize(
    ("surface", "body", "param", "says"),
    [
        ("messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", "required"),
        ("messages", {"model": "m", "max_tokens": 0, "messages": []}, "max_tokens", "at least 1"),
        ("messages", {"model": "m", "max_tokens": 5.0, "messages": []}, "max_tokens", "whole number"),
        ("messages", {"model": "m", "max_tokens": 5, "messages": "hi"}, "messages", "valid list"),
        (
            "messages",
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
            "messages[0].content[0].type",
            "Input should be",
        ),
        (
            "messages",
            {"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
            "messages[0].role",
            "Input should be",
        ),
        (
            "messages",
            {"model": "m", "max_tokens": 5, "messages": [], "tools": [{"name": "f"}]},
            "tools[0].input_schema",
            None,
        ),
        (
            "messages",
            {"model": "m", "max_tokens": 2000, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 5}},
            "thinking.enabled.budget_tokens",
            "greater than or equal",
        ),
        ("responses", {"input": 42}, "input", None),
        ("responses", {"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type", "Unsupported"),
        ("responses", {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", None),
        (
            "responses",
            {"input": [{"type": "reasoning", "encrypted_content": "zz"}]},
            "input[0].encrypted_content",
            None,
        ),
        ("responses", {"input": [{"content": "no role"}]}, "input[0]", "role"),
        ("responses", {"input": "x", "max_output_tokens": -1}, "max_output_tokens", "at least 0"),
        ("responses", {"input": "x", "tools": [{"type": "function"}]}, "tools[0].name", "non-empty"),
        ("chat", {"messages": []}, "messages", "non-empty"),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": "9"},
            "max_completion_tokens",
            None,
        ),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream", "true or false"),
        ("completions", {}, "prompt", "required"),
        ("completions", {"prompt": [1, "a"]}, "prompt", None),
        ("embeddings", {"input": {"text": "x"}}, "input", "'input' must be"),
        ("embeddings", {}, "input", "required"),
        (
            "embeddings",
            {"input": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]},
            "input",
            "one conversation",
        ),
    ],
)
def test_a_body_a_surface_cannot_read_is_a_client_error_naming_the_field(
    surface: str, body: dict[str, Any], param: str, says: str | None
) -> None:
    with pytest.raises(SurfaceError, match=says) as caught:
        read_surface(surface, body)  # type: ignore[arg-type]
    assert caught.value.param == param


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "messages",
        "system",
        "tools",
        "input",
        "instructions",
        "max_tokens",
        "max_output_tokens",
        "prompt",
        "content",
        "role",
        "type",
        "thinking",
        "previous_response_id",
        "stream",
        "reasoning",
        "chat_template_kwargs",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    surface=st.sampled_from(["chat", "completions", "messages", "responses", "embeddings"]),
    body=st.dictionaries(FIELDS, JSON, max_size=5),
)
def test_no_body_crashes_a_reader(surface: str, body: dict[str, Any], smollm2: ChatTokenizer) -> None:
    """Whatever the body, a reader returns a request or raises SurfaceError; rendering raises PromptError at most."""
    from kvstate.prompt import PromptError

    try:
        request = read_surface(surface, body, traits=template_traits(smollm2.template))  # type: ignore[arg-type]
    except SurfaceError as exc:
        assert exc.param
        return
    with contextlib.suppress(PromptError):
        surface_token_ids(smollm2, request)


def test_output_caps_per_surface_and_prompt_counts() -> None:
    chat = read_surface(
        "chat", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 5}
    )
    assert (chat.max_tokens, chat.max_tokens_field) == (5, "max_completion_tokens")
    messages = read_surface("messages", {"model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "x"}]})
    assert (messages.max_tokens, messages.max_tokens_field, messages.surface) == (7, "max_tokens", "messages")
    responses = read_surface("responses", {"input": "x", "max_output_tokens": 11, "stream": True})
    assert (responses.max_tokens, responses.max_tokens_field, responses.stream) == (11, "max_output_tokens", True)
    assert read_surface("responses", {"input": "x"}).max_tokens is None
    count = read_surface("messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, count_tokens=True)
    assert count.max_tokens is None
    embeddings = read_surface("embeddings", {"input": ["a b c", "d e"], "max_tokens": 3})
    assert (
        embeddings.max_tokens is None
        and embeddings.prompt_count == 2
        and isinstance(embeddings.prompt, CompletionPrompt)
    )
    assert read_surface("completions", {"prompt": ["a", "b", "c"]}).prompt_count == 3


def test_embeddings_inputs_are_keyed_and_counted_as_the_engine_runs_them(smollm2: ChatTokenizer) -> None:
    keyer = PromptKeyer("emb", 4, smollm2)
    batch = read_surface("embeddings", {"input": ["the first text to embed here", "a second"]})
    first, second = surface_token_ids(smollm2, batch)
    keys = surface_keys(keyer, batch)
    assert keys.prompt_tokens == len(first) + len(second)
    assert keys.keys == chain_block_keys(root_key("emb"), first, 4)
    ids = read_surface("embeddings", {"input": [[5, 6, 7, 8, 9]]})
    assert surface_token_ids(smollm2, ids) == [[5, 6, 7, 8, 9]]
    chat = read_surface("embeddings", {"input": [{"role": "user", "content": "hello"}]})
    assert isinstance(chat.prompt, ChatPrompt) and not chat.prompt.add_generation_prompt
    assert (
        surface_of_path("/v1/embeddings") == "embeddings"
        and surface_of_path("/v1/messages/count_tokens/") == "messages"
    )
    assert surface_of_path("/v1/models") is None


def test_an_image_is_keyed_by_its_content_alike_through_every_surface(smollm2: ChatTokenizer) -> None:
    keyer = PromptKeyer("smollm2", BLOCK, smollm2)
    cat, dog = image_conversation(png(1)), image_conversation(png(2))
    keys = {s: surface_keys(keyer, read_surface(s, {"model": "m", **cat[s]})) for s in cat}
    assert keys["chat"].keys == keys["messages"].keys == keys["responses"].keys
    request = read_surface("chat", cat["chat"])
    assert len(request.media) == 1 and request.media[0].source == "bytes"
    (ids,) = surface_token_ids(smollm2, request)
    at = next(i for i, t in enumerate(ids) if t >= MEDIA_TOKEN_FLAG)
    assert ids[at : at + 2] == list(request.media[0].token_ids) and all(t < MEDIA_TOKEN_FLAG for t in ids[at + 2 :])
    other = surface_keys(keyer, read_surface("chat", dog["chat"])).keys
    # The same system prompt keys alike up to the block that holds the image; from there, by the image.
    assert other[: at // BLOCK] == keys["chat"].keys[: at // BLOCK]
    assert other[at // BLOCK :] != keys["chat"].keys[at // BLOCK :]
    assert all(a != b for a, b in zip(other[at // BLOCK :], keys["chat"].keys[at // BLOCK :], strict=True))
    # Before the image, the keys are a text chat's: the shared system prompt still matches the engines' events.
    text_only = {"role": "user", "content": "What is in this picture? " * 4}
    plain = surface_keys(keyer, read_surface("chat", {"messages": [cat["chat"]["messages"][0], text_only]})).keys
    assert plain[: at // BLOCK] == keys["chat"].keys[: at // BLOCK] and at // BLOCK >= 5


def test_media_identity_follows_vllm_uuid_then_bytes_then_url(smollm2: ChatTokenizer) -> None:
    def refs(part: dict[str, Any]) -> Any:
        return read_surface("chat", {"messages": [{"role": "user", "content": [part]}]}).media[0]

    a = refs({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png(3)}"}})
    b = refs({"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{png(3)}"}})
    assert a.digest == b.digest  # the bytes, not the declared type (vLLM hashes the decoded bytes)
    u1 = refs({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png(3)}"}, "uuid": "img-1"})
    u2 = refs({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png(4)}"}, "uuid": "img-1"})
    assert u1.digest == u2.digest != a.digest and u1.source == "uuid"
    url = refs({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}})
    assert url.source == "url" and url.digest != a.digest
    bad = refs({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@not base64"}})
    assert bad.source == "url"  # keyed by its text, never refused: the engine decides
    audio = refs({"type": "input_audio", "input_audio": {"data": png(3), "format": "wav"}})
    assert audio.modality == "audio" and audio.digest != a.digest


def test_media_keys_without_a_tokenizer_still_depend_on_the_content() -> None:
    keyer = PromptKeyer("m", BLOCK)
    cat, dog = image_conversation(png(1)), image_conversation(png(2))
    a = surface_keys(keyer, read_surface("chat", cat["chat"]))
    b = surface_keys(keyer, read_surface("chat", dog["chat"]))
    c = surface_keys(keyer, read_surface("messages", {"model": "m", **cat["messages"]}))
    assert not a.exact and a.keys == c.keys and a.keys != b.keys
    # A megabyte of base64 is a marker's worth of prompt, not a quarter of a million tokens.
    big = image_conversation("A" * 1_000_000)
    assert surface_prompt_chars(read_surface("chat", big["chat"])) < 2_000


def test_previous_response_id_renders_the_conversation_vllm_keeps(smollm2: ChatTokenizer) -> None:
    history = ResponseHistory()
    first = read_surface("responses", {"instructions": "Be brief.", "input": "What is 2+2?"}, history=history)
    assert first.chat is not None
    history.remember("resp_1", first.chat.messages, ["4."], endpoint="10.0.0.7:8000")
    follow = {"instructions": "Now be verbose.", "input": "And 3+3?", "previous_response_id": "resp_1"}
    second = read_surface("responses", follow, history=history)
    assert second.history_resolved and second.previous_endpoint == "10.0.0.7:8000"
    # vLLM: the new instructions, the earlier turns without their system message, the earlier answer, the input.
    whole = read_surface(
        "chat",
        {
            "messages": [
                {"role": "system", "content": "Now be verbose."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3+3?"},
            ]
        },
    )
    assert surface_token_ids(smollm2, second) == surface_token_ids(smollm2, whole)
    unknown = read_surface("responses", {**follow, "previous_response_id": "resp_x"}, history=history)
    assert unknown.previous_response_id == "resp_x" and not unknown.history_resolved
    assert unknown.chat is not None and len(unknown.chat.messages) == 2  # keys for what the body shows


def test_the_response_history_is_bounded_least_recently_used_first() -> None:
    history = ResponseHistory(max_bytes=4_000)
    turn = [{"role": "user", "content": "x" * 300}]
    for i in range(20):
        history.remember(f"r{i}", turn, ["y" * 100])
        history.get("r0")  # kept fresh
    assert history.held_bytes <= 4_000 and history.get("r0") is not None and history.get("r1") is None
    history.remember("huge", [{"role": "user", "content": "z" * 5_000}], [])
    assert history.get("huge") is None  # larger than a quarter of the bound: not kept


def test_surfaces_without_media_key_exactly_as_the_chat_keyer_does(smollm2: ChatTokenizer) -> None:
    keyer = PromptKeyer("smollm2", BLOCK, smollm2)
    conversation = SAME_CONVERSATIONS[0]
    request = read_surface("chat", conversation.body("chat"))
    assert request.chat is not None
    ours, chats = surface_keys(keyer, request), keyer.keys(request.chat)
    assert (ours.keys, ours.prompt_tokens, ours.exact) == (chats.keys, chats.prompt_tokens, chats.exact)
    assert surface_token_ids(smollm2, request) == prompt_token_ids(smollm2, request.chat)
    assert json.dumps(request.chat.messages)  # plain data: the adapters can log and forward it


def test_a_developer_message_the_template_does_not_know_joins_the_system_prompt_first(
    smollm2: ChatTokenizer, smollm2_dir: Path, tmp_path: Path
) -> None:
    body = {"input": [{"role": "user", "content": "q"}, {"role": "developer", "content": "Be terse."}]}
    text = smollm2.tokenizer.decode(_ids(smollm2, "responses", {**body, "instructions": "Lead."}), False)
    assert text.startswith("<|im_start|>system\nLead.\n\nBe terse.<|im_end|>\n<|im_start|>user\nq<|im_end|>")
    alone = smollm2.tokenizer.decode(_ids(smollm2, "responses", body), False)
    assert alone.startswith("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nq")  # moved first
    knows = _tokenizer(smollm2_dir, tmp_path, "{% for m in messages %}{{ m['role'] }}|{% endfor %}{# 'developer' #}")
    assert knows.tokenizer.decode(_ids(knows, "responses", body)) == "user|developer|"


@pytest.mark.parametrize(
    ("surface", "body", "reserved"),
    [
        ("messages", {"model": "m", "max_tokens": 300, "messages": [{"role": "user", "content": "x"}]}, 300),
        ("responses", {"input": "x", "max_output_tokens": 200}, 200),
        ("responses", {"input": "x"}, 512),  # no cap: the budgets' default per sequence
        ("chat", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 50, "max_tokens": 9}, 50),
        ("embeddings", {"input": ["a", "b"]}, 0),
    ],
)
def test_budgets_reserve_by_the_request_model_s_surface_and_output_cap(
    surface: str, body: dict[str, Any], reserved: int
) -> None:
    """What part 2 hands the core (cognitora.request.RouteRequest) from a SurfaceRequest, as the budget estimate
    reads it (cognitora.budgets.estimate: one answer for Messages and Responses, none for embeddings)."""
    from cognitora.budgets.estimate import output_tokens
    from cognitora.request import RouteRequest, Surface

    request = read_surface(surface, body)  # type: ignore[arg-type]
    route = RouteRequest(
        model="m",
        messages=request.chat.messages if request.chat else None,
        prompt=list(request.completion.prompts) if request.completion else None,  # type: ignore[arg-type]
        surface=Surface(request.surface),
        max_tokens=request.max_tokens,
    )
    assert output_tokens(route, default_max_tokens=512) == reserved
