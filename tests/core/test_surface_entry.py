"""The core's one entry point from a request's path and body to its ``RouteRequest`` (``cognitora.surface_entry``):
the path decides the surface, a body its rules cannot read is an ``InvalidRequest`` naming the field, and a
Responses follow-up is pinned to the engine that answered the response it continues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cognitora.intent.rules import features
from cognitora.request import MAX_TOKENS_LIMIT, InvalidRequest, Surface
from cognitora.surface_entry import SurfaceReader, is_count_tokens, route_request, surface_under_prefix
from kvstate.prompt import ChatTokenizer, PromptKeyer

MESSAGES = {"model": "m", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("path", "surface"),
    [
        ("/v1/chat/completions", "chat"),
        ("/v1/completions", "completions"),
        ("/v1/messages", "messages"),
        ("/v1/messages/count_tokens", "messages"),
        ("/v1/responses", "responses"),
        ("/v1/embeddings", "embeddings"),
        ("/api/v1/messages?beta=true", "messages"),
        ("/llm/team-a/responses/", "responses"),
        ("/v1/models", None),
        ("/v1/responses/resp_1", None),
    ],
)
def test_the_path_decides_the_surface(path: str, surface: str | None) -> None:
    assert surface_under_prefix(path) == surface


def test_count_tokens_is_told_apart() -> None:
    assert is_count_tokens("/v1/messages/count_tokens") and is_count_tokens("/api/v1/messages/count_tokens/?x=1")
    assert not is_count_tokens("/v1/messages")


def test_a_messages_body_becomes_the_chat_the_engine_renders() -> None:
    read = SurfaceReader({}).read("/v1/messages", MESSAGES)
    assert read is not None
    request = route_request(read)
    assert request.surface is Surface.MESSAGES and request.model == "m" and request.max_tokens == 8
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert request.surface_request is read and request.pinned_endpoint is None


def test_embeddings_become_prompts() -> None:
    read = SurfaceReader({}).read("/v1/embeddings", {"model": "m", "input": ["a", "b"]})
    assert read is not None
    request = route_request(read)
    assert request.surface is Surface.EMBEDDINGS and request.prompt == ["a", "b"] and request.messages is None


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/messages", [1, 2], "body"),
        ("/v1/messages", {**MESSAGES, "model": ""}, "model"),
        ("/v1/messages", {k: v for k, v in MESSAGES.items() if k != "max_tokens"}, "max_tokens"),
        ("/v1/messages", {**MESSAGES, "max_tokens": MAX_TOKENS_LIMIT + 1}, "max_tokens"),
        ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "?"}]}]}, "messages[0]"),
        ("/v1/responses", {"model": "m", "input": [{"type": "nope"}]}, "input[0]"),
        ("/v1/responses", {"model": "m", "input": "x", "max_output_tokens": 2.5}, "max_output_tokens"),
        ("/v1/embeddings", {"model": "m", "input": {"x": 1}}, "input"),
    ],
)
def test_a_body_its_surface_cannot_read_names_the_field(path: str, body: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as bad:
        SurfaceReader({}).read(path, body)
    assert bad.value.param.startswith(param), (bad.value.param, bad.value.message)


def test_another_path_is_no_surface() -> None:
    assert SurfaceReader({}).read("/v1/models", {"model": "m"}) is None


def test_a_responses_follow_up_is_pinned_to_the_engine_that_answered() -> None:
    reader = SurfaceReader({})
    first = reader.read("/v1/responses", {"model": "m", "instructions": "Be brief.", "input": "2+2?"})
    assert first is not None
    reader.remember_response(first, "resp_1", ["4"], "10.0.0.7:8000")
    follow = reader.read("/v1/responses", {"model": "m", "input": "3+3?", "previous_response_id": "resp_1"})
    assert follow is not None and follow.history_resolved
    request = route_request(follow)
    assert request.pinned_endpoint == "10.0.0.7:8000" and request.may_pin
    assert request.messages is not None and {"role": "assistant", "content": "4"} in request.messages
    unknown = reader.read("/v1/responses", {"model": "m", "input": "x", "previous_response_id": "resp_other"})
    assert unknown is not None and route_request(unknown).pinned_endpoint is None


def test_the_model_template_decides_how_messages_render(smollm2_dir: Path) -> None:
    keyer = PromptKeyer("m", 16, ChatTokenizer(smollm2_dir / "tokenizer.json"), key_memo_bytes=0)
    reader = SurfaceReader({"m": keyer})
    assert reader.traits("m") is reader.traits("m")  # probed once
    read = reader.read("/v1/messages", MESSAGES, model="m")
    assert read is not None and read.chat is not None


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 4,
                "system": [{"type": "text", "text": "You review code."}],
                "messages": [
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": [{"type": "text", "text": "write a sort in Rust"}]},
                ],
                "tools": [{"name": "run", "input_schema": {"type": "object"}}],
            },
        ),
        (
            "/v1/responses",
            {
                "model": "m",
                "instructions": "You review code.",
                "input": [
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": [{"type": "input_text", "text": "write a sort in Rust"}]},
                ],
                "tools": [{"type": "function", "name": "run", "parameters": {"type": "object"}}],
            },
        ),
    ],
)
def test_intent_rules_read_the_last_user_turn_whatever_the_surface(path: str, body: dict[str, Any]) -> None:
    read = SurfaceReader({}).read(path, body)
    assert read is not None
    found = features(route_request(read), 10_000)
    assert found.last_user == "write a sort in Rust" and found.system == "You review code."
    assert found.first_user == "first" and found.has_tools
