"""Make ``routing_strategy: cognitora`` a name LiteLLM accepts, and install the strategy when a Router uses it.

LiteLLM (the tested range, ``SUPPORTED_LITELLM``) has no registry for named routing strategies: the name is checked
against a hard-coded tuple (``litellm.router_utils.routing_groups.VALID_ROUTING_STRATEGIES``) and only its own
``lar1`` gets installed through the public ``Router.set_custom_routing_strategy``. ``register()`` does the two
things LiteLLM does for ``lar1``:

1. adds ``"cognitora"`` to that tuple (a module global, read at call time);
2. wraps ``Router.__init__`` and ``Router.update_settings`` so a Router whose ``routing_strategy`` ends up
   ``"cognitora"`` gets a ``CognitoraRoutingStrategy`` through ``set_custom_routing_strategy``.

The ``__init__`` wrapper keeps the original signature: the proxy decides which ``router_settings`` keys to pass
from ``inspect.getfullargspec(Router.__init__)``, which ignores ``__wrapped__``; a plain ``*args, **kwargs``
wrapper makes it drop every router setting silently.

Inside the proxy, ``install`` also reads two facts the proxy leaves for its workers: the LiteLLM config's path
(relative paths in ``routing_strategy_args`` are relative to its folder) and the worker count (embedded mode is
refused under ``--num_workers`` > 1: each worker would keep a store and a collector of its own).

Everything here is idempotent, and every LiteLLM internal it touches is pinned by tests/test_litellm_contract.py.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from cognitora.config import CognitoraConfig, ConfigError

STRATEGY_NAME = "cognitora"
"""The value of ``router_settings.routing_strategy`` that selects Cognitora."""
SUPPORTED_LITELLM = ">=1.106.0,<=1.108.7"
"""The LiteLLM versions ``make test`` runs the plugin against (both ends): the ``litellm`` extra's range."""
_UPGRADE_HINT = (
    f"install a LiteLLM the plugin is tested with: pip install 'litellm[proxy]{SUPPORTED_LITELLM}' (the "
    "cognitora-router[litellm] extra), or see docs/litellm.md ('What breaks on upgrade')"
)

_PATCH_MARK = "_cognitora_patched"
_PROXY_MODULE = "litellm.proxy.proxy_server"
"""Imported in every proxy worker (it is the app), and by nothing an SDK script needs."""
PROXY_WORKERS_ENV = "NUM_WORKERS"
"""Set by ``litellm`` (proxy_cli) to ``--num_workers`` before it starts the workers, which inherit it."""
_ROUTING_GROUPS_MODULES = (
    "litellm.router_utils.routing_groups",  # 1.108.x
    "litellm.litellm_core_utils.routing_groups",  # 1.110.x moved it here
)

log = logging.getLogger("cognitora.litellm")


class LiteLLMIncompatible(RuntimeError):
    """An internal of LiteLLM that the plugin relies on has moved; the message says which and where to look."""


def routing_groups_module() -> ModuleType:
    """The LiteLLM module that holds ``VALID_ROUTING_STRATEGIES``."""
    for name in _ROUTING_GROUPS_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "VALID_ROUTING_STRATEGIES"):
            return module
    raise LiteLLMIncompatible(
        "cannot find VALID_ROUTING_STRATEGIES in " + " or ".join(_ROUTING_GROUPS_MODULES) + ": this LiteLLM "
        f"version validates strategy names elsewhere: {_UPGRADE_HINT}."
    )


def register() -> None:
    """Teach LiteLLM the ``cognitora`` strategy name. Safe to call any number of times."""
    import litellm

    groups = routing_groups_module()
    valid: tuple[str, ...] = tuple(getattr(groups, "VALID_ROUTING_STRATEGIES"))  # noqa: B009
    if STRATEGY_NAME not in valid:
        setattr(groups, "VALID_ROUTING_STRATEGIES", (*valid, STRATEGY_NAME))  # noqa: B010

    router_cls = litellm.Router
    if getattr(router_cls.__init__, _PATCH_MARK, False):
        return
    if not hasattr(router_cls, "set_custom_routing_strategy"):
        raise LiteLLMIncompatible(
            "litellm.Router.set_custom_routing_strategy is gone (LiteLLM >= 1.110 uses Router.register_plugin): "
            f"{_UPGRADE_HINT}."
        )
    if not hasattr(router_cls, "get_model_from_alias"):
        # Before 1.106 it was private (_get_model_from_alias): the strategy's fallback to LiteLLM's own choice
        # (simple_shuffle) needs it, and would fail at the first request of a model group Cognitora does not place.
        raise LiteLLMIncompatible(f"litellm.Router.get_model_from_alias is missing (LiteLLM < 1.106): {_UPGRADE_HINT}.")
    setattr(router_cls, "__init__", _wrap_init(router_cls.__init__))  # noqa: B010
    setattr(router_cls, "update_settings", _wrap_update_settings(router_cls.update_settings))  # noqa: B010


