"""OpenAI request bodies at the Envoy boundary: clear 400 messages, exact rewrites."""

from __future__ import annotations

import json

import pytest

from envoy_extproc.openai_body import BadRequest, parse_body, rewrite_body

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**extra: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


def test_chat_body_fields() -> None:
    p = parse_body(chat(stream=True, max_tokens=5), CHAT)
    assert (p.model, p.stream, p.max_tokens, p.client_wants_usage) == ("m", True, 5, False)
    assert p.messages == [{"role": "user", "content": "hi"}]
    assert parse_body(chat(stream_options={"include_usage": True}), CHAT).client_wants_usage


def test_a_body_under_a_route_prefix_is_read_by_the_path_it_ends_with() -> None:
    assert parse_body(chat(), "/api/v1/chat/completions").messages == [{"role": "user", "content": "hi"}]
    assert parse_body(b'{"model":"m","prompt":"once"}', "/api/v1/completions").prompt == "once"


def test_completions_prompt_reaches_the_core_as_sent() -> None:
    assert parse_body(b'{"model":"m","prompt":"once upon"}', COMPLETIONS).prompt == "once upon"
    # Batches and token ids are the core's to read (kvstate.prompt), not flattened here.
    assert parse_body(b'{"model":"m","prompt":["a","b"]}', COMPLETIONS).prompt == ["a", "b"]
    assert parse_body(b'{"model":"m","prompt":[[1,2],[3]]}', COMPLETIONS).prompt == [[1, 2], [3]]
    p = parse_body(b'{"model":"m","prompt":[1,2],"add_special_tokens":false}', COMPLETIONS)
    assert (p.prompt, p.add_special_tokens) == ([1, 2], False)


def test_chat_prompt_fields_reach_the_core() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    p = parse_body(chat(tools=tools, add_generation_prompt=False, chat_template_kwargs={"x": 1}), CHAT)
    assert (p.tools, p.add_generation_prompt, p.chat_template_kwargs) == (tools, False, {"x": 1})
    assert (p.add_special_tokens, p.continue_final_message) == (None, False)


def test_max_tokens_up_to_the_limit_is_placed_and_the_newer_name_wins() -> None:
    assert parse_body(chat(max_tokens=2**24), CHAT).max_tokens == 2**24
    assert parse_body(chat(max_tokens=0), CHAT).max_tokens == 0
    assert parse_body(chat(max_tokens=64, max_completion_tokens=32), CHAT).max_tokens == 32
    assert parse_body(chat(max_tokens=None), CHAT).max_tokens is None


@pytest.mark.parametrize(
    ("body", "path", "says", "param"),
    [
        (b"", CHAT, "empty", None),
        (b"{bad", CHAT, "not valid JSON", None),
        (b"[1]", CHAT, "must be a JSON object", None),
        (b'{"messages":[{"role":"user","content":"x"}]}', CHAT, "missing 'model'", "model"),
        (b'{"model":"","messages":[]}', CHAT, "missing 'model'", "model"),
        (b'{"model":"m"}', CHAT, "'messages'", "messages"),
        (b'{"model":"m","messages":["hi"]}', CHAT, "messages[0]", "messages[0]"),
        (chat(stream="yes"), CHAT, "'stream'", "stream"),
        (chat(max_tokens=-1), CHAT, "'max_tokens' must be a non-negative integer", "max_tokens"),
        (
            chat(max_tokens=1e20),
            CHAT,
            "'max_tokens' must be a whole number of tokens (an integer), got float",
            "max_tokens",
        ),
        (chat(max_tokens=64.0), CHAT, "got float 64.0", "max_tokens"),
        (chat(max_tokens="64"), CHAT, "got str '64'", "max_tokens"),
        (chat(max_tokens=True), CHAT, "got bool True", "max_tokens"),
        (chat(max_tokens=2**24 + 1), CHAT, "'max_tokens' is 16777217: more than any model's context", "max_tokens"),
        (chat(max_tokens=5, max_completion_tokens=1e20), CHAT, "'max_completion_tokens'", "max_completion_tokens"),
        (b'{"model":"m","prompt":{}}', COMPLETIONS, "'prompt'", "prompt"),
        (b'{"model":"m","prompt":[]}', COMPLETIONS, "'prompt'", "prompt"),
        (b'{"model":"m","prompt":[1,"a"]}', COMPLETIONS, "'prompt'", "prompt"),
        (chat(tools={}), CHAT, "'tools'", "tools"),
        (chat(add_special_tokens="yes"), CHAT, "'add_special_tokens'", "add_special_tokens"),
    ],
)
def test_bad_bodies_name_the_problem(body: bytes, path: str, says: str, param: str | None) -> None:
    with pytest.raises(BadRequest) as err:
        parse_body(body, path)
    assert says in err.value.message
    assert err.value.param == param


def test_no_rewrite_when_nothing_changes() -> None:
    raw = chat()
    assert rewrite_body(parse_body(raw, CHAT), raw, model="m", include_usage=False) is None
    assert rewrite_body(parse_body(raw, CHAT), raw, model=None, include_usage=False) is None


def test_include_usage_splice_is_valid_json_and_keeps_everything() -> None:
    raw = chat(stream=True, temperature=0.5) + b"\n  "
    new = rewrite_body(parse_body(raw, CHAT), raw, model=None, include_usage=True)
    assert new is not None
    assert json.loads(new) == {**json.loads(raw), "stream_options": {"include_usage": True}}


def test_include_usage_merges_existing_stream_options() -> None:
    raw = chat(stream=True, stream_options={"continuous_usage_stats": True})
    new = rewrite_body(parse_body(raw, CHAT), raw, model=None, include_usage=True)
    assert new is not None
    assert json.loads(new)["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


def test_model_rewrite_keeps_unicode() -> None:
    raw = json.dumps({"model": "alias", "messages": [{"role": "user", "content": "héllo ☃"}]}).encode()
    new = rewrite_body(parse_body(raw, CHAT), raw, model="real/model", include_usage=False)
    assert new is not None
    assert json.loads(new)["model"] == "real/model"
    assert json.loads(new)["messages"][0]["content"] == "héllo ☃"
