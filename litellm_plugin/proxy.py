"""What a LiteLLM proxy leaves for the plugin in each of its workers: that it is a proxy, its config's folder, its
worker count. Read by ``register`` (start-up checks, relative paths) and ``strategy`` (logging and GC pacing in a
proxy); apart from both so that the strategy, which ``register`` builds, does not import ``register`` back.

Every LiteLLM internal read here is pinned by tests/litellm/test_litellm_contract.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["PROXY_WORKERS_ENV", "in_proxy", "litellm_config_dir", "proxy_workers"]

_PROXY_MODULE = "litellm.proxy.proxy_server"
"""Imported in every proxy worker (it is the app), and by nothing an SDK script needs."""
PROXY_WORKERS_ENV = "NUM_WORKERS"
"""Set by ``litellm`` (proxy_cli) to ``--num_workers`` before it starts the workers, which inherit it."""


def litellm_config_dir() -> Path | None:
    """The folder of the config the LiteLLM proxy was started with (``litellm --config PATH``); None in an SDK
    script, or when the proxy's config is not a local file (a bucket): relative paths then use the current directory.
    """
    proxy = sys.modules.get(_PROXY_MODULE)
    path = getattr(proxy, "user_config_file_path", None)  # set by the proxy's load_config before the Router exists
    if not path:
        return None
    file = Path(str(path)).expanduser()
    return file.resolve().parent if file.is_file() else None


def in_proxy() -> bool:
    """Whether this process is a LiteLLM proxy (its app module is imported), not an SDK script."""
    return _PROXY_MODULE in sys.modules


def proxy_workers(environ: Mapping[str, str] | None = None) -> int:
    """How many worker processes serve this LiteLLM proxy (1 outside the proxy)."""
    if _PROXY_MODULE not in sys.modules:
        return 1
    value = (os.environ if environ is None else environ).get(PROXY_WORKERS_ENV, "1")
    try:
        return max(1, int(value))
    except ValueError:
        return 1
