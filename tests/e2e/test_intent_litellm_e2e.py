"""Intent-based and weighted model rewrite through the real LiteLLM proxy: two model groups (``code``, ``small``)
of two simulated engines each, ``routing_strategy: cognitora`` with ``intent: {file: ...}`` (a copy of
examples/intent.yaml the test rewrites), and the plugin's callback, whose pre-call hook changes the model group
before LiteLLM picks a deployment.

What a client sees is what it sees through Envoy (tests/e2e/test_intent_envoy_e2e.py): ``auto`` becomes the code model
for a coding question and the small model for small talk (the ``x-cognitora-model`` header and the engine's
``model`` field say so), an explicit name is kept, the second request of a shared prefix is a cache hit on the same
engine, and a weighted split written into the file while the proxy runs takes effect, sticky per conversation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cognitora_sim.harness.process import wait_until
from tests.support.intent_fleet import (
    CODING_QUESTION,
    MODELS,
    SMALL_TALK,
    TRAVEL,
    TwoModelFleet,
    cached_tokens,
    chat_body,
    exercise_an_operators_policy,
    long_system_prompt,
    two_model_fleet,
)
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proxy:
    client: httpx.Client
    fleet: TwoModelFleet
    log: Path

    def ask(self, body: dict[str, Any]) -> tuple[httpx.Response, str]:
        """The response and the engine that answered it (``host:port`` of LiteLLM's api_base header)."""
        r = self.client.post("/v1/chat/completions", json=body)
        base = r.headers.get("x-litellm-model-api-base", "")
        return r, base.removeprefix("http://").removesuffix("/v1")


def litellm_config(fleet: TwoModelFleet, smollm2_dir: Path) -> dict[str, Any]:
    deployments = [
        {
            "model_name": model,
            "litellm_params": {"model": f"openai/{model}", "api_base": f"{url}/v1", "api_key": "none"},
            "model_info": {
                "id": f"{model}-{i}",
                "cognitora_engine": "vllm",
                "cognitora_kv_events": events,
                "cognitora_kv_events_replay": replay,
            },
        }
        for model in MODELS
        for i, (url, events, replay) in enumerate(_engines(fleet, model))
    ]
    tokenizer = str(smollm2_dir / "tokenizer.json")
    return {
        "model_list": deployments,
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {
                "models": [{"name": m, "tokenizer": tokenizer} for m in MODELS],
                "intent": {"file": str(fleet.policy), "reload_interval_s": 0.2},
                "scrape": {"interval_s": 1.0, "timeout_s": 1.0},
                "placement": {"store_timeout_s": 2.0, "power_ttft_slack_s": 0.0, "power_ttft_slack_ratio": 0.0},
            },
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


def _engines(fleet: TwoModelFleet, model: str) -> list[tuple[str, str, str]]:
    f = fleet.fleets[model]
    return list(zip(f.urls, f.events_addresses, f.replay_addresses, strict=True))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Proxy]:
    work = tmp_path_factory.mktemp("intent-litellm")
    with two_model_fleet(work, smollm2_dir) as fleet:
        config = work / "litellm_config.yaml"
        config.write_text(yaml.safe_dump(litellm_config(fleet, smollm2_dir), sort_keys=False))
        with (
            LiteLLMProxy(config, work) as launched,
            httpx.Client(base_url=launched.url, headers=launched.headers, timeout=60) as client,
        ):
            yield Proxy(client, fleet, launched.process.log_path)


def test_intent_chooses_the_model_group_then_the_engine_holding_the_prefix(proxy: Proxy) -> None:
    fleet = proxy.fleet
    for text, model in ((CODING_QUESTION, "code"), (SMALL_TALK, "small"), (TRAVEL, "small")):
        r, engine = proxy.ask(chat_body("auto", text))
        assert r.status_code == 200, r.text
        assert r.headers["x-cognitora-model"] == model, text
        assert r.json()["model"] == model  # the engine's own field: it was asked for the rewritten model
        assert fleet.model_of(engine) == model

    r, engine = proxy.ask(chat_body("code", SMALL_TALK))  # an explicit model is kept
    assert r.status_code == 200 and r.json()["model"] == "code" and fleet.model_of(engine) == "code"

    system = long_system_prompt("litellm")
    first, first_engine = proxy.ask(chat_body("auto", CODING_QUESTION, system))
    second, second_engine = proxy.ask(chat_body("auto", CODING_QUESTION + "\n# and why?", system))
    assert first.status_code == second.status_code == 200
    assert fleet.model_of(first_engine) == "code"
    assert second_engine == first_engine
    assert cached_tokens(second.json()) > 1000


def test_weighted_split_reloads_without_restart_and_sticks_per_conversation(proxy: Proxy) -> None:
    fleet = proxy.fleet
    fleet.write_policy(weighted={"small": {"small": 0, "code": 100}})

    def small_goes_to_code() -> bool:
        r, _ = proxy.ask(chat_body("small", SMALL_TALK))
        return r.headers.get("x-cognitora-model") == "code" and r.json()["model"] == "code"

    wait_until(small_goes_to_code, 30, "the reloaded weights to send 'small' to the code model")

    # By conversation: every request here comes with the master key, one user for LiteLLM.
    fleet.write_policy(weighted={"small": {"small": 50, "code": 50}}, sticky_by="conversation")
    wait_until(lambda: len(versions(proxy, range(12))) == 2, 30, "the 50/50 split to serve both versions")
    seen = {i: versions(proxy, [i]) for i in range(12)}
    assert seen == {i: versions(proxy, [i]) for i in range(12)}
    assert all(len(v) == 1 for v in seen.values())


def versions(proxy: Proxy, conversations: Any) -> set[str]:
    out = set()
    for i in conversations:
        r, engine = proxy.ask(chat_body("small", f"hello, this is conversation {i}"))
        assert r.status_code == 200, r.text
        assert proxy.fleet.model_of(engine) == r.headers["x-cognitora-model"]
        out.add(r.headers["x-cognitora-model"])
    return out


def test_an_operators_own_intents_difficulty_and_the_embeddings_kind_reload_in_place(proxy: Proxy) -> None:
    # The default classifier on an operator's own multilingual intents, difficulty routing, then the embeddings
    # kind with its per-prompt cache (tests/support/intent_fleet.py says what is checked; the same through both
    # gateways).
    exercise_an_operators_policy(proxy.fleet, proxy.ask)
