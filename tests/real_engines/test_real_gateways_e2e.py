"""Real vLLM 0.32 (CPU, SmolLM2-135M) behind each gateway: Envoy + ``cognitora extproc``, and the LiteLLM proxy,
both in Redis mode with ``cognitora collector`` fed by the engines' own KV events and ``/metrics``.

What an operator asks, answered by the engines themselves (their ``vllm:prefix_cache_hits_total`` and the
``cached_tokens`` they report), not by the simulator:

- requests sharing a system prompt land on the engine that holds it, and that engine counts the hit (chat and
  completions, streamed and not);
- ``cognitora explain`` predicts exactly the cached tokens the engine then reports;
- a tool-calling request goes through;
- an engine killed (SIGKILL) mid-load: requests go to the other; restarted, what the store held for it is purged;
- a client's W3C trace goes on through Cognitora's decision into vLLM's own request span (OTLP, ``otlp_receiver``).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from cognitora_sim.harness.process import wait_until
from cognitora_sim.harness.real_engines.launch import VLLM_SERVICE, RealEngineFleet
from tests.real_engines.stack import (
    Gateway,
    cached_on,
    envoy_gateway,
    explain,
    litellm_gateway,
    tracing_env,
    vllm_upstreams,
)
from tests.real_engines.traffic import Reply, messages, prefix_cache_hits, question, system_prompt
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module", params=["envoy", "litellm"])
def gateway(
    request: pytest.FixtureRequest,
    real_fleet: RealEngineFleet,
    redis_server_url: str,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp(f"real-{request.param}")
    start = envoy_gateway if request.param == "envoy" else litellm_gateway
    # Decision spans go to the receiver the session's engines export theirs to (conftest.py).
    with start(vllm_upstreams(real_fleet), redis_server_url, work, env=tracing_env(otlp_receiver.traces_url)) as gw:
        yield gw


def hits(fleet: RealEngineFleet) -> dict[str, float]:
    return {e.endpoint_id: prefix_cache_hits(e.url) for e in fleet.engines}


def sent_with_hits(fleet: RealEngineFleet, send: Any) -> tuple[Reply, dict[str, float]]:
    """One request, and how much each engine's own prefix-cache hit counter grew while it ran."""
    before = hits(fleet)
    reply: Reply = send()
    assert reply.status == 200, reply.error
    after = hits(fleet)
    return reply, {e: after[e] - before[e] for e in after}


def salt(gateway: Gateway, what: str) -> str:
    return f"{gateway.client.name}-{what}"


def test_shared_prompt_lands_where_it_is_cached_and_the_engine_counts_the_hit(
    gateway: Gateway, real_fleet: RealEngineFleet
) -> None:
    client = gateway.client
    chat_salt = salt(gateway, "chat")
    first = client.send("/v1/chat/completions", {"messages": messages(chat_salt, 0), "max_tokens": 4})
    assert first.status == 200, first.error
    home = first.engine
    assert home in real_fleet.endpoint_ids, first
    # Wait for the engine's KV events to reach the store before relying on them (they are asynchronous).
    wait_until(
        lambda: cached_on(gateway.config_path, gateway.model, messages(chat_salt, 1), home) > 0,
        30,
        "the first request's blocks in the store",
    )
    for n, stream in ((1, False), (2, True)):
        body = {"messages": messages(chat_salt, n), "max_tokens": 4, "stream": stream}
        reply, grew = sent_with_hits(real_fleet, lambda b=body: client.send("/v1/chat/completions", b))
        assert reply.engine == home, f"chat {n} (stream={stream}) went to {reply.engine}, its prompt is on {home}"
        # The system prompt (~570 tokens: 17 blocks of 32) was served from the engine's cache, as it counts it.
        assert reply.cached_tokens >= 512, reply
        assert grew[home] == reply.cached_tokens, (grew, reply)
        assert all(v == 0 for e, v in grew.items() if e != home), grew

    text_salt = salt(gateway, "text")
    prefix = system_prompt(text_salt)
    first = client.send("/v1/completions", {"prompt": prefix + question(text_salt, 0), "max_tokens": 4})
    assert first.status == 200, first.error
    text_home = first.engine
    wait_until(
        lambda: cached_on(gateway.config_path, gateway.model, prefix + question(text_salt, 9), text_home) > 0,
        30,
        "the first completion's blocks in the store",
    )
    for n, stream in ((1, True), (2, False)):
        body = {"prompt": prefix + question(text_salt, n), "max_tokens": 4, "stream": stream}

        def send(b: dict[str, Any] = body) -> Reply:
            return client.send("/v1/completions", b)

        reply, grew = sent_with_hits(real_fleet, send)
        # (LiteLLM names no engine on a streamed text completion: the engines' own counters tell where it ran.)
        assert reply.engine in (text_home, ""), f"completion {n} went to {reply.engine}, its prompt is on {text_home}"
        assert reply.cached_tokens >= 512 and grew[text_home] == reply.cached_tokens, (grew, reply)
        assert all(v == 0 for e, v in grew.items() if e != text_home), grew


