"""The ``x-cognitora-model`` response header through the ext_proc exchange, when the intent policy rewrote a
request that then burst: the client is told the model that actually answered (the cloud's, or the local one when
the cloud failed and Envoy retried the request on an engine)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from cognitora.core.outcome import Outcome
from cognitora.decision import CloudPick, Decision
from cognitora.intent.rewrite import Rewrite
from cognitora.request import RouteRequest
from envoy_extproc.addresses import AddressBook
from envoy_extproc.processor import Exchange
from envoy_extproc.settings import parse_settings

ENGINE = "10.0.0.1:8000"
CLOUD_ADDRESS = "203.0.113.7:443"


class FakeAttempt:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.outcomes: list[Outcome] = []

    def first_token(self) -> None:
        pass

    def finish(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    def rerouted(self, endpoint: str, outcome: Outcome) -> FakeAttempt:
        return FakeAttempt(endpoint)

    async def settled(self) -> None:
        pass


class BurstingCore:
    """A core whose intent policy sent ``auto`` to the ``code`` model, which then burst to a cloud."""

    async def admit(self, request: RouteRequest, **_: Any) -> tuple[Decision, FakeAttempt]:
        decision = Decision(
            request_id=request.request_id,
            model="code",
            endpoint="cloud:sim-cloud",
            url=None,
            prompt_tokens=8,
            rewrite=Rewrite(requested="auto", model="code", how="rule", intent="coding"),
            cloud=CloudPick(
                target="sim-cloud",
                model="gpt-4o-mini",
                url="https://cloud.test/v1",
                reason="saturated",
                team="research",
                local_fallbacks=(ENGINE,),
            ),
        )
        return decision, FakeAttempt("cloud:sim-cloud")


def header_map(**values: str) -> Any:
    message = ep.HttpHeaders()
    for key, value in values.items():
        message.headers.headers.append(base_pb2.HeaderValue(key=key, raw_value=value.encode()))
    return message


def set_headers(answer: Any) -> dict[str, str]:
    mutation = answer.response_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


@pytest.mark.parametrize(("answered_by", "model"), [(CLOUD_ADDRESS, "gpt-4o-mini"), (ENGINE, "code")])
async def test_the_served_model_header_names_who_answered_a_rewritten_burst(answered_by: str, model: str) -> None:
    exchange = Exchange(BurstingCore(), parse_settings(["--config", "c.yaml"]), AddressBook({}))
    await exchange.on_request_headers(header_map(**{":path": "/v1/chat/completions", ":method": "POST"}))
    body = b'{"model": "auto", "messages": [{"role": "user", "content": "write a sort"}]}'
    routed = await exchange.on_request_body(ep.HttpBody(body=body, end_of_stream=True))
    assert b"gpt-4o-mini" in routed.request_body.response.body_mutation.body  # the cloud's name went upstream
    answer = await exchange.on_response_headers(
        header_map(**{":status": "200", "content-type": "application/json", "x-cognitora-upstream-host": answered_by})
    )
    assert set_headers(answer).get("x-cognitora-model") == model
