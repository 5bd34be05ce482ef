"""The request rules both gateways share, decided in the core: who the request is for (``cognitora.identity``), the
shape of its body (``cognitora.request.check_body``), and how a cancelled stream is counted
(``cognitora.core.outcome.cancelled_stream``). Each is checked through both adapters' own translation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cognitora.core.outcome import OutcomeKind, cancelled_stream
from cognitora.identity import Claims, Identity, IdentitySource, resolve_identity
from cognitora.request import InvalidRequest, RouteRequest
from envoy_extproc.openai_body import BadRequest, parse_body
from litellm_plugin.translate import route_request

# -- identity -------------------------------------------------------------------------------------------------------


def test_the_most_trusted_source_wins_each_field_whatever_order_the_adapter_hands_them() -> None:
    header = Claims(IdentitySource.ENVOY_HEADER, team="from-header", user="u-header", intent_hint="code")
    verified = Claims(IdentitySource.ENVOY_METADATA, team="from-jwt", priority="batch")
    for claims in ((header, verified), (verified, header)):
        who = resolve_identity(*claims)
        assert who == Identity(
            team="from-jwt",
            user="u-header",
            priority="batch",
            intent_hint="code",
            source=IdentitySource.ENVOY_METADATA,
        )


def test_no_claim_is_an_anonymous_default_priority_identity() -> None:
    who = resolve_identity(Claims(IdentitySource.LITELLM_KEY))
    assert who == Identity() and who.priority == "default" and who.source is IdentitySource.NONE


def test_the_litellm_adapter_hands_the_authenticated_key_and_never_the_body() -> None:
    kwargs = {
        "metadata": {
            "user_api_key_team_id": "team-a",
            "user_api_key_alias": "ci-key",
            "user_api_key_user_id": "alice",
            "user_api_key_metadata": {"cognitora_priority": "batch", "cognitora_intent": "code"},
        },
        "user": "chosen-by-the-client",
    }
    req = route_request("chat", [{"role": "user", "content": "hi"}], None, kwargs, ["a:1"])
    assert req.identity == Identity("team-a", "ci-key", "alice", "batch", "code", IdentitySource.LITELLM_KEY)
    assert (req.team, req.api_key_id, req.user, req.priority) == ("team-a", "ci-key", "alice", "batch")


def test_a_request_built_in_process_names_its_caller_as_the_source() -> None:
    assert RouteRequest(model="m", team="t").identity == Identity(team="t", source=IdentitySource.CALLER)
    assert RouteRequest(model="m").identity.source is IdentitySource.NONE


# -- the body's shape, the same 400 through either gateway --------------------------------------------------------

MALFORMED = [
    ({"model": "m", "messages": []}, "chat", "messages"),
    ({"model": "m", "messages": "hi"}, "chat", "messages"),
    ({"model": "m", "messages": [{"content": "no role"}]}, "chat", "messages[0]"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, "chat", "tools"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]}, "chat", None),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "chat", "stream"),
    ({"model": "m", "prompt": {"not": "a prompt"}}, "completions", "prompt"),
    ({"model": "m", "prompt": "x", "stream": 1}, "completions", "stream"),
]


@pytest.mark.parametrize(("body", "surface", "param"), MALFORMED)
def test_a_malformed_body_gets_the_same_message_through_envoy_and_litellm(
    body: dict[str, Any], surface: str, param: str | None
) -> None:
    path = "/v1/chat/completions" if surface == "chat" else "/v1/completions"
    with pytest.raises(BadRequest) as envoy:
        parse_body(json.dumps(body).encode(), path)
    kwargs = {"proxy_server_request": {"url": f"http://proxy:4000{path}", "body": body}, **body}
    messages = body.get("messages") if isinstance(body.get("messages"), list) else None
    with pytest.raises(InvalidRequest) as litellm:
        route_request("m", messages, None, kwargs, [])
    assert litellm.value.message == envoy.value.message
    assert litellm.value.param == envoy.value.param == (param or "chat_template_kwargs")


def test_a_well_formed_body_passes_both() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [], "stream": True}
    parse_body(json.dumps(body).encode(), "/v1/chat/completions")
    kwargs = {"proxy_server_request": {"url": "http://proxy:4000/v1/chat/completions", "body": body}, **body}
    assert route_request("m", body["messages"], None, kwargs, []).stream is True


# -- a cancelled stream, counted one way ----------------------------------------------------------------------------


def test_a_cancelled_stream_counts_its_usage_when_it_came_else_one_token_a_chunk() -> None:
    by_chunks = cancelled_stream(streamed_chunks=7, detail="gone")
    assert (by_chunks.kind, by_chunks.completion_tokens) == (OutcomeKind.CLIENT_CANCELLED, 7)
    by_usage = cancelled_stream(streamed_chunks=7, usage_completion_tokens=5, prompt_tokens=3, status=200, detail="x")
    assert (by_usage.completion_tokens, by_usage.prompt_tokens, by_usage.status) == (5, 3, 200)
    assert cancelled_stream(streamed_chunks=None, detail="uncounted").completion_tokens is None
