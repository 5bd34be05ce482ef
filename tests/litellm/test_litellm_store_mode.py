"""LiteLLM's own ``router_settings`` Redis never switches Cognitora to a Redis mode that nothing feeds.

The rule is ``cognitora extproc``'s (a store with no collector is refused at start): with only LiteLLM's Redis, the
Router is refused with a message saying which line to add; ``collector: external`` takes that Redis as the shared
store (a ``cognitora collector`` runs beside), ``collector: in_process`` has the proxy feed it itself, and an engine's
health and load then reach the store. Real LiteLLM Routers, a real Redis and a simulated engine.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
import pytest

import litellm_plugin
from cognitora.config import ConfigError
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.open import open_store
from litellm_plugin.store_mode import store_mode

litellm_plugin.install()  # what the proxy's callback line does; an SDK script calls it too


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with start_fleet(1, time_scale=20, log_dir=tmp_path_factory.mktemp("sim")) as f:
        yield f


def router(fleet: SimFleet, redis_url: str, args: dict[str, Any]) -> litellm.Router:
    parts = urlsplit(redis_url)
    return litellm.Router(
        model_list=[
            {
                "model_name": "chat",
                "litellm_params": {"model": "openai/smollm2", "api_base": f"{fleet.urls[0]}/v1", "api_key": "none"},
                "model_info": {"id": "engine-0", "cognitora_engine": "vllm"},
            }
        ],
        routing_strategy="cognitora",
        routing_strategy_args=args,
        redis_host=parts.hostname,
        redis_port=parts.port,
    )


def test_litellms_redis_alone_is_refused_saying_what_to_add(fleet: SimFleet, redis_server_url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        router(fleet, redis_server_url, {})
    message = str(refused.value)
    assert "router_settings has a Redis" in message and "nothing feeds it unless a collector runs" in message
    assert "collector: external" in message and "collector: in_process" in message


def test_collector_external_reads_litellms_redis(fleet: SimFleet, redis_server_url: str, key_prefix: str) -> None:
    r = router(fleet, redis_server_url, {"collector": "external", "key_prefix": key_prefix})
    try:
        strategy = litellm_plugin.strategy_for(r)
        assert strategy.host.mode == "redis" and not strategy.host.in_process_collector
    finally:
        r.update_settings(routing_strategy="simple-shuffle")


def test_collector_in_process_feeds_litellms_redis(fleet: SimFleet, redis_server_url: str, key_prefix: str) -> None:
    r = router(fleet, redis_server_url, {"collector": "in_process", "key_prefix": key_prefix})
    try:
        answer = r.completion(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert answer.choices[0].message.content
        host = litellm_plugin.strategy_for(r).host
        assert host.mode == "redis" and host.collector() is not None

        async def engine_state() -> tuple[int, int]:
            store = open_store(redis_server_url, key_prefix)
            try:
                return len(await store.heartbeats()), len(await store.snapshots([fleet.endpoint_ids[0]]))
            finally:
                await store.close()

        deadline = time.monotonic() + 15
        while asyncio.run(engine_state()) != (1, 1):
            assert time.monotonic() < deadline, "the proxy's own collector never wrote the engine's state to Redis"
            time.sleep(0.2)
    finally:
        r.update_settings(routing_strategy="simple-shuffle")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"args_redis_url": None, "router_redis_url": None, "collector": "external", "workers": 1}, "no redis_url"),
        (
            {"args_redis_url": "redis://r:6379/0", "router_redis_url": None, "collector": "in_process", "workers": 2},
            "2 worker processes",
        ),
    ],
)
def test_settings_that_cannot_feed_the_store_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        store_mode(**kwargs)


def test_explicit_redis_keeps_its_external_collector_and_no_redis_runs_one_in_process() -> None:
    explicit = store_mode(
        args_redis_url="redis://r:6379/0", router_redis_url="redis://x:1/0", collector=None, workers=4
    )
    assert (explicit.redis_url, explicit.collector) == ("redis://r:6379/0", "external")
    none = store_mode(args_redis_url=None, router_redis_url=None, collector=None, workers=1)
    assert (none.redis_url, none.collector) == (None, "in_process")
