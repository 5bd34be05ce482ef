from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_cluster import redis_cluster
from tests.redis_server import redis_url

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct"

# LiteLLM downloads its model cost map at import; this machine (and CI) has no internet, and no test needs it.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """A real Redis (see tests/redis_server.py)."""
    with redis_url() as url:
        yield url


@pytest.fixture
def key_prefix() -> str:
    """A fresh key prefix per test, so tests sharing one Redis never see each other's keys."""
    return f"cogtest-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    if not (SMOLLM2 / "tokenizer.json").exists():
        pytest.fail(f"missing {SMOLLM2}/tokenizer.json: the shared model files must sit beside the checkout")
    return SMOLLM2


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A real 3-master Redis Cluster started for this session (see tests/redis_cluster.py); never skipped."""
    with redis_cluster() as url:
        yield url
