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

__all__ = ["WATCH_INTERVAL_S", "ReloadedFleet", "config_source"]

WATCH_INTERVAL_S = 2.0
"""Seconds between two looks at the file."""


class ReloadedFleet:
    """The Fleet built beside the config a reload's ``load`` returned last: what the strategy puts in force with it.
    Only the latest is kept: a load refused or that changed nothing leaves its Fleet to be replaced, not hoarded."""

    def __init__(self) -> None:
        self._latest: tuple[CognitoraConfig, Fleet] | None = None

    def keep(self, config: CognitoraConfig, fleet: Fleet) -> None:
        self._latest = (config, fleet)

    def take(self, config: CognitoraConfig) -> Fleet | None:
        """The Fleet built with ``config`` (this very object), once; None for any other config."""
        latest, self._latest = self._latest, None
        return latest[1] if latest is not None and latest[0] is config else None


def config_source(
    router: Any, routing_strategy_args: Mapping[str, Any], base_dir: Path | None, reloaded: ReloadedFleet
) -> ConfigSource | None:
    """The watched file and the whole config's loader, which leaves each config's Fleet in ``reloaded``; None when
    the arguments name no ``config:`` file."""
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
        reloaded.keep(fleet.config, fleet)
        return fleet.config

    return ConfigSource(file_path, load)