def test_explain_predicts_the_cached_tokens_the_engine_reports(
    gateway: Gateway, real_fleet: RealEngineFleet, tmp_path: Path
) -> None:
    s = salt(gateway, "explain")
    warm = gateway.client.send("/v1/chat/completions", {"messages": messages(s, 0), "max_tokens": 2})
    assert warm.status == 200, warm.error
    ask = messages(s, 1)
    explained = explain(gateway.config_path, gateway.model, ask, tmp_path)

    def stored() -> bool:
        nonlocal explained
        explained = explain(gateway.config_path, gateway.model, ask, tmp_path)
        return explained.cached_tokens > 0

    wait_until(stored, 30, "cognitora explain to see the warmed prompt cached")
    assert explained.endpoint == warm.engine, explained.text
    reply, grew = sent_with_hits(
        real_fleet, lambda: gateway.client.send("/v1/chat/completions", {"messages": ask, "max_tokens": 2})
    )
    # Token-exact: the router's keys and vLLM's blocks agree on every token.
    assert reply.engine == explained.endpoint
    assert reply.prompt_tokens == explained.prompt_tokens, (reply, explained.text)
    assert reply.cached_tokens == explained.cached_tokens == grew[reply.engine], (reply, grew, explained.text)


def test_tool_calling_request(gateway: Gateway) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    body = {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 40,
    }
    reply = gateway.client.send("/v1/chat/completions", body)
    assert reply.status == 200, reply.error
    message = reply.body["choices"][0]["message"]
    # The engine honoured the named tool choice: its hermes parser returns the call, or (SmolLM2-135M rarely
    # finishes a well-formed call within max_tokens) the constrained output opens the call to that function.
    calls = message.get("tool_calls") or []
    named = [c["function"]["name"] for c in calls] or [
        json.loads(message["content"].split("<tool_call>", 1)[1].split(",", 1)[0] + "}")["name"]
    ]
    assert named == ["get_weather"], message


