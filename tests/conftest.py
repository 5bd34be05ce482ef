from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bench.harness.redis_cluster import redis_cluster
from bench.harness.redis_server import private_redis, redis_url
from cognitora_sim.tokenizer import SMOLLM2_DIR
from kvstate.memory_store import MemoryStore
from kvstate.redis_store import RedisStore
from kvstate.store import Store

ROOT = Path(__file__).resolve().parent.parent

# LiteLLM downloads its model cost map at import; this machine (and CI) has no internet, and no test needs it.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """A real Redis (see bench/harness/redis_server.py)."""
    with redis_url() as url:
        yield url


REDIS_PASSWORD = "canary-redis-pw-7f3a"
"""The password of ``redis_with_password_url``'s server: a test that sees it in any output has found a leak."""


@pytest.fixture(scope="session")
def redis_with_password_url() -> Iterator[str]:
    """A private Redis that requires ``REDIS_PASSWORD``; the URL carries it."""
    with private_redis(REDIS_PASSWORD) as url:
        yield url


@pytest.fixture
def key_prefix() -> str:
    """A fresh key prefix per test, so tests sharing one Redis never see each other's keys."""
    return f"cogtest-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2's tokenizer and chat template, as shipped in the package (no file outside the checkout)."""
    return SMOLLM2_DIR


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A real 3-master Redis Cluster started for this session (see bench/harness/redis_cluster.py); never skipped."""
    with redis_cluster() as url:
        yield url


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[Store]:
    """The store a test takes by naming ``store``: the in-memory one, then a real Redis under ``key_prefix`` (emptied
    and closed after the test). One fixture for every folder, so each store-backed test runs on both backends."""
    if request.param == "memory":
        yield MemoryStore()
        return
    # The store's 0.25 s default timeout is for placement reads; on a loaded test machine a write can take longer,
    # and a timeout here would (correctly) trigger a resync that these tests do not expect.
    store = RedisStore.from_url(
        request.getfixturevalue("redis_server_url"), key_prefix=key_prefix, socket_timeout_s=5.0
    )
    try:
        yield store
    finally:
        await store.delete_everything()
        await store.close()


SERIAL_FOLDERS = ("examples", "deploy")
"""Under ``pytest -n 2`` (``make pytest``), the tests of these folders run one after another on one worker: the
examples listen on the fixed ports their docs name (4000, 8001-8004, 10000, 9901, 9443...), and the deploy tests
build and install the tree. Everything else starts its processes on free ports. The real engines, which take both
cores, are marked ``alone`` here: `make pytest` runs those after the parallel run, with nothing beside them."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).relative_to(ROOT / "tests").parts[0] == "real_engines":
            item.add_marker(pytest.mark.alone)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scheduler for ``-n``: one work unit for the serial folders, one per test elsewhere.
    (``--dist loadgroup`` with ``xdist_group`` marks would say the same, but it renames node ids through an attribute
    pytest 9 no longer reads, and the marks are silently ignored.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SerialFoldersScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/", 2)
            return "serial" if len(parts) == 3 and parts[1] in SERIAL_FOLDERS else nodeid

    return SerialFoldersScheduling(config, log)
