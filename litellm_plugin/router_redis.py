"""The Redis of LiteLLM's own ``router_settings`` (``redis_url``, or ``redis_host``/``redis_port``/``redis_password``)
as Cognitora's ``redis_url``, when ``routing_strategy_args`` names none: an operator who already gave LiteLLM a Redis
for its cooldowns and usage gets budgets and the shared store on it, without a second Redis setting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

__all__ = ["router_redis_url"]


def router_redis_url(router: Any) -> str | None:
    """The URL of the Redis the LiteLLM ``router`` was configured with, or None (LiteLLM keeps the connection
    settings on its DualCache's ``redis_cache.redis_kwargs``)."""
    cache = getattr(getattr(router, "cache", None), "redis_cache", None)
    kwargs = getattr(cache, "redis_kwargs", None)
    if not isinstance(kwargs, Mapping):
        return None
    url = kwargs.get("url")
    if isinstance(url, str) and url:
        return url
    host, port = kwargs.get("host"), kwargs.get("port")
    if not host or not port:
        return None
    password = kwargs.get("password")
    auth = f":{quote(str(password), safe='')}@" if password else ""
    scheme = "rediss" if kwargs.get("ssl") else "redis"
    return f"{scheme}://{auth}{host}:{port}/{int(kwargs.get('db') or 0)}"
