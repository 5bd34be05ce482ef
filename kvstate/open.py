"""``open_store``: the one place that picks a ``Store`` backend from the configuration.

Its own module because it is the only code that knows both backends: ``kvstate.store`` (the protocol) stays below
``memory_store`` and ``redis_store``, which import it, and nothing in ``kvstate`` imports this module back. The
backends are imported when a store is opened, so a process that never opens Redis never imports the client.
"""

from __future__ import annotations

from kvstate.store import Store

__all__ = ["open_store"]


def open_store(redis_url: str | None, key_prefix: str = "cog", cluster: bool = False) -> Store:
    """The store a process should use: Redis when a URL is configured (a Redis Cluster client when ``cluster``:
    the URL is then one of its nodes), else an in-process ``MemoryStore``."""
    if redis_url is None:
        from kvstate.memory_store import MemoryStore

        return MemoryStore()
    from kvstate.redis_store import RedisStore

    return RedisStore.from_url(redis_url, key_prefix=key_prefix, cluster=cluster)
