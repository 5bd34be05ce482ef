"""A LiteLLM ``custom_auth`` module, as source text to write beside a proxy's config: the key ``sk-team-<name>`` is
team ``<name>`` (user ``<name>-user``, key alias ``<name>-key``), the master key is the admin, any other key a 401.

The budget tests and ``bench.budget_concurrency`` both run LiteLLM's proxy with it.
"""

from __future__ import annotations

__all__ = ["TEAM_KEY_AUTH"]

TEAM_KEY_AUTH = """
import os
from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key.startswith("sk-team-"):
        team = key.removeprefix("sk-team-")
        return UserAPIKeyAuth(api_key=key, team_id=team, user_id=f"{team}-user", key_alias=f"{team}-key")
    raise HTTPException(status_code=401, detail="unknown key")
"""
"""Write it as ``team_key_auth.py`` and set ``general_settings.custom_auth: team_key_auth.user_api_key_auth``."""
