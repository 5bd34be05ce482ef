"""The intent rewrite's ``embeddings`` classifier kind against a real vLLM 0.32 (CPU) serving SmolLM2-135M as an
embedding model (``--runner pooling --convert embed``), through each gateway (Envoy + ``cognitora extproc``, and the
LiteLLM proxy) in front of the session's two real generating engines.

The policy rewrites ``auto`` to ``small`` (engine 0) for a translation request and to ``code`` (engine 1) for a
coding question, with the ``embeddings`` kind pointed at the real engine's ``/v1/embeddings``. What is checked is the
path, from the embedding engine's own counter (``vllm:request_success_total``: one per text it embedded):

- the policy's examples are embedded when the gateway starts, before any request;
- a new prompt costs one embedding, and its intent's model and engine serve it (``x-cognitora-model``, the engine the
  gateway names); the same prompt again costs none (the per-prompt cache);
- the gateway's decision log says the classifier decided without falling back to the local ``tfidf``.

SmolLM2's last-token embeddings are not a good sentence embedding, and their quality is not what this tests: the
prompts are two of the policy's own examples, which a logistic regression fitted on them classifies with certainty
(probabilities above 0.95 when measured here), so the expected intent does not depend on the model's quality.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cognitora_sim.harness.process import wait_until
from cognitora_sim.harness.real_engines.launch import EMBED_MODEL, RealEngineFleet, start_embedding_engine
from cognitora_sim.harness.real_engines.provision import RealEngineInstall
from tests.real_engines.stack import ALIASES, Gateway, envoy_gateway, litellm_gateway, vllm_upstreams
from tests.real_engines.traffic import Reply
from tests.support.intent_fleet import CODE_EXAMPLES, TRANSLATE_EXAMPLES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CODE, SMALL = ALIASES
TRANSLATION = TRANSLATE_EXAMPLES[1]  # "Traduis en allemand : merci beaucoup"
CODING = CODE_EXAMPLES[0]  # "How do I read a JSON file in Python?"
EXAMPLES = len(TRANSLATE_EXAMPLES) + len(CODE_EXAMPLES)


def policy(embedder: RealEngineFleet) -> dict[str, Any]:
    return {
        "rewrite": ["auto"],
        "default": SMALL,
        "intents": [
            {"name": "translate", "target": SMALL, "examples": TRANSLATE_EXAMPLES},
            {"name": "code", "target": CODE, "examples": CODE_EXAMPLES},
        ],
        "classifier": {
            "kind": "embeddings",
            "min_score": 0.0,
            # One CPU thread on 2 shared cores embeds a short prompt in 0.1 to 2 s: a budget this test cannot miss,
            # so what decides is the engine's vectors (the fallback is tested against the simulator).
            "embeddings": {"url": f"{embedder.urls[0]}/v1", "model": EMBED_MODEL, "timeout_ms": 30_000},
        },
    }


def embedded(embedder: RealEngineFleet) -> int:
    """Texts the embedding engine has embedded: its own ``vllm:request_success_total`` (every finish reason)."""
    lines = httpx.get(f"{embedder.urls[0]}/metrics", timeout=10).text.splitlines()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total")))


def embedded_at_least(embedder: RealEngineFleet, n: int, timeout_s: float = 10.0) -> int:
    """``embedded`` once it reaches ``n`` (the engine updates its counters beside its answer, not before it)."""
    wait_until(lambda: embedded(embedder) >= n, timeout_s, f"{n} texts embedded")
    return embedded(embedder)


@pytest.fixture(scope="module")
def embedder(
    request: pytest.FixtureRequest, real_install: RealEngineInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealEngineFleet]:
    # The session's generating engines start (if no module before has started them) while this one does.
    work = tmp_path_factory.mktemp("real-vllm-embed")
    with start_embedding_engine(
        work, install=real_install, while_starting=lambda: request.getfixturevalue("real_fleet")
    ) as fleet:
        print("real vLLM embedding engine ready in", fleet.engines[0].started_s, "s")
        yield fleet


@dataclass
class Rewriting:
    gateway: Gateway
    embedder: RealEngineFleet
    engine_of: dict[str, str]
    """Model -> the endpoint id of the one engine that serves it."""
    embedded_before_start: int


@pytest.fixture(scope="module", params=["envoy", "litellm"])
def rewriting(
    request: pytest.FixtureRequest,
    embedder: RealEngineFleet,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Rewriting]:
    # Not an argument: pytest would set the session's fleet up before the module's embedder, one after the other.
    real_fleet: RealEngineFleet = request.getfixturevalue("real_fleet")
    work = tmp_path_factory.mktemp(f"real-intent-{request.param}")
    upstreams = vllm_upstreams(real_fleet)
    groups = {SMALL: [upstreams[0]], CODE: [upstreams[1]]}
    before = embedded(embedder)
    start = envoy_gateway if request.param == "envoy" else litellm_gateway
    started = time.monotonic()
    with start(upstreams, redis_server_url, work, groups, policy(embedder)) as gw:
        print(f"{request.param} gateway ready in {time.monotonic() - started:.1f} s")
        engine_of = {model: ups[0].endpoint_id for model, ups in groups.items()}
        yield Rewriting(gw, embedder, engine_of, before)


def ask(rewriting: Rewriting, text: str) -> tuple[Reply, str]:
    """A chat request for ``auto``; the reply and the model the gateway says served it."""
    client = rewriting.gateway.client
    with httpx.Client(base_url=client.url, headers=client.headers, timeout=120) as http:
        body = {"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
        r = http.post("/v1/chat/completions", json=body)
    reply = Reply(r.status_code, client.engine_of(r), error="" if r.status_code == 200 else r.text)
    return reply, r.headers.get("x-cognitora-model", "")


def test_the_embeddings_kind_rewrites_by_a_real_engines_vectors(rewriting: Rewriting) -> None:
    embedder = rewriting.embedder
    # The examples were embedded when the gateway started (it refuses to start otherwise), each once.
    expected = rewriting.embedded_before_start + EXAMPLES
    assert embedded_at_least(embedder, expected, timeout_s=30) == expected

    for text, model in ((TRANSLATION, SMALL), (CODING, CODE)):
        before = embedded(embedder)
        reply, served = ask(rewriting, text)
        assert reply.status == 200, reply.error
        assert served == model, text
        assert reply.engine == rewriting.engine_of[model], (text, reply.engine)
        assert embedded_at_least(embedder, before + 1) == before + 1  # this prompt, embedded by the engine once

    # The same prompt again: answered from the classifier's cache, no call to the engine.
    before = embedded(embedder)
    reply, served = ask(rewriting, CODING)
    assert reply.status == 200 and served == CODE and reply.engine == rewriting.engine_of[CODE]
    assert embedded(embedder) == before

    # The decision log: the classifier decided both, from the engine's vectors (no fallback to the local tfidf).
    log = Path(rewriting.gateway.log.log_path).read_text(errors="replace")
    decided = [line for line in log.splitlines() if "'auto' -> " in line and "by classifier" in line]
    assert any(f"-> '{SMALL}': intent 'translate' by classifier" in line for line in decided), log[-3000:]
    assert any(f"-> '{CODE}': intent 'code' by classifier" in line for line in decided), log[-3000:]
    assert not any("local tfidf" in line for line in decided), decided
