"""Config reload inside the LiteLLM proxy (``cognitora.ops.reload``): a file watch, and SIGHUP where nobody else
handles it; no admin path.

What is watched: the ``routing_strategy_args.config`` file (the cognitora.yaml the LiteLLM config points to). When
it changes, the whole config is rebuilt as at start (the proxy's deployments, read from the Router's ``model_list``
now, with that file and the inline arguments over them), validated, and put in force; a bad file is refused and the
config in force stays, the log says why. A file is what an operator edits anyway, every worker of a
``--num_workers`` proxy sees it, and an admin path would need its own authentication.

SIGHUP: a single-process proxy (uvicorn) handles SIGINT and SIGTERM only, so SIGHUP's default action killed it.
When the core goes live on the main thread's loop and SIGHUP still has its default disposition or is ignored
(nobody, LiteLLM included, took it; ``nohup`` ignores it), ``sighup_reloads`` puts the same reload on it
(``loop.add_signal_handler``), and puts the disposition back when the core closes. Where SIGHUP is someone else's
it is left alone: a ``--num_workers`` proxy's supervisor (uvicorn's ``Multiprocess`` restarts its workers on it)
or gunicorn's master get it, not Cognitora; an SDK script's private loop thread cannot take signals. Inline
``routing_strategy_args`` live in LiteLLM's own config: they change with a proxy restart (or LiteLLM's own config
reload).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cognitora.config import CognitoraConfig
from cognitora.ops.reload import ConfigSource, Reloadable
from litellm_plugin.fleet import ARGS_KEY_CONFIG, Fleet, build_fleet

__all__ = ["WATCH_INTERVAL_S", "ReloadedFleet", "config_source", "sighup_reloads"]

log = logging.getLogger("cognitora.litellm")

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


def sighup_reloads(live: Reloadable, loop: asyncio.AbstractEventLoop) -> Callable[[], None] | None:
    """Reload ``live`` on SIGHUP, on ``loop`` (the running one, the core's), when SIGHUP is nobody's yet; returns
    what takes the handler off again, or None where it was left alone (see the module's docstring)."""
    # SIG_IGN is nobody's either: a proxy started under nohup (or by a runner that ignores hangups) inherits it, and
    # an operator's explicit SIGHUP should reload it all the same. A Python handler is somebody's (uvicorn's
    # supervisor, gunicorn's master): left alone.
    before = signal.getsignal(signal.SIGHUP)
    if threading.current_thread() is not threading.main_thread() or before not in (signal.SIG_DFL, signal.SIG_IGN):
        log.info("SIGHUP is not Cognitora's here: the config reloads when its file changes")
        return None
    pending: set[asyncio.Task[Any]] = set()

    def on_sighup() -> None:
        task = loop.create_task(live.reload("SIGHUP"))
        pending.add(task)  # held: a task only the loop references may be collected before it ends
        task.add_done_callback(pending.discard)

    try:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    except (NotImplementedError, RuntimeError, ValueError) as exc:  # no unix signals on this loop
        log.info("SIGHUP cannot reload the config here (%s): the config reloads when its file changes", exc)
        return None

    def off() -> None:
        if not loop.is_closed():
            loop.remove_signal_handler(signal.SIGHUP)  # back to SIG_DFL
            if before == signal.SIG_IGN:
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as it was

    return off
