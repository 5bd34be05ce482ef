"""What the LiteLLM adapter reads for budgets from LiteLLM's own settings: the Redis of ``router_settings`` (one
Redis setting, not two), and identity and priority only from the authenticated key, never from the body."""

from __future__ import annotations

from typing import Any

import litellm

from litellm_plugin.router_redis import router_redis_url
from litellm_plugin.translate import route_request

MODEL_LIST = [{"model_name": "chat", "litellm_params": {"model": "openai/smollm2", "api_base": "http://h:1/v1"}}]


def test_router_settings_redis_becomes_cognitoras() -> None:
    plain = litellm.Router(model_list=MODEL_LIST)
    assert router_redis_url(plain) is None
    by_host = litellm.Router(model_list=MODEL_LIST, redis_host="10.0.0.9", redis_port=6380, redis_password="p@ss")
    assert router_redis_url(by_host) == "redis://:p%40ss@10.0.0.9:6380/0"
    by_url = litellm.Router(model_list=MODEL_LIST, redis_url="redis://10.0.0.9:6379/2")
    assert router_redis_url(by_url) == "redis://10.0.0.9:6379/2"


def kwargs(meta: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": meta, "proxy_server_request": {"body": body}, **body}


def test_identity_and_priority_come_from_the_key_not_the_body() -> None:
    meta = {
        "user_api_key_team_id": "alpha",
        "user_api_key_hash": "88ab",
        "user_api_key_alias": "alpha-ci",
        "user_api_key_user_id": "alice",
        "user_api_key_end_user_id": "mallory",  # LiteLLM copies the body's `user` here: the client's claim
        "user_api_key_team_metadata": {"priority": "batch"},  # LiteLLM's own spelling, set by an admin
    }
    body = {"model": "chat", "user": "mallory", "messages": [{"role": "user", "content": "hi"}]}
    req = route_request("chat", body["messages"], None, kwargs(meta, body), ["h:1"])
    assert (req.team, req.api_key_id, req.user, req.priority) == ("alpha", "alpha-ci", "alice", "batch")
    meta = {"user_api_key_hash": "88ab", "user_api_key_metadata": {"cognitora_priority": "default", "priority": "x"}}
    req = route_request("chat", body["messages"], None, kwargs(meta, body), ["h:1"])
    assert (req.api_key_id, req.user, req.priority) == ("88ab", None, "default")
