"""A decision Envoy never received is not charged: under load the ext_proc ``message_timeout`` (2 s in the example)
can fire after the service admitted a request and before its answer reached Envoy. Envoy then answers the client
503 itself and forwards nothing; the budget reservation must be given back, not settled at its estimate (a
1,000-request burst through an overloaded service once charged teams 16,000 tokens for requests none of them got).
A decision that did reach Envoy and then lost its client before any response is still charged (the engine may
have worked on it: never counted short)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from cognitora.config import config_from_dict
from cognitora.core.router import Router
from cognitora.identity import Identity
from envoy_extproc.addresses import AddressBook
from envoy_extproc.processor import Exchange
from envoy_extproc.settings import parse_settings
from kvstate.memory_store import MemoryStore

MODEL = "smollm2"


def header_map(**values: str) -> ep.HttpHeaders:
    message = ep.HttpHeaders()
    for key, value in values.items():
        message.headers.headers.append(base_pb2.HeaderValue(key=key, raw_value=value.encode()))
    return message


async def team_used(router: Router) -> int:
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    r = gate.planner.plan("-", Identity(team="alpha"), MODEL, gate.planner.usage(MODEL, 0, 0))
    [value] = await gate.ledger.counter_values(list(r.counters), int(time.time() * 1000))
    return value


@pytest.mark.parametrize("reached_envoy", [False, True])
async def test_a_decision_envoy_never_received_charges_nothing(smollm2_dir: Path, reached_envoy: bool) -> None:
    config = config_from_dict(
        {
            "budgets": {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": 100_000}]}}},
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": "http://10.0.0.1:8000"}],
                }
            ],
        }
    )
    router = Router(config, MemoryStore())
    settings = parse_settings(["--config", "c.yaml", "--trusted-team-header", "x-cognitora-team"])
    exchange = Exchange(router, settings, AddressBook({}))
    await exchange.on_request_headers(
        header_map(**{":path": "/v1/chat/completions", ":method": "POST", "x-cognitora-team": "alpha"})
    )
    body = b'{"model": "smollm2", "max_tokens": 50, "messages": [{"role": "user", "content": "what is a KV cache?"}]}'
    routed = await exchange.on_request_body(ep.HttpBody(body=body, end_of_stream=True))
    assert routed.HasField("request_body")  # placed: where to send it
    assert await team_used(router) > 50  # reserved
    if reached_envoy:
        exchange.delivered()  # the answer was written; then the stream ended before any response came back
    await exchange.close()  # the stream ended (Envoy gave up on us, or the client left)
    used = await team_used(router)
    if reached_envoy:
        assert used > 50  # it may have run on the engine: charged at its estimate, never counted short
    else:
        assert used == 0
        assert router.open_attempts() == []  # its in-flight count is released too
    await router.close()
