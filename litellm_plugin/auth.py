"""API keys mapped to teams in the LiteLLM proxy without its database: a ``custom_auth`` hook.

LiteLLM's own teams and virtual keys live in its PostgreSQL database (``/key/generate``, ``/team/new``). Without one
(and LiteLLM 1.108.7's ``[proxy]`` extra brings no ``prisma``, whose engines are downloaded at first use), its
documented way to authenticate is ``general_settings.custom_auth``: a function given each request's API key that
returns the caller's ``UserAPIKeyAuth``. This one reads the keys from the same config::

    general_settings:
      master_key: os.environ/LITELLM_MASTER_KEY             # still the admin key (LiteLLM's own routes)
      custom_auth: litellm_plugin.auth.user_api_key_auth
      cognitora_api_keys:                                  # one entry per key; the key itself from the environment
        - {key: os.environ/RESEARCH_API_KEY, team: research, key_alias: alice}
        - {key: os.environ/EVALS_API_KEY, team: nightly-evals, key_alias: evals, priority: batch}

A request with a listed key gets that key's ``team_id``, ``key_alias``, ``user_id`` and ``metadata.cognitora_priority``
(what Cognitora's budgets, burst and placement read, docs/litellm.md "Per request"); the master key stays the
proxy admin; any other key is a 401. Keys are compared in constant time and only their SHA-256 reaches LiteLLM's
logs (as LiteLLM does for its own keys).
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cognitora.config import ConfigError, resolve_env

__all__ = ["ApiKeyEntry", "check_at_start", "identify", "key_hash", "parse_keys", "user_api_key_auth"]

SETTINGS_KEY = "cognitora_api_keys"
"""The ``general_settings`` key listing the API keys."""


class ApiKeyEntry(BaseModel):
    """One ``general_settings.cognitora_api_keys[]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=16)
    """The API key clients send (``Authorization: Bearer <key>``); write ``os.environ/NAME``."""
    team: str = Field(min_length=1)
    """The team its requests count against (``budgets.teams``, ``burst.teams``)."""
    key_alias: str = Field(min_length=1)
    """The key's name in budgets, reports and logs (never the key)."""
    user: str | None = None
    """The end user, when the key is one person's."""
    priority: str | None = None
    """The key's priority class (``placement.priorities``); default: the team's, else ``default``."""


@dataclass(frozen=True)
class _Keys:
    source: tuple[Any, ...]
    entries: tuple[tuple[bytes, ApiKeyEntry], ...]


_cache: list[_Keys] = []


def parse_keys(raw: Any) -> tuple[ApiKeyEntry, ...]:
    """The entries of ``general_settings.cognitora_api_keys``, or a ``ConfigError`` saying what is wrong."""
    where = f"general_settings.{SETTINGS_KEY}"
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise ConfigError(f"{where} must be a list of {{key, team, key_alias}} entries")
    entries: list[ApiKeyEntry] = []
    for i, item in enumerate(raw):
        if isinstance(item, Mapping) and item.get("key") is None and "key" in item:
            raise ConfigError(
                f"{where}[{i}].key is null. LiteLLM's proxy turns os.environ/NAME into null when NAME is not set: "
                "export the variable before starting the proxy"
            )
        try:
            entries.append(ApiKeyEntry.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            hint = " (an API key: sk-$(openssl rand -hex 16))" if field == "key" else ""
            raise ConfigError(f"{where}[{i}].{field}: {first['msg']}{hint}") from None
    keys = [e.key for e in entries]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{where}: the same key is listed twice")
    return tuple(entries)


def check_at_start() -> None:
    """In a proxy whose ``custom_auth`` is this module's hook: its keys, read from the proxy's config file as the
    proxy will read them, must make a valid list (a ``ConfigError`` stops the start, naming the entry), so a key
    whose variable is not set is found before the first client is refused. Called when the Router is built."""
    proxy = sys.modules.get("litellm.proxy.proxy_server")
    hook = getattr(proxy, "user_custom_auth", None)
    if hook is None or getattr(hook, "__module__", None) != __name__:
        return
    path = getattr(proxy, "user_config_file_path", None)
    if not path or not Path(str(path)).is_file():
        return  # a config from a bucket or the database: checked at the first request instead
    config = yaml.safe_load(Path(str(path)).read_text()) or {}
    raw = (config.get("general_settings") or {}).get(SETTINGS_KEY)
    if raw is None:
        raise ConfigError(
            f"general_settings.custom_auth is {__name__}.user_api_key_auth but general_settings.{SETTINGS_KEY} lists "
            "no key: only the master key would be accepted. List the keys and their teams (docs/litellm.md)"
        )
    parse_keys(resolve_env({SETTINGS_KEY: raw}, f"{path}: general_settings")[SETTINGS_KEY])


def _entries(raw: Any) -> tuple[tuple[bytes, ApiKeyEntry], ...]:
    source = tuple(raw) if isinstance(raw, Sequence) and not isinstance(raw, str | bytes) else (raw,)
    if _cache and _cache[0].source == source:
        return _cache[0].entries
    parsed = tuple((e.key.encode(), e) for e in parse_keys(raw))
    _cache[:] = [_Keys(source, parsed)]
    return parsed


def identify(api_key: str, raw_keys: Any) -> ApiKeyEntry | None:
    """The entry whose key is ``api_key`` (every entry is compared, in constant time), or None."""
    found: ApiKeyEntry | None = None
    given = api_key.encode()
    for key, entry in _entries(raw_keys):
        if hmac.compare_digest(key, given):
            found = entry
    return found


def key_hash(api_key: str) -> str:
    """What LiteLLM logs for a key: its SHA-256, as ``litellm.proxy.utils.hash_token``."""
    return hashlib.sha256(api_key.encode()).hexdigest()


async def user_api_key_auth(request: Any, api_key: str) -> Any:
    """LiteLLM's ``custom_auth`` hook: the ``UserAPIKeyAuth`` of ``api_key`` (the bearer token, without "Bearer ")."""
    from litellm.constants import LITELLM_PROXY_MASTER_KEY_ALIAS
    from litellm.proxy import proxy_server
    from litellm.proxy._types import LitellmUserRoles, ProxyErrorTypes, ProxyException, UserAPIKeyAuth

    api_key = api_key.removeprefix("Bearer ").strip()  # LiteLLM passes the header's value as it came
    master = proxy_server.master_key
    if isinstance(master, str) and master and hmac.compare_digest(master.encode(), api_key.encode()):
        return UserAPIKeyAuth(
            api_key=LITELLM_PROXY_MASTER_KEY_ALIAS,
            user_role=LitellmUserRoles.PROXY_ADMIN,
            user_id=proxy_server.litellm_proxy_admin_name,
        )
    raw = (proxy_server.general_settings or {}).get(SETTINGS_KEY, [])
    try:
        entry = identify(api_key, raw)
    except ConfigError as exc:
        raise ProxyException(message=str(exc), type=ProxyErrorTypes.auth_error, param="api_key", code=500) from None
    if entry is None:
        raise ProxyException(
            message="invalid API key: not one of general_settings.cognitora_api_keys (ask the proxy's operator)",
            type=ProxyErrorTypes.auth_error,
            param="api_key",
            code=401,
        )
    metadata = {} if entry.priority is None else {"cognitora_priority": entry.priority}
    return UserAPIKeyAuth(
        api_key=key_hash(api_key),
        key_alias=entry.key_alias,
        team_id=entry.team,
        user_id=entry.user,
        metadata=metadata,
        user_role=LitellmUserRoles.INTERNAL_USER,
    )