def bootstrap() -> None:
    """Entry for ``LITELLM_WORKER_STARTUP_HOOKS=litellm_plugin.register:bootstrap`` (an alternative trigger)."""
    register()


def _wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(self, "routing_strategy", None) == STRATEGY_NAME:
            install(self, getattr(self, "routing_strategy_args", None) or {})

    # The proxy reads Router.__init__'s argument names with getfullargspec, which does not follow __wrapped__.
    __init__.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    setattr(__init__, _PATCH_MARK, True)
    return __init__


def _wrap_update_settings(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def update_settings(self: Any, **kwargs: Any) -> None:
        before = (getattr(self, "routing_strategy", None), getattr(self, "routing_strategy_args", None))
        original(self, **kwargs)
        after = (getattr(self, "routing_strategy", None), getattr(self, "routing_strategy_args", None))
        if after[0] != STRATEGY_NAME:
            uninstall(self)
        elif before != after or "get_available_deployment" not in vars(self):
            # A strategy switch resets LiteLLM's custom strategy; new args mean a new fleet config.
            install(self, after[1] or {})

    setattr(update_settings, _PATCH_MARK, True)
    return update_settings


def install(router: Any, routing_strategy_args: dict[str, Any]) -> None:
    """Build the Cognitora strategy for ``router`` from its model_list and args, and hand it to LiteLLM."""
    from litellm_plugin import auth, metrics
    from litellm_plugin.fleet import build_fleet
    from litellm_plugin.router_redis import router_redis_url
    from litellm_plugin.store_mode import split_collector, store_mode
    from litellm_plugin.strategy import CognitoraRoutingStrategy

    uninstall(router)
    if in_proxy():
        auth.check_at_start()  # the API keys of Cognitora's custom_auth hook, if the proxy uses it
    metrics_settings, fleet_args = metrics.split_args(routing_strategy_args)
    collector, fleet_args = split_collector(fleet_args)
    workers = proxy_workers()
    if "redis_url" not in fleet_args:
        # LiteLLM's own router_settings Redis: one Redis setting, not two, but never a silent switch to Redis mode
        mode = store_mode(
            args_redis_url=None, router_redis_url=router_redis_url(router), collector=collector, workers=workers
        )
        if mode.redis_url is not None:
            fleet_args["redis_url"] = mode.redis_url
    fleet = build_fleet(router.model_list or [], fleet_args, litellm_config_dir())
    mode = store_mode(
        args_redis_url=fleet.config.redis_url, router_redis_url=None, collector=collector, workers=workers
    )
    problem = embedded_mode_problem(fleet.config, workers)
    if problem is not None:
        raise ConfigError(problem)  # before the start-up checks: a setup that cannot work whatever its files
    strategy = CognitoraRoutingStrategy.for_fleet(router, fleet, metrics_settings, mode.in_process_collector)
    router.set_custom_routing_strategy(strategy)
    router._cognitora_strategy = strategy
    log.info("cognitora routing strategy installed for %d deployments", len(router.model_list or []))


def litellm_config_dir() -> Path | None:
    """The folder of the config the LiteLLM proxy was started with (``litellm --config PATH``); None in an SDK
    script, or when the proxy's config is not a local file (a bucket): relative paths then use the current directory.
    """
    proxy = sys.modules.get(_PROXY_MODULE)
    path = getattr(proxy, "user_config_file_path", None)  # set by the proxy's load_config before the Router exists
    if not path:
        return None
    file = Path(str(path)).expanduser()
    return file.resolve().parent if file.is_file() else None


def in_proxy() -> bool:
    """Whether this process is a LiteLLM proxy (its app module is imported), not an SDK script."""
    return _PROXY_MODULE in sys.modules


def proxy_workers(environ: Mapping[str, str] | None = None) -> int:
    """How many worker processes serve this LiteLLM proxy (1 outside the proxy)."""
    if _PROXY_MODULE not in sys.modules:
        return 1
    value = (os.environ if environ is None else environ).get(PROXY_WORKERS_ENV, "1")
    try:
        return max(1, int(value))
    except ValueError:
        return 1


def embedded_mode_problem(config: CognitoraConfig, workers: int) -> str | None:
    """Why this config cannot run in a proxy of ``workers`` processes, or None."""
    if config.redis_url is not None or workers <= 1:
        return None
    return (
        f"routing_strategy_args has no redis_url (embedded mode), but the proxy runs {workers} worker processes "
        f"(--num_workers / {PROXY_WORKERS_ENV}={workers}): each would keep its own store and its own collector, and "
        "place blind to the other workers' in-flight requests and routed prefixes. Set redis_url in "
        "routing_strategy_args (the workers then share one store) and run `cognitora collector --config "
        "cognitora.yaml` once beside the proxy (`python -m litellm_plugin.export <litellm config> -o cognitora.yaml` "
        "writes that file), or start the proxy with --num_workers 1."
    )


def uninstall(router: Any) -> None:
    """Stop the Router's previous Cognitora strategy (its embedded store and collector), if any."""
    previous = vars(router).pop("_cognitora_strategy", None)
    if previous is not None:
        previous.close()
