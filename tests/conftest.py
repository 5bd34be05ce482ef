from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cognitora.sim.tokenizer import SMOLLM2_DIR
from tests.redis_cluster import redis_cluster
from tests.redis_server import private_redis, redis_url

ROOT = Path(__file__).resolve().parent.parent

# LiteLLM downloads its model cost map at import; this machine (and CI) has no internet, and no test needs it.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """A real Redis (see tests/redis_server.py)."""
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
    """A real 3-master Redis Cluster started for this session (see tests/redis_cluster.py); never skipped."""
    with redis_cluster() as url:
        yield url
