"""Cognitora in front of the real engines: the collector alone, or a whole gateway (Envoy or the LiteLLM proxy).

Both gateways run in Redis mode with ``cognitora collector`` beside them, as in production, so a test can read
the store the gateway reads (``placement``) and run ``cognitora explain`` against it.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cognitora.config import load_config
from cognitora.core.router import Router
from cognitora.decision import Decision
from cognitora.request import RouteRequest
from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.harness.process import ManagedProcess, wait_until
from cognitora_sim.harness.real_engines.launch import BLOCK_SIZE, MODEL, RealEngineFleet
from cognitora_sim.tokenizer import SMOLLM2_DIR
from tests.real_engines.traffic import GatewayClient

ROOT = Path(__file__).resolve().parents[2]
LITELLM_EXAMPLE = ROOT / "examples" / "litellm_config.yaml"
ALIASES = ("code", "small")
"""Names every engine of the session fleet answers to besides ``MODEL`` (conftest.py): an intent policy can rewrite
``auto`` to ``code`` on one engine and ``small`` on the other, and Envoy asks the engine for the name it routed to
(vLLM's responses still say ``MODEL``, its first served name)."""
LITELLM_MODEL = "chat"
"""The model name clients send to the LiteLLM proxy (the example's ``model_name``)."""


@dataclass(frozen=True)
class Upstream:
    """One engine as Cognitora is told about it."""

    url: str
    endpoint_id: str
    engine: str = "vllm"
    events: str | None = None
    replay: str | None = None
    prefill_tokens_per_s: float | None = None
    """A prior for an engine whose rate is not learned from /metrics (``engine: openai``)."""


def vllm_upstreams(fleet: RealEngineFleet, kv_events: bool = True) -> list[Upstream]:
    """The fleet's engines, with their KV events (or none: their own ``/kv_event_sources`` then says where)."""
    return [
        Upstream(e.url, e.endpoint_id, "vllm", *((e.events_address, e.replay_address) if kv_events else (None, None)))
        for e in fleet.engines
    ]


Groups = dict[str, list[Upstream]]
"""Model names and the engines serving each (for an intent policy that rewrites to one or the other); by default
one model, ``MODEL``, served by every engine."""


def _endpoint(up: Upstream) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"url": up.url, "engine": up.engine}
    if up.events is not None:
        endpoint |= {"kv_events": up.events, "kv_events_replay": up.replay}
    if up.prefill_tokens_per_s is not None:
        endpoint["prefill_tokens_per_s"] = up.prefill_tokens_per_s
    return endpoint


