"""Every surface real clients send, through the real LiteLLM proxy (examples/litellm_config.yaml: ``openai/``
deployments, Redis, the collector in process) to a simulated fleet: the official ``openai`` SDK (chat, completions,
Responses, embeddings, streams) and ``anthropic`` SDK (Messages, streams, tools, count_tokens) as the clients. The
proxy's ``/v1/messages`` and ``/v1/responses`` reach the ``cognitora`` strategy with the client's whole body: a
coding agent's 20-turn session stays on one engine with the cache hits reuse allows; a Responses follow-up lands
on the engine that stored the conversation; a team's Messages tokens count against its budget."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import anthropic
import pytest
import yaml

from cognitora_sim.launch import SimFleet, start_fleet
from tests.e2e.test_budgets_litellm_e2e import export_config
from tests.e2e.test_litellm_e2e import N_ENGINES, write_config
from tests.support import budgets_e2e, surfaces_e2e
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

SMALL_TEAM_LIMIT = 1_500

AUTH_MODULE = """
import os
from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

KEYS = {"sk-agents": "agents", "sk-small": "small"}

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key in KEYS:
        return UserAPIKeyAuth(api_key=key, team_id=KEYS[key], key_alias=f"{KEYS[key]}-key")
    raise HTTPException(status_code=401, detail="unknown key")
"""


@dataclass
class Stack:
    proxy: LiteLLMProxy
    fleet: SimFleet
    cognitora_yaml: Path


def served_by(headers: Mapping[str, str]) -> str:
    """The engine that answered, as an endpoint id (``host:port`` of LiteLLM's ``x-litellm-model-api-base``)."""
    base = headers.get("x-litellm-model-api-base", "")
    return urlsplit(base).netloc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, redis_server_url: str) -> Iterator[Stack]:
    key_prefix = f"cogtest-surfaces-{random.randrange(1 << 30):x}"
    work = tmp_path_factory.mktemp("surfaces-litellm")
    extra = ["--block-size", str(surfaces_e2e.BLOCK), "--responses-store"]
    with start_fleet(
        N_ENGINES, time_scale=20, tokenizer=smollm2_dir / "tokenizer.json", log_dir=work, extra_args=extra
    ) as fleet:
        path = write_config(work, fleet, smollm2_dir, redis_url=redis_server_url, key_prefix=key_prefix)
        config = yaml.safe_load(path.read_text())
        args = config["router_settings"]["routing_strategy_args"]
        args["budgets"] = {
            "teams": {
                "agents": {"limits": [{"window": "day", "total_tokens": 10_000_000}]},
                "small": {"limits": [{"window": "day", "total_tokens": SMALL_TEAM_LIMIT}]},
            }
        }
        (work / "surfaces_auth.py").write_text(AUTH_MODULE)
        config["general_settings"]["custom_auth"] = "surfaces_auth.user_api_key_auth"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        export, cognitora_yaml = export_config(path)  # what an operator runs `cognitora budgets report` with
        assert export.proc.wait(timeout=60) == 0, export.log_tail()
        args["collector"] = "in_process"  # (LiteLLM's own knob, which the export does not take)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        with LiteLLMProxy(path, work, salt="surfaces") as proxy:
            yield Stack(proxy, fleet, cognitora_yaml)


def _log_on_failure(stack: Stack) -> None:
    print(stack.proxy.process.log_tail(80))


def test_the_openai_sdk_through_litellm(stack: Stack) -> None:
    try:
        client = surfaces_e2e.openai_client(stack.proxy.url, "sk-agents")
        seen = surfaces_e2e.exercise_openai(client, "chat", served_by, "litellm-openai")
    except BaseException:
        _log_on_failure(stack)
        raise
    assert seen["holder"] in stack.fleet.endpoint_ids
    assert seen["continued"] == [seen["holder"]] * 3  # the engine holding the stored response, every time


def test_the_anthropic_sdk_through_litellm(stack: Stack) -> None:
    try:
        client = surfaces_e2e.anthropic_client(stack.proxy.url, "sk-agents")
        surfaces_e2e.exercise_anthropic(client, "chat", "litellm-anthropic", exact_count=False)
        with pytest.raises(anthropic.AuthenticationError):
            surfaces_e2e.anthropic_client(stack.proxy.url, "sk-nobody").messages.create(
                model="chat", max_tokens=4, messages=[{"role": "user", "content": "x"}]
            )
    except BaseException:
        _log_on_failure(stack)
        raise


def test_an_agent_session_stays_on_one_engine_through_litellm(stack: Stack, smollm2_dir: Path) -> None:
    client = surfaces_e2e.anthropic_client(stack.proxy.url, "sk-agents")
    keys = surfaces_e2e.Keys(smollm2_dir, stack.fleet.model)
    try:
        session = surfaces_e2e.agent_session(
            client, "chat", keys, lambda _: "", "litellm-agent", list(stack.fleet.urls)
        )
    except BaseException:
        _log_on_failure(stack)
        raise
    print("litellm agent session", session.engines_reached, f"hit ratio {session.hit_ratio:.3f}")
    assert len(session.turns) == 20 and len(session.engines_reached) == 1, session.engines_reached
    assert session.hit_ratio >= 0.95, session.turns


def test_a_messages_request_counts_against_the_team_through_litellm(stack: Stack) -> None:
    client = surfaces_e2e.anthropic_client(stack.proxy.url, "sk-small")
    system = "budgets: you are a terse assistant. " * 20
    used = answered = 0
    refused: anthropic.RateLimitError | None = None
    for i in range(20):
        try:
            answer = client.messages.create(
                model="chat", system=system, max_tokens=16, messages=[{"role": "user", "content": f"question {i}"}]
            )
        except anthropic.RateLimitError as exc:
            refused = exc
            break
        u = answer.usage
        used += u.input_tokens + (u.cache_read_input_tokens or 0) + u.output_tokens
        answered += 1
    assert refused is not None, "the team never ran out"
    assert 0 < used <= SMALL_TEAM_LIMIT
    report = budgets_e2e.budgets_cli("report", "--config", str(stack.cognitora_yaml), cwd=stack.cognitora_yaml.parent)
    small = budgets_e2e.team_totals(report)["small"]
    assert small["requests"] == answered and small["input_tokens"] + small["output_tokens"] == used, (small, used)