def test_engine_killed_mid_load_is_avoided_then_purged(gateway: Gateway, real_fleet: RealEngineFleet) -> None:
    s = salt(gateway, "kill")
    warm = gateway.client.send("/v1/chat/completions", {"messages": messages(s, 0), "max_tokens": 2})
    assert warm.status == 200, warm.error
    victim = real_fleet.endpoint_ids.index(warm.engine)
    survivor = real_fleet.endpoint_ids[1 - victim]
    wait_until(lambda: cached_on(gateway.config_path, gateway.model, messages(s, 1), warm.engine) > 0, 30, "stored")

    killed = threading.Event()
    replies: list[tuple[bool, Reply]] = []
    lock = threading.Lock()

    def one(n: int) -> None:
        sent_after_kill = killed.is_set()
        reply = gateway.client.send("/v1/chat/completions", {"messages": messages(s, n), "max_tokens": 24})
        with lock:
            replies.append((sent_after_kill, reply))

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(one, n) for n in range(1, 4)]  # in flight on the prompt's engine
        wait_until(lambda: _running(real_fleet.urls[victim]) >= 1, 30, "requests running on the prompt's engine")
        real_fleet.kill(victim)
        killed.set()
        futures += [pool.submit(one, n) for n in range(4, 10)]
        for f in futures:
            f.result()
    after = [r for sent_after, r in replies if sent_after]
    assert len(after) == 6
    # Every request sent after the kill is answered, by the survivor.
    assert all(r.status == 200 and r.engine == survivor for r in after), after
    in_flight = [r for sent_after, r in replies if not sent_after]
    # In flight at the kill: LiteLLM retries them elsewhere; Envoy's example retries only what never reached the
    # engine (its retry_on is connect-failure/refused-stream/reset-before-request), so those may fail: at most 3.
    if gateway.client.name == "litellm":
        assert all(r.status == 200 for r in in_flight), in_flight
    assert len(in_flight) == 3

    # Restarted, the engine's cache is empty; the collector resyncs on reconnect and purges what it held.
    real_fleet.restart(victim)
    wait_until(
        lambda: cached_on(gateway.config_path, gateway.model, messages(s, 20), real_fleet.endpoint_ids[victim]) == 0,
        60,
        "the restarted engine's old blocks purged from the store",
    )


def _running(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_clients_trace_goes_on_through_the_decision_into_vllms_request_span(
    gateway: Gateway, real_fleet: RealEngineFleet, otlp_receiver: OtlpReceiver
) -> None:
    """The client's ``traceparent`` is the parent of Cognitora's ``cognitora.decide`` span; the gateway sends the
    engine a ``traceparent`` naming that span, and vLLM's own ``llm_request`` span is its child, in the same trace."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    client = dataclasses.replace(
        gateway.client, headers={**gateway.client.headers, "traceparent": f"00-{trace_id}-{parent}-01"}
    )
    reply = client.send("/v1/chat/completions", {"messages": messages(salt(gateway, "trace"), 0), "max_tokens": 3})
    assert reply.status == 200, reply.error

    decide = otlp_receiver.wait_for(lambda s: s.trace_id == trace_id and s.name == "cognitora.decide", 30)
    engine = otlp_receiver.wait_for(lambda s: s.trace_id == trace_id and s.name == "llm_request", 30)
    service = {"envoy": "cognitora-extproc", "litellm": "cognitora-litellm"}[gateway.client.name]
    assert (decide.service, decide.parent_span_id) == (service, parent), decide
    assert decide.attributes["cognitora.endpoint"] == reply.engine, (decide, reply)
    # vLLM continued exactly the traceparent the gateway forwarded: the decision's span, not the client's.
    assert (engine.service, engine.kind, engine.parent_span_id) == (VLLM_SERVICE, "SPAN_KIND_SERVER", decide.span_id)
    # ... on the engine Cognitora picked (vLLM's resource names its API server's pid), for this very request (the
    # response id is vLLM's request id) ...
    picked = next(e for e in real_fleet.engines if e.endpoint_id == reply.engine)
    assert engine.resource["vllm.process_id"] == str(picked.process.pid), (engine.resource, reply.engine)
    attrs = engine.attributes
    assert attrs["gen_ai.request.id"] == reply.body["id"], (attrs, reply.body)
    assert attrs["gen_ai.request.max_tokens"] == 3, attrs
    # ... whose prompt Cognitora tokenized as the engine did.
    assert attrs["gen_ai.usage.prompt_tokens"] == decide.attributes["cognitora.prompt_tokens"] == reply.prompt_tokens
    assert sorted(s.name for s in otlp_receiver.in_trace(trace_id)) == ["cognitora.decide", "llm_request"]
