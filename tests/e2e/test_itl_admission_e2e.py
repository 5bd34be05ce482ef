"""Admission by ITL through both gateways: a class with ``itl_slo_s`` is refused with 429 while the engine's measured
decode step is over its objective, the stream already running is untouched, and the class is served again once the
engine is idle.

Real parts: a simulated vLLM engine over HTTP, its ``/metrics`` scraped by the gateway's own collector, the real
LiteLLM proxy and a real Envoy with ``cognitora extproc``. The objective (1 ms) is below any decode step, so the
test does not depend on how fast this machine is: what it shows is the measurement reaching the decision.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

ITL_SLO_S = 0.001
PRIORITIES = {"default": {"ttft_slo_s": 60.0, "itl_slo_s": ITL_SLO_S, "sheddable": True}}
SCRAPE = {"interval_s": 0.3, "timeout_s": 1.0}
HOLD_TOKENS = 1500
"""The running stream: ~20 s of decode on the simulated Qwen3-32B, far longer than the scraper needs to measure it."""
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    with start_fleet(1, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path_factory.mktemp("sim")) as f:
        yield f


@dataclass
class Gateway:
    url: str
    model: str
    headers: dict[str, str]


@dataclass
class Seen:
    refusal: httpx.Response
    served_during_hold: int
    hold_tokens: int
    served_after: httpx.Response


async def short(client: httpx.AsyncClient, gw: Gateway, i: int) -> httpx.Response:
    body = {"model": gw.model, "messages": [{"role": "user", "content": f"short question {i}"}], "max_tokens": 4}
    return await client.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers)


async def admission_while_a_stream_runs(gw: Gateway) -> Seen:
    """Open a long stream; while it decodes, send short requests until one is refused; read the stream to its end;
    then send short requests until one is served."""
    async with httpx.AsyncClient(timeout=120) as client:
        hold_body: dict[str, Any] = {
            "model": gw.model,
            "messages": [{"role": "user", "content": "tell me a very long story about routers"}],
            "max_tokens": HOLD_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", f"{gw.url}/v1/chat/completions", json=hold_body, headers=gw.headers) as hold:
            assert hold.status_code == 200, await hold.aread()
            lines = hold.aiter_lines()
            async for line in lines:
                if line.startswith("data: {"):
                    break  # the first token: the stream runs
            served, refusal, i = 0, None, 0
            deadline = time.monotonic() + DEADLINE_S
            while refusal is None and time.monotonic() < deadline:
                r = await short(client, gw, i)
                i += 1
                if r.status_code == 429:
                    refusal = r
                else:
                    assert r.status_code == 200, r.text
                    served += 1  # placed before the scraper measured the running stream's decode steps
                    await asyncio.sleep(0.1)
            assert refusal is not None, f"no request refused within {DEADLINE_S:.0f} s while the stream ran"
            completion_tokens = 0
            async for line in lines:
                if line.startswith("data: {") and '"usage"' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    completion_tokens = usage.get("completion_tokens", completion_tokens)
        deadline = time.monotonic() + DEADLINE_S
        after = await short(client, gw, i)
        while after.status_code == 429 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            after = await short(client, gw, i)
    return Seen(refusal, served, completion_tokens, after)


def check(seen: Seen) -> None:
    refusal = seen.refusal
    message = refusal.json()["error"]["message"]
    assert "best predicted inter-token latency" in message and "exceeds its ITL SLO of 1.0 ms" in message, message
    assert refusal.headers["retry-after"] == "1"
    assert seen.hold_tokens == HOLD_TOKENS  # the running stream was not cut or slowed into a timeout
    assert seen.served_after.status_code == 200, seen.served_after.text  # idle again: served


def test_itl_admission_through_litellm(fleet: SimFleet, smollm2_dir: Path, tmp_path: Path) -> None:
    config = {
        "model_list": [
            {
                "model_name": "chat",
                "litellm_params": {"model": f"hosted_vllm/{fleet.model}", "api_base": f"{url}/v1", "api_key": "none"},
            }
            for url in fleet.urls
        ],
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {
                "models": [{"name": "chat", "block_size": 16, "tokenizer": str(smollm2_dir / "tokenizer.json")}],
                "scrape": SCRAPE,
                "placement": {"priorities": PRIORITIES},
            },
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }
    path = tmp_path / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proxy = LiteLLMProxy(path, tmp_path, salt="itl")
    try:
        seen = asyncio.run(
            admission_while_a_stream_runs(Gateway(proxy.url, "chat", {"Authorization": f"Bearer {proxy.key}"}))
        )
    finally:
        proxy.stop()
    check(seen)


def test_itl_admission_through_envoy(fleet: SimFleet, smollm2_dir: Path, tmp_path: Path) -> None:
    config = {
        "models": [fleet.model_config(smollm2_dir / "tokenizer.json")],
        "scrape": SCRAPE,
        "placement": {"priorities": PRIORITIES},
    }
    path = tmp_path / "cognitora.yaml"
    path.write_text(yaml.safe_dump(config))
    with start_gateway(path, fleet.endpoint_ids, tmp_path) as stack:
        seen = asyncio.run(admission_while_a_stream_runs(Gateway(stack.url, fleet.model, {})))
    check(seen)
