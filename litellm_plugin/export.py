"""``python -m litellm_plugin.export litellm_config.yaml > cognitora.yaml``: the fleet a LiteLLM config describes.

In Redis mode the proxy only reads the shared store and ``cognitora collector --config cognitora.yaml`` feeds it;
this writes that ``cognitora.yaml`` from the proxy's own config, so the fleet is written down once (model_list).
``os.environ/...`` references are resolved from this process's environment, as the proxy resolves them, and
relative paths are relative to the LiteLLM config's folder, as they are in the proxy. A ``redis_url`` written
``os.environ/NAME`` is written back the same way (``cognitora.yaml`` reads it so too): the exported file never holds
the secret itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from cognitora.config import ENV_PREFIX, CognitoraConfig, ConfigError, resolve_env
from litellm_plugin.fleet import build_fleet
from litellm_plugin.metrics import split_args

__all__ = ["config_from_litellm_yaml", "main", "to_yaml"]

_FLEET_PARAMS = ("api_base", "model", "custom_llm_provider")
"""The ``litellm_params`` keys the fleet is built from."""


def config_from_litellm_yaml(path: Path) -> CognitoraConfig:
    """The CognitoraConfig the plugin builds inside a proxy started with ``litellm --config path``."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the LiteLLM config ({exc})") from None
    model_list: list[dict[str, Any]] = []
    for index, deployment in enumerate(data.get("model_list") or []):
        params = dict(deployment.get("litellm_params") or {})
        # Only what the fleet reads: a cloud deployment's api_key need not be set where the export runs.
        read = {k: params[k] for k in _FLEET_PARAMS if k in params}
        params.update(resolve_env(read, f"{path}: model_list[{index}].litellm_params"))
        model_list.append({**deployment, "litellm_params": params})
    args = ((data.get("router_settings") or {}).get("routing_strategy_args")) or {}
    # model_info and routing_strategy_args are resolved by build_fleet itself (the SDK hands them over unresolved).
    _, fleet_args = split_args(args)  # the metrics page's keys (litellm_plugin.metrics) are not the fleet's
    return build_fleet(model_list, fleet_args, base_dir=path.resolve().parent).config


def to_yaml(config: CognitoraConfig, secret_refs: dict[str, str] | None = None) -> str:
    """``config`` as ``cognitora.yaml``; ``secret_refs`` (top-level key -> ``os.environ/NAME``) replace resolved
    values."""
    data = config.model_dump(mode="json", exclude_none=True)
    for key, ref in (secret_refs or {}).items():
        if key in data:
            data[key] = ref
    return yaml.safe_dump(data, sort_keys=False)


def secret_references(path: Path) -> dict[str, str]:
    """The ``routing_strategy_args`` top-level values the LiteLLM config writes as ``os.environ/NAME``."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    args = ((data.get("router_settings") or {}).get("routing_strategy_args")) or {}
    return {k: v for k, v in args.items() if isinstance(v, str) and v.startswith(ENV_PREFIX)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m litellm_plugin.export", description=__doc__.split("\n")[0])
    parser.add_argument("litellm_config", type=Path, help="the LiteLLM proxy config (model_list, router_settings)")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    try:
        text = to_yaml(config_from_litellm_yaml(args.litellm_config), secret_references(args.litellm_config))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
