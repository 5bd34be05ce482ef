"""``Core.open``: the one way both gateways build the core, and the deployment rules it is opened under
(``cognitora.core.deployment``). The adapters' own wording of each rule is tested beside them
(test_envoy_workers.py, test_litellm_store_mode.py, test_litellm_fleet.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cognitora.collector import Collector, CollectorThread
from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.core import Core, prepare
from cognitora.core.deployment import CollectorPlace, DeploymentRule, deployment_problem
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.redis_store import RedisStore

IN, EXT, NONE = CollectorPlace.IN_PROCESS, CollectorPlace.EXTERNAL, CollectorPlace.NONE
REDIS = "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("redis_url", "collector", "workers", "broken"),
    [
        (None, None, 1, DeploymentRule.BLIND),
        (None, IN, 1, None),
        (None, NONE, 1, None),  # said so: measurements of blind placement
        (None, EXT, 1, DeploymentRule.EXTERNAL_NEEDS_SHARED_STORE),
        (None, IN, 2, DeploymentRule.WORKERS_NEED_SHARED_STORE),
        (None, None, 4, DeploymentRule.WORKERS_NEED_SHARED_STORE),
        (REDIS, None, 1, None),
        (REDIS, EXT, 4, None),
        (REDIS, IN, 1, None),
        (REDIS, IN, 2, DeploymentRule.ONE_COLLECTOR_PER_STORE),
    ],
)
def test_the_deployment_rules(
    redis_url: str | None, collector: CollectorPlace | None, workers: int, broken: DeploymentRule | None
) -> None:
    assert deployment_problem(redis_url, collector, workers) is broken


def make_config(smollm2_dir: Path, redis_url: str | None = None) -> CognitoraConfig:
    return config_from_dict(
        {
            "redis_url": redis_url,
            "models": [
                {
                    "name": "m",
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": "http://127.0.0.1:9"}],
                }
            ],
        }
    )


async def test_an_in_process_store_is_fed_by_a_collector_on_its_own_thread(smollm2_dir: Path) -> None:
    config = make_config(smollm2_dir)
    core = await Core.open(config, collector=IN, prepared=prepare(config))
    try:
        assert isinstance(core.router.store, MemoryStore)
        assert isinstance(core.collector, CollectorThread)
        decision, attempt = await core.router.admit(RouteRequest(model="m", prompt="hello"))
        assert decision.endpoint == "127.0.0.1:9" and attempt is not None
    finally:
        await core.close()


async def test_redis_with_an_external_collector_runs_none_here(smollm2_dir: Path, redis_server_url: str) -> None:
    core = await Core.open(make_config(smollm2_dir, redis_server_url), collector=EXT)
    try:
        assert isinstance(core.router.store, RedisStore) and core.collector is None
    finally:
        await core.close()


async def test_redis_fed_from_this_process_shares_the_cores_loop(smollm2_dir: Path, redis_server_url: str) -> None:
    core = await Core.open(make_config(smollm2_dir, redis_server_url), collector=IN)
    try:
        assert isinstance(core.collector, Collector)  # a Redis client is bound to the loop that opened it
    finally:
        await core.close()
