"""A mixed real fleet behind each gateway: one real vLLM (KV events) and one real llama.cpp (``llama_cpp.server`` of
``llama-cpp-python``, same GGUF weights; no events, no metrics: ``engine: openai``, the approximate path).

Both engines are placed; each prompt keeps going where it first went: to vLLM because its KV events say the blocks
are there, to llama.cpp because the router's own routing history says so; ``cognitora explain`` says which basis
each estimate has.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from cognitora_sim.harness.real_engines.launch import RealEngineFleet
from cognitora_sim.harness.real_engines.llamacpp import LlamaCppServer, provision_llamacpp, start_llamacpp
from cognitora_sim.harness.real_engines.provision import ProvisionError
from tests.real_engines.stack import Gateway, Upstream, envoy_gateway, explain, litellm_gateway, vllm_upstreams
from tests.real_engines.traffic import messages
from tests.support.gateway_log import decision_lines

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # the first test may build llama.cpp (~5 min)

SYSTEM_WORDS = 250
"""~1,550 tokens of system prompt: the engines' 2,048-token context holds it with the question and the answer."""
CPU_PREFILL_PRIOR = 100.0
"""Both engines' prefill prior, tokens/s: about what one core of this machine does (llama.cpp: 55 measured while
loaded, 721 tokens in 13.3 s; vLLM: 100-260). llama.cpp publishes no metrics, and a fresh vLLM has finished nothing
to learn from yet: left at the placement default, a GPU's figure, an engine looks many times faster than it is."""


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    try:
        install = provision_llamacpp(say=print)
    except ProvisionError as exc:
        pytest.fail(f"real llama.cpp could not be provisioned on this machine: {exc}", pytrace=False)
    with start_llamacpp(tmp_path_factory.mktemp("llamacpp"), install) as server:
        print("llama_cpp.server ready in", server.started_s, "s")
        yield server


@pytest.fixture(scope="module", params=["envoy", "litellm"])
def mixed(
    request: pytest.FixtureRequest,
    real_fleet: RealEngineFleet,
    llamacpp: LlamaCppServer,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Gateway, list[Upstream]]]:
    upstreams = [
        replace(vllm_upstreams(real_fleet)[0], prefill_tokens_per_s=CPU_PREFILL_PRIOR),
        Upstream(llamacpp.url, llamacpp.endpoint_id, "openai", prefill_tokens_per_s=CPU_PREFILL_PRIOR),
    ]
    start = envoy_gateway if request.param == "envoy" else litellm_gateway
    with start(upstreams, redis_server_url, tmp_path_factory.mktemp(f"mixed-{request.param}")) as gateway:
        yield gateway, upstreams


def ask(salt: str, n: int) -> dict[str, object]:
    """A question after a long system prompt (~1,550 of the prompt's ~1,600 tokens), streamed.

    Long, because staying must be the faster choice, and it is only when the prefix is long: vLLM's CPU backend
    prefills ~14x faster than llama.cpp on one thread here (1,725 against 122 tokens/s, learned in a quiet run), so
    with the 700-token prompts of the other tests a cold prefill on vLLM (0.42 s) beat llama.cpp's ~55 uncached
    tokens (0.45 s) and the router rightly moved a llama.cpp-homed question (a local CI run failed so). Streamed,
    because llama.cpp reports nothing: the router learns its rate from the first tokens it times, where a
    non-streamed answer times prefill and decode together and teaches nothing (the prior would decide)."""
    return {"messages": messages(salt, n, words=SYSTEM_WORDS), "max_tokens": 4, "stream": True}


def decisions(gateway: Gateway) -> str:
    """The gateway log's decision lines (what it predicted per engine, and why it picked one), the first round's
    included: a failure shows them. The LiteLLM proxy logs much besides, so the whole log is read."""
    return decision_lines(gateway.log.log_tail(1_000_000), 16000)


def test_both_engines_placed_and_each_prompt_stays_where_it_went(
    mixed: tuple[Gateway, list[Upstream]], tmp_path: Path
) -> None:
    gateway, (vllm, llama) = mixed
    salts = [f"{gateway.client.name}-mixed-{i}" for i in range(4)]
    with ThreadPoolExecutor(len(salts)) as pool:  # four new prompts at once: the queue spreads them
        first = list(
            pool.map(
                lambda s: gateway.client.send("/v1/chat/completions", ask(s, 0)),
                salts,
            )
        )
    assert all(r.status == 200 for r in first), [r.error for r in first]
    home = {s: r.engine for s, r in zip(salts, first, strict=True)}
    assert set(home.values()) == {vllm.endpoint_id, llama.endpoint_id}, home

    for n in (1, 2):
        for s in salts:
            reply = gateway.client.send("/v1/chat/completions", ask(s, n))
            assert reply.status == 200, reply.error
            if reply.engine != home[s]:
                # What the shared store says of this prompt now, per engine (cached tokens and on what basis): the
                # routing history this test relies on, as Redis holds it, beside the proxy's own decisions.
                now = explain(gateway.config_path, gateway.model, messages(s, n, words=SYSTEM_WORDS), tmp_path).text
                pytest.fail(
                    f"{s} question {n} went to {reply.engine}, its prompt is on {home[s]} (vLLM is "
                    f"{vllm.endpoint_id}, llama.cpp {llama.endpoint_id}; first answers: {home}); the gateway's "
                    f"decisions:\n{decisions(gateway)}\n`cognitora explain` of that question now:\n{now}",
                    pytrace=False,
                )

    on_llama = next(s for s in salts if home[s] == llama.endpoint_id)
    explained = explain(gateway.config_path, gateway.model, messages(on_llama, 3, words=SYSTEM_WORDS), tmp_path)
    assert explained.endpoint == llama.endpoint_id and explained.cached_tokens > 0, explained.text
    assert f"{llama.endpoint_id}: " in explained.text and "routing history" in explained.text, explained.text
    assert f"{vllm.endpoint_id}: " in explained.text and "KV events" in explained.text, explained.text
