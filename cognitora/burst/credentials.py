"""The cloud targets' API keys, for a gateway that injects them itself (Envoy's ext_proc).

Read once at start-up from the environment variables ``burst.targets[].credential_env`` names, and registered with
``cognitora.redaction`` at once: no log line, error or ``explain`` output shows them. A variable that is named
but not set is a start-up error naming the key and the variable (the service would otherwise send every burst
unauthenticated and learn of it from 401s).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cognitora.burst.config import BurstConfig
from cognitora.config import ConfigError
from cognitora.redaction import register_secret

__all__ = ["cloud_api_keys"]


def cloud_api_keys(burst: BurstConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Target name -> its API key, for every target with ``credential_env``."""
    env = os.environ if environ is None else environ
    keys: dict[str, str] = {}
    missing: list[str] = []
    for i, target in enumerate(burst.targets):
        if target.credential_env is None:
            continue
        value = env.get(target.credential_env)
        if not value:
            missing.append(
                f"burst.targets[{i}].credential_env: {target.credential_env} is not set in this process's environment; "
                f"set it to target {target.name!r}'s API key"
            )
            continue
        register_secret(value)
        keys[target.name] = value
    if missing:
        raise ConfigError("; ".join(missing))
    return keys
