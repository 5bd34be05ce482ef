"""Intent-based and weighted model rewrite through Envoy: the real envoy binary on ``examples/envoy.yaml``,
``cognitora extproc --collector`` reading ``examples/intent.yaml`` (copied, so the test can rewrite it), and two
simulated models (``code``, ``small``) of two engines each.

What a client sees: a coding question sent as ``auto`` is answered by the code model (the ``x-cognitora-model``
header and the engine's own ``model`` field say so), small talk by the small model, an explicit model name is kept,
and a second request sharing a long prefix lands on the engine holding it (``cached_tokens`` > 0). Then the policy
file is rewritten while the service runs: a weighted split takes effect without a restart, each conversation
sticks to one version, and a broken file is refused while the policy in force keeps serving.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cognitora_sim.harness.envoy_launch import render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from tests.support.intent_fleet import (
    CODING_QUESTION,
    SMALL_TALK,
    TRAVEL,
    TwoModelFleet,
    cached_tokens,
    chat_body,
    exercise_an_operators_policy,
    long_system_prompt,
    two_model_fleet,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Gateway:
    client: httpx.Client
    fleet: TwoModelFleet
    extproc: ManagedProcess
    log: Path

    def ask(self, body: dict[str, Any]) -> tuple[httpx.Response, str]:
        """The response and the engine that answered it."""
        r = self.client.post("/v1/chat/completions", json=body)
        return r, r.headers.get("x-cognitora-upstream-host", "")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("intent-envoy")
    with two_model_fleet(work, smollm2_dir) as fleet:
        config = {
            "models": fleet.models_config(smollm2_dir),
            "intent": {"file": str(fleet.policy), "reload_interval_s": 0.2},
            "placement": {"store_timeout_s": 2.0, "power_ttft_slack_s": 0.0, "power_ttft_slack_ratio": 0.0},
        }
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        port, listen, admin = free_port(), free_port(), free_port()
        argv = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(config_path)]
        argv += ["--listen", f"127.0.0.1:{port}", "--collector"]
        extproc = ManagedProcess(argv, work / "extproc.log", cwd=ROOT)
        envoy = None
        try:
            wait_listening(port, extproc)
            envoy_config = render_config(
                listen_port=listen,
                admin_port=admin,
                extproc_port=port,
                engines=fleet.all_engines(),
                expose_upstream_host=True,
            )
            envoy = start_envoy(envoy_config, work / "envoy", admin)
            with httpx.Client(base_url=f"http://127.0.0.1:{listen}", timeout=60) as client:
                yield Gateway(client, fleet, extproc, work / "extproc.log")
        finally:
            if envoy is not None:
                envoy.stop()
            extproc.stop()


def test_intent_chooses_the_model_then_the_engine_holding_the_prefix(gateway: Gateway) -> None:
    fleet = gateway.fleet
    for text, model in ((CODING_QUESTION, "code"), (SMALL_TALK, "small"), (TRAVEL, "small")):
        r, engine = gateway.ask(chat_body("auto", text))
        assert r.status_code == 200, r.text
        assert r.headers["x-cognitora-model"] == model, text
        assert r.json()["model"] == model  # the engine was asked for the rewritten model (body rewritten)
        assert fleet.model_of(engine) == model

    # An explicit model name is kept, whatever the prompt is about.
    r, engine = gateway.ask(chat_body("code", SMALL_TALK))
    assert r.status_code == 200 and r.json()["model"] == "code" and fleet.model_of(engine) == "code"
    assert r.headers["x-cognitora-model"] == "code"

    # Within the chosen model, placement is cache-aware: the second request of a shared prefix finds it cached.
    system = long_system_prompt("envoy")
    first, first_engine = gateway.ask(chat_body("auto", CODING_QUESTION, system))
    second, second_engine = gateway.ask(chat_body("auto", CODING_QUESTION + "\n# and why?", system))
    assert first.status_code == second.status_code == 200
    assert fleet.model_of(first_engine) == "code"
    assert second_engine == first_engine
    assert cached_tokens(second.json()) > 1000  # the ~1,500-token system prompt, from the engine itself


def test_weighted_split_reloads_without_restart_and_sticks_per_conversation(gateway: Gateway) -> None:
    fleet = gateway.fleet
    # Move all of "small" to the code model: the service re-reads the file within its reload interval.
    fleet.write_policy(weighted={"small": {"small": 0, "code": 100}})

    def small_goes_to_code() -> bool:
        r, _ = gateway.ask(chat_body("small", SMALL_TALK))
        return r.headers.get("x-cognitora-model") == "code"

    wait_until(small_goes_to_code, 20, "the reloaded weights to send 'small' to the code model")

    # Half and half, sticky: each conversation keeps its version on every request.
    fleet.write_policy(weighted={"small": {"small": 50, "code": 50}}, sticky_by="conversation")
    wait_until(lambda: len(versions(gateway, range(12))) == 2, 20, "the 50/50 split to serve both versions")
    seen = {i: versions(gateway, [i]) for i in range(12)}
    again = {i: versions(gateway, [i]) for i in range(12)}
    assert seen == again and all(len(v) == 1 for v in seen.values())

    # A broken file is refused (the file is checked on the request path: requests keep coming meanwhile); the
    # split in force keeps serving.
    fleet.policy.write_text("weighted: {small: {nope: 100}}\n")

    def refused() -> bool:
        versions(gateway, [0])
        return "keeping the intent policy in force" in gateway.log.read_text()

    wait_until(refused, 20, "the refusal logged")
    assert {i: versions(gateway, [i]) for i in range(12)} == seen
    assert "weighted.small: version 'nope' is not a model" in gateway.log.read_text()


def versions(gateway: Gateway, conversations: Any) -> set[str]:
    """The models that served ``conversations`` (by index: each has its own first message)."""
    out = set()
    for i in conversations:
        r, _ = gateway.ask(chat_body("small", f"hello, this is conversation {i}"))
        assert r.status_code == 200, r.text
        out.add(r.headers["x-cognitora-model"])
    return out


def test_an_operators_own_intents_difficulty_and_the_embeddings_kind_reload_in_place(gateway: Gateway) -> None:
    # The default classifier on an operator's own multilingual intents, difficulty routing, then the embeddings
    # kind with its per-prompt cache (tests/support/intent_fleet.py says what is checked; the same through both
    # gateways).
    exercise_an_operators_policy(gateway.fleet, gateway.ask)
