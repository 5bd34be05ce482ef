"""Config reload inside the LiteLLM proxy (``cognitora.ops.reload``): a file watch, no signal and no admin path.

What is watched: the ``routing_strategy_args.config`` file (the cognitora.yaml the LiteLLM config points to). When
it changes, the whole config is rebuilt as at start (the proxy's deployments, read from the Router's ``model_list``
now, with that file and the inline arguments over them), validated, and put in force; a bad file is refused and the
config in force stays, the log says why. Why a file watch: the proxy owns its process's signals (uvicorn's SIGHUP
handling, gunicorn's worker reload), and an admin path would need its own authentication; a file is what an
operator edits anyway, and every worker of a ``--num_workers`` proxy sees it. Inline ``routing_strategy_args``
live in LiteLLM's own config: they change with a proxy restart (or LiteLLM's own config reload).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cognitora.config import CognitoraConfig
from cognitora.ops.reload import ConfigSource
from litellm_plugin.fleet import ARGS_KEY_CONFIG, Fleet, build_fleet

__all__ = ["WATCH_INTERVAL_S", "config_source", "fleet_of"]

WATCH_INTERVAL_S = 2.0
"""Seconds between two looks at the file."""


def config_source(router: Any, routing_strategy_args: Mapping[str, Any], base_dir: Path | None) -> ConfigSource | None:
    """The watched file and the whole config's loader; None when the arguments name no ``config:`` file."""
    path = routing_strategy_args.get(ARGS_KEY_CONFIG)
    if not isinstance(path, str):
        return None
    file_path = Path(path).expanduser()
    if not file_path.is_absolute():
        file_path = (base_dir or Path.cwd()).resolve() / file_path
    args = dict(routing_strategy_args)

    def load() -> CognitoraConfig:
        # As at start, from the deployments the Router lists now; the Fleet rides along for the strategy's commit.
        fleet = build_fleet(list(router.model_list or []), args, base_dir)
        _built[id(fleet.config)] = fleet
        return fleet.config

    return ConfigSource(file_path, load)


_built: dict[int, Fleet] = {}
"""The Fleet of each config ``load`` returned, until ``fleet_of`` takes it."""


def fleet_of(config: CognitoraConfig) -> Fleet | None:
    """The Fleet ``load`` built with ``config`` (taken once)."""
    return _built.pop(id(config), None)