def cognitora_config(
    upstreams: list[Upstream],
    redis_url: str,
    key_prefix: str,
    groups: Groups | None = None,
    intent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """cognitora.yaml for real engines: token-exact keys from the tokenizer the engines load, vLLM's CPU block size;
    ``groups`` and ``intent`` as the gateway functions below take them."""
    config: dict[str, Any] = {
        "redis_url": redis_url,
        "key_prefix": key_prefix,
        "models": [
            {
                "name": name,
                "block_size": BLOCK_SIZE,
                "tokenizer": str(SMOLLM2_DIR / "tokenizer.json"),
                "chat_template": str(SMOLLM2_DIR / "chat_template.jinja"),
                "endpoints": [_endpoint(up) for up in ups],
            }
            for name, ups in (groups or {MODEL: upstreams}).items()
        ],
        "scrape": {"interval_s": 0.5, "timeout_s": 0.5},
        # 2 cores shared with the engines themselves: a Redis read can take longer than the 0.25 s default, and a
        # decision made without the store is not what these tests are about. Power has no meaning on CPU engines.
        "placement": {"store_timeout_s": 2.0, "power_ttft_slack_s": 0.0, "power_ttft_slack_ratio": 0.0},
    }
    if intent is not None:
        config["intent"] = intent
    return config


def start_collector(config_path: Path, log_dir: Path) -> ManagedProcess:
    collector = ManagedProcess(
        [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(config_path), "--stats-interval-s", "1"],
        log_dir / "collector.log",
        env={"PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    wait_until(lambda: "collector started" in collector.log_tail(200), 60, "the collector to start")
    return collector


def collector_stats(collector: ManagedProcess) -> dict[str, Any]:
    """The newest ``collector stats`` JSON line of the collector's log (counters: blocks stored, removed, purges)."""
    for line in reversed(collector.log_path.read_text(errors="replace").splitlines()):
        if '"collector stats"' in line:
            stats: dict[str, Any] = json.loads(line)
            return stats
    return {}


Prompt = list[dict[str, str]] | str
"""Chat messages, or a completions prompt."""


def place(config_path: Path, model: str, prompt: Prompt) -> Decision:
    """Where a gateway reading this store would place ``prompt`` now (nothing is dispatched or written)."""
    request = (
        RouteRequest(model=model, prompt=prompt)
        if isinstance(prompt, str)
        else RouteRequest(model=model, messages=prompt)
    )

    async def run() -> Decision:
        router = Router.from_config(load_config(config_path))
        try:
            return await router.place(request)
        finally:
            await router.close()

    return asyncio.run(run())


def cached_on(config_path: Path, model: str, prompt: Prompt, endpoint: str) -> float:
    """Prompt tokens of ``prompt`` the store says ``endpoint`` holds."""
    decision = place(config_path, model, prompt)
    return next((c.cached_tokens for c in decision.candidates if c.endpoint == endpoint), 0.0)


def run_module(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m argv...`` from the checkout, as an operator runs it; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@dataclass(frozen=True)
class Explained:
    endpoint: str
    cached_tokens: int
    prompt_tokens: int
    text: str


def explain(config_path: Path, model: str, messages: list[dict[str, str]], work: Path) -> Explained:
    """``cognitora explain`` as an operator runs it, its pick and cached tokens read from what it prints."""
    prompt = work / f"explain-{random.randrange(1 << 30):x}.json"
    prompt.write_text(json.dumps(messages))
    argv = ["cognitora.cli", "explain", "--config", str(config_path), "--model", model]
    done = run_module([*argv, "--prompt-file", str(prompt), "--messages-json"])
    # "picked 127.0.0.1:P for model M: predicted TTFT 12.3 ms, 544/571 prompt tokens cached"
    picked = next(line for line in done.stdout.splitlines() if line.startswith("picked "))
    endpoint = picked.split()[1]
    cached, total = picked.rsplit(", ", 1)[1].split()[0].split("/")
    return Explained(endpoint, int(cached), int(total), done.stdout)


@dataclass
class Gateway:
    client: GatewayClient
    config_path: Path
    """The cognitora.yaml the gateway's collector reads (for ``cognitora explain`` and placement checks)."""
    model: str
    """The model name in that cognitora.yaml."""
    log: ManagedProcess
    """The process whose log says what the gateway decided (the extproc service, or the proxy)."""


@contextmanager
def envoy_gateway(
    upstreams: list[Upstream],
    redis_url: str,
    work: Path,
    groups: Groups | None = None,
    intent: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Gateway]:
    """Envoy + ``cognitora extproc`` over ``upstreams``; ``groups`` (model names and their engines, which must serve
    those names: Envoy sends the engine the model it was routed for) and an ``intent`` section, if given; ``env``
    added to the service's environment (``tracing_env``)."""
    config_path = work / "cognitora.yaml"
    prefix = f"cogtest-real-envoy-{random.randrange(1 << 30):x}"
    config_path.write_text(yaml.safe_dump(cognitora_config(upstreams, redis_url, prefix, groups, intent)))
    ids = [up.endpoint_id for up in upstreams]
    # An intent classifier is fitted before the service listens (an embeddings kind embeds its examples first: on
    # 2 cores shared with the engines, tens of seconds).
    listen_s = 30.0 if intent is None else 120.0
    with start_gateway(
        config_path,
        ids,
        work,
        embedded=False,
        collector=True,
        env=env,
        listen_timeout_s=listen_s,
        expose_upstream_host=True,
    ) as stack:
        collector = stack.collector
        assert collector is not None
        wait_until(lambda: "collector started" in collector.log_tail(200), 60, "the collector to start")
        client = GatewayClient("envoy", stack.url, MODEL, {}, "x-cognitora-upstream-host")
        yield Gateway(client, config_path, MODEL, stack.extproc)


def tracing_env(traces_url: str) -> dict[str, str]:
    """A gateway's environment that turns Cognitora's decision spans on (``cognitora.tracing``), exported to
    ``traces_url`` every 0.1 s (the SDK's default is 5 s)."""
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def litellm_config(
    upstreams: list[Upstream],
    redis_url: str,
    prefix: str,
    work: Path,
    groups: Groups | None = None,
    intent: dict[str, Any] | None = None,
) -> Path:
    """The example LiteLLM config, its first deployments pointed at the real engines, in Redis mode; with
    ``groups``, each engine's deployment in its group's model group (the engines are still asked for ``MODEL``)."""
    config = yaml.safe_load(LITELLM_EXAMPLE.read_text())
    deployments = config["model_list"][: len(upstreams)]
    group_of = {up.endpoint_id: name for name, ups in (groups or {}).items() for up in ups}
    for dep, up in zip(deployments, upstreams, strict=True):
        dep["model_name"] = group_of.get(up.endpoint_id, dep["model_name"])
        dep["litellm_params"]["api_base"] = f"{up.url}/v1"
        dep["litellm_params"]["model"] = f"openai/{MODEL}"
        info = dep["model_info"]
        info["cognitora_engine"] = up.engine
        info.pop("cognitora_kv_events", None)
        info.pop("cognitora_kv_events_replay", None)
        if up.events is not None:
            info |= {"cognitora_kv_events": up.events, "cognitora_kv_events_replay": up.replay}
        if up.prefill_tokens_per_s is not None:
            info["cognitora_prefill_tokens_per_s"] = up.prefill_tokens_per_s
    config["model_list"] = deployments
    args = config["router_settings"]["routing_strategy_args"]
    args["models"][0]["tokenizer"] = str(SMOLLM2_DIR / "tokenizer.json")
    args["models"][0]["block_size"] = BLOCK_SIZE
    if groups:
        args["models"] = [{**args["models"][0], "name": name} for name in groups]
    if intent is not None:
        args["intent"] = intent
    args |= {"redis_url": redis_url, "key_prefix": prefix, "scrape": {"interval_s": 0.5, "timeout_s": 0.5}}
    args["placement"] = {"store_timeout_s": 2.0, "power_ttft_slack_s": 0.0, "power_ttft_slack_ratio": 0.0}
    path = work / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextmanager
def litellm_gateway(
    upstreams: list[Upstream],
    redis_url: str,
    work: Path,
    groups: Groups | None = None,
    intent: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Gateway]:
    """The LiteLLM proxy with Cognitora's strategy over ``upstreams``; ``env`` added to the proxy's environment."""
    from tests.support.litellm_proxy import LiteLLMProxy

    prefix = f"cogtest-real-litellm-{random.randrange(1 << 30):x}"
    config = litellm_config(upstreams, redis_url, prefix, work, groups, intent)
    cognitora_yaml = work / "cognitora.yaml"
    run_module(["litellm_plugin.export", str(config), "-o", str(cognitora_yaml)])
    collector = start_collector(cognitora_yaml, work)
    try:
        proxy = LiteLLMProxy(config, work, salt="real", env=env, ready_s=90 if intent is None else 180)
        try:
            headers = {"Authorization": f"Bearer {proxy.key}"}
            client = GatewayClient("litellm", proxy.url, LITELLM_MODEL, headers, "x-litellm-model-api-base")
            yield Gateway(client, cognitora_yaml, LITELLM_MODEL, proxy.process)
        finally:
            proxy.stop()
    finally:
        collector.stop()
