"""Every surface real clients send, through the real Envoy (examples/envoy.yaml, its JWT auth) and
``cognitora extproc`` on Redis, to a simulated fleet: the official ``openai`` SDK (chat, completions, Responses,
embeddings, streams) and ``anthropic`` SDK (Messages, streams, tools, count_tokens) as the clients. A Responses
follow-up lands on the engine that stored the conversation; a coding agent's 20-turn session stays on one engine
with the cache hits reuse allows; a team's Messages tokens count against its budget; a body no surface can read is a
400 naming the field."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import yaml

from cognitora import api_keys
from cognitora_sim.harness.envoy_launch import GatewayStack, start_gateway
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support import budgets_e2e, surfaces_e2e

pytestmark = pytest.mark.e2e

SMALL_TEAM_LIMIT = 1_500
"""Total tokens a day for team ``small``: a few Messages requests of ~200 prompt tokens."""


@dataclass
class Stack:
    url: str
    fleet: SimFleet
    gateway: GatewayStack
    config_path: Path
    jwks: str

    def key(self, team: str) -> str:
        return api_keys.mint(self.jwks, team=team, key_id=f"{team}-key", user=f"{team}-user", expires_in_s=600)

    def auth(self, team: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key(team)}"}


def served_by(headers: Mapping[str, str]) -> str:
    return headers.get("x-cognitora-upstream-host", "")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, smollm2_dir: Path) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("surfaces-envoy")
    extra = ["--block-size", str(surfaces_e2e.BLOCK), "--responses-store"]
    with start_fleet(
        3, time_scale=20.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=work, extra_args=extra
    ) as fleet:
        config: dict[str, Any] = {
            "redis_url": redis_server_url,
            "key_prefix": f"cogtest-surfaces-{random.randrange(1 << 30):x}",
            "models": [
                {
                    "name": fleet.model,
                    "block_size": surfaces_e2e.BLOCK,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "chat_template": str(smollm2_dir / "chat_template.jinja"),
                    "endpoints": [
                        {"url": url, "kv_events": events, "kv_events_replay": replay, "prefill_tokens_per_s": 30000}
                        for url, events, replay in zip(
                            fleet.urls, fleet.events_addresses, fleet.replay_addresses, strict=True
                        )
                    ],
                }
            ],
            "placement": {"store_timeout_s": 2.0},
            "budgets": {
                "teams": {
                    "agents": {"limits": [{"window": "day", "total_tokens": 10_000_000}]},
                    "small": {"limits": [{"window": "day", "total_tokens": SMALL_TEAM_LIMIT}]},
                }
            },
        }
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        secret = api_keys.new_jwks()
        with start_gateway(
            config_path,
            fleet.endpoint_ids,
            work,
            embedded=False,
            collector=True,
            jwks=secret,
            expose_upstream_host=True,
        ) as gateway:
            yield Stack(gateway.url, fleet, gateway, config_path, secret)


def _log_on_failure(stack: Stack) -> None:
    print(stack.gateway.extproc.log_tail(60))


def test_the_openai_sdk_through_envoy(stack: Stack) -> None:
    try:
        client = surfaces_e2e.openai_client(stack.url, stack.key("agents"))
        seen = surfaces_e2e.exercise_openai(client, stack.fleet.model, served_by, "envoy-openai")
    except BaseException:
        _log_on_failure(stack)
        raise
    assert seen["holder"] in stack.fleet.endpoint_ids
    assert seen["continued"] == [seen["holder"]] * 3  # the engine holding the stored response, every time


def test_the_anthropic_sdk_through_envoy(stack: Stack) -> None:
    try:
        client = surfaces_e2e.anthropic_client(stack.url, stack.key("agents"))
        surfaces_e2e.exercise_anthropic(client, stack.fleet.model, "envoy-anthropic")
        with pytest.raises(anthropic.AuthenticationError):  # the example's auth applies to every surface
            surfaces_e2e.anthropic_client(stack.url).messages.create(
                model=stack.fleet.model, max_tokens=4, messages=[{"role": "user", "content": "x"}]
            )
    except BaseException:
        _log_on_failure(stack)
        raise


def test_an_agent_session_stays_on_one_engine_through_envoy(stack: Stack, smollm2_dir: Path) -> None:
    client = surfaces_e2e.anthropic_client(stack.url, stack.key("agents"))
    keys = surfaces_e2e.Keys(smollm2_dir, stack.fleet.model)
    session = surfaces_e2e.agent_session(
        client, stack.fleet.model, keys, served_by, "envoy-agent", list(stack.fleet.urls)
    )
    print("envoy agent session", session.engines, f"hit ratio {session.hit_ratio:.3f}")
    try:
        assert len(session.turns) == 20 and len(session.engines) == 1, [t.engine for t in session.turns]
        assert len(session.engines_reached) == 1, session.engines_reached  # the engines' own counters agree
        assert session.hit_ratio >= 0.95, session.turns
    except AssertionError:
        _log_on_failure(stack)
        raise


def test_a_messages_request_counts_against_the_team_through_envoy(stack: Stack) -> None:
    client = surfaces_e2e.anthropic_client(stack.url, stack.key("small"))
    system = "budgets: you are a terse assistant. " * 20
    used = answered = 0
    refused: anthropic.RateLimitError | None = None
    for i in range(20):
        try:
            answer = client.messages.create(
                model=stack.fleet.model,
                system=system,
                max_tokens=16,
                messages=[{"role": "user", "content": f"question {i}"}],
            )
        except anthropic.RateLimitError as exc:
            refused = exc
            break
        u = answer.usage
        used += u.input_tokens + (u.cache_read_input_tokens or 0) + u.output_tokens
        answered += 1
    assert refused is not None and refused.response.headers.get("retry-after"), "the team never ran out"
    assert 0 < used <= SMALL_TEAM_LIMIT
    report = budgets_e2e.budgets_cli("report", "--config", str(stack.config_path), cwd=stack.config_path.parent)
    small = budgets_e2e.team_totals(report)["small"]
    assert small["input_tokens"] + small["output_tokens"] == used, (small, used)
    assert small["requests"] == answered


def test_bodies_no_surface_reads_are_400s_naming_the_field_through_envoy(stack: Stack) -> None:
    surfaces_e2e.check_bad_bodies(stack.url, stack.auth("agents"))
    r = httpx.post(f"{stack.url}/v1/audio/speech", json={"model": "m"}, headers=stack.auth("agents"), timeout=30)
    assert r.status_code == 404 and "not an inference path" in r.json()["error"]["message"]
