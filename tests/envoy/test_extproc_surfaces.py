"""Anthropic Messages and OpenAI Responses answers through the ext_proc exchange: usage read by each surface's
rules (Messages ``input_tokens`` net of the cache), the first token at the surface's first generated event (a
Responses stream's ``response.created`` comes before the prefill), the request body untouched (these streams carry
their usage: nothing to ask for), and a Responses answer remembered with its engine for ``previous_response_id``."""

from __future__ import annotations

import json
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from cognitora.core.outcome import Outcome
from cognitora.decision import Decision
from cognitora.request import RouteRequest
from cognitora.surface_entry import SurfaceReader
from envoy_extproc.addresses import AddressBook
from envoy_extproc.processor import Exchange
from envoy_extproc.settings import parse_settings

ENGINE = "10.0.0.1:8000"


class Attempt:
    def __init__(self) -> None:
        self.endpoint = ENGINE
        self.outcomes: list[Outcome] = []
        self.first_tokens = 0

    def first_token(self) -> None:
        self.first_tokens += 1

    def finish(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    def rerouted(self, endpoint: str, outcome: Outcome) -> Attempt:
        return self

    async def settled(self) -> None:
        pass


class Core:
    def __init__(self) -> None:
        self.surfaces = SurfaceReader({})
        self.placed: list[RouteRequest] = []
        self.attempt = Attempt()

    async def admit(self, request: RouteRequest, **_: Any) -> tuple[Decision, Attempt]:
        self.placed.append(request)
        decision = Decision(
            request_id=request.request_id, model=request.model, endpoint=ENGINE, url=None, prompt_tokens=8
        )
        return decision, self.attempt


def headers(**values: str) -> Any:
    message = ep.HttpHeaders()
    for key, value in values.items():
        message.headers.headers.append(base_pb2.HeaderValue(key=key, raw_value=value.encode()))
    return message


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


async def placed(core: Core, path: str, body: dict[str, Any]) -> Exchange:
    exchange = Exchange(core, parse_settings(["--config", "c.yaml"]), AddressBook({}))
    await exchange.on_request_headers(headers(**{":path": path, ":method": "POST"}))
    routed = await exchange.on_request_body(ep.HttpBody(body=json.dumps(body).encode(), end_of_stream=True))
    assert not routed.request_body.response.HasField("body_mutation")  # sent as the client wrote it
    exchange.delivered()
    await exchange.on_response_headers(headers(**{":status": "200", "content-type": "text/event-stream"}))
    return exchange


async def test_a_messages_stream_is_read_by_anthropic_rules() -> None:
    core = Core()
    body = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    exchange = await placed(core, "/v1/messages", body)
    usage = {"input_tokens": 4, "cache_read_input_tokens": 32, "output_tokens": 0}
    await exchange.on_response_body(ep.HttpBody(body=event("message_start", {"message": {"usage": usage}})))
    assert core.attempt.first_tokens == 0
    await exchange.on_response_body(ep.HttpBody(body=event("content_block_start", {"index": 0})))
    assert core.attempt.first_tokens == 1
    final = {"usage": {"input_tokens": 4, "cache_read_input_tokens": 32, "output_tokens": 5}}
    await exchange.on_response_body(
        ep.HttpBody(body=event("message_delta", final) + event("message_stop", {}), end_of_stream=True)
    )
    (outcome,) = core.attempt.outcomes
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens) == (36, 5, 32)


async def test_a_responses_stream_has_its_first_token_after_the_prefill_and_is_remembered() -> None:
    core = Core()
    body = {"model": "m", "instructions": "Be brief.", "input": "2+2?", "stream": True}
    exchange = await placed(core, "/v1/responses", body)
    for name in ("response.created", "response.in_progress"):  # vLLM sends these before it prefills
        await exchange.on_response_body(ep.HttpBody(body=event(name, {"response": {"id": "resp_9"}})))
    assert core.attempt.first_tokens == 0
    await exchange.on_response_body(ep.HttpBody(body=event("response.output_text.delta", {"delta": "4"})))
    assert core.attempt.first_tokens == 1
    done = {
        "response": {
            "id": "resp_9",
            "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "4"}]}],
            "usage": {"input_tokens": 40, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 16}},
        }
    }
    await exchange.on_response_body(ep.HttpBody(body=event("response.completed", done), end_of_stream=True))
    (outcome,) = core.attempt.outcomes
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens) == (40, 1, 16)
    # The follow-up is keyed with the whole conversation and pinned to the engine that holds it.
    follow = {"model": "m", "input": "3+3?", "previous_response_id": "resp_9"}
    await placed(core, "/v1/responses", follow)
    request = core.placed[-1]
    assert request.pinned_endpoint == ENGINE and request.may_pin
    assert request.messages is not None and {"role": "assistant", "content": "4"} in request.messages
