"""Flow control through the real LiteLLM proxy (docs/flow_control.md): the routing strategy awaits the gateway
queue on the core's loop, with one simulated engine whose one seat (as Cognitora knows it) a long stream holds.
Each client's class is what the admin set on its key (``cognitora_priority`` in the key's metadata; a static
key map stands in for LiteLLM's virtual keys). The shared scenario is tests/support/flow_e2e.py: the burst is
served in band order and a short-wait class gets 429 with Retry-After (the client that gives up is Envoy's
case only: LiteLLM does not reliably cancel a waiting call whose client left).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.flow_e2e import FLOW_CONTROL, PRIORITIES, body, burst_behind_a_held_seat, check, gauge
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

AUTH_MODULE = """
import os
from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key.startswith("sk-ops-"):  # the admin set the key's class: the client cannot
        priority = key.removeprefix("sk-ops-")
        return UserAPIKeyAuth(api_key=key, team_id="ops", metadata={"cognitora_priority": priority})
    raise HTTPException(status_code=401, detail="unknown key")
"""


def proxy_config(fleet: SimFleet, tokenizer: str, endpoints: list[dict[str, Any]], **strategy: Any) -> dict[str, Any]:
    """The proxy's config: model group ``chat`` over every engine of ``fleet``, placed by Cognitora over
    ``endpoints``, with ``strategy`` as further ``routing_strategy_args`` (placement, flow_control)."""
    return {
        "model_list": [
            {
                "model_name": "chat",
                "litellm_params": {"model": f"hosted_vllm/{fleet.model}", "api_base": f"{url}/v1", "api_key": "x"},
            }
            for url in fleet.urls
        ],
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {
                "models": [{"name": "chat", "block_size": 16, "tokenizer": tokenizer, "endpoints": endpoints}],
                **strategy,
            },
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora"]},
    }


def headers_of(priority: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-ops-{priority}"}


def test_flow_control_through_litellm(smollm2_dir: Path, tmp_path: Path) -> None:
    tokenizer = str(smollm2_dir / "tokenizer.json")
    with start_fleet(1, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet:
        url = fleet.urls[0]
        config = proxy_config(
            fleet,
            tokenizer,
            [{"url": url, "cost": {"max_num_seqs": 1}}],
            placement={"priorities": PRIORITIES},
            flow_control=FLOW_CONTROL,
        )
        config["general_settings"] = {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            "custom_auth": "flow_auth.user_api_key_auth",
        }
        (tmp_path / "flow_auth.py").write_text(AUTH_MODULE)
        path = tmp_path / "litellm_config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        proxy = LiteLLMProxy(path, tmp_path, salt="flow")
        try:
            seen = asyncio.run(
                # No leaver here: the proxy does not reliably cancel a waiting non-streaming call whose client
                # left (one run in two on a quiet machine kept it queued until the seat freed; docs/flow_control.md).
                burst_behind_a_held_seat(
                    proxy.url, "chat", f"{proxy.url}/cognitora/metrics", headers_of, with_leaver=False
                )
            )
        finally:
            proxy.stop()
    check(seen, with_leaver=False)


BURST = 3
"""Long prompts sent at once, one per engine, to a proxy that has served nothing: its core, and its collector,
start with them."""
TIMED = 11
"""Long prompts timed one after the other: the margin moves from its 10th sample (``margin.min_samples``)."""


def test_the_margin_times_first_tokens_on_the_engines_clock(smollm2_dir: Path, tmp_path: Path) -> None:
    """At time scale 0.5 an engine's second is two of the gateway's. The prediction margin compares a first
    token's time with its prediction (engine seconds); timed on the gateway's clock, every long prompt the engine
    served as predicted looked twice as late, and the margin sat at its 1.5 cap: flow control held requests the
    engines would have served in time (the long-context bench, docs/flow_control.md "Gateways"). One output token
    each: no decode for the scraper to learn the clock from, so only the engine's own word for it can help. The
    first burst is placed before the proxy's collector scraped the engine at all: its clock unknown, its first
    tokens teach the margin nothing."""
    tokenizer = str(smollm2_dir / "tokenizer.json")
    with start_fleet(
        BURST, profile="h100x2", time_scale=0.5, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path
    ) as fleet:
        config = proxy_config(fleet, tokenizer, [{"url": url} for url in fleet.urls], flow_control={})
        path = tmp_path / "litellm_config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        proxy = LiteLLMProxy(path, tmp_path, salt="clock")
        try:
            page = asyncio.run(_timed_long_prompts(proxy.url, proxy.key))
        finally:
            proxy.stop()
    assert gauge(page, "cognitora_flow_prediction_margin_samples") >= TIMED - 1, page
    # The engine serves these prompts within ~10% of their prediction here; on the gateway's clock they read 2x.
    assert gauge(page, "cognitora_flow_prediction_margin") < 1.25


async def _timed_long_prompts(url: str, key: str) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(name: str) -> None:
            # ~11,000 tokens, each prompt its own (no cache hit): ~0.8 engine seconds of prefill on h100x2
            request = body("chat", " ".join(f"{name}x{j}" for j in range(2200)), max_tokens=1, stream=True)
            async with client.stream("POST", f"{url}/v1/chat/completions", json=request, headers=headers) as resp:
                assert resp.status_code == 200, await resp.aread()
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        json.loads(line.removeprefix("data: "))

        await asyncio.gather(*(one(f"burst{i}") for i in range(BURST)))
        for i in range(TIMED):
            await one(f"clock{i}")
        return (await client.get(f"{url}/cognitora/metrics", headers=headers)).text
