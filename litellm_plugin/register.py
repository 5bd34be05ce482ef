"""``install()``: make ``routing_strategy: cognitora`` a strategy LiteLLM runs. Nothing happens on import.

``install()`` is explicit and idempotent. The documented proxy line ``litellm_settings: {callbacks:
["litellm_plugin.callbacks.cognitora"]}`` calls it (the proxy resolves that name before it builds its Router, and
``litellm_plugin.callbacks`` answers the name by installing); an SDK script calls ``litellm_plugin.install()``
before ``litellm.Router(routing_strategy="cognitora")``. Everything the plugin keeps in a process hangs off the one
``Plugin`` it returns: the callback instance LiteLLM calls, the metrics pages, the installed strategies.

LiteLLM (the tested range, ``SUPPORTED_LITELLM``) has no registry for named routing strategies, and no hook that
hands a plugin the Router it builds. Its one public seam for a strategy is ``Router.set_custom_routing_strategy``
(a ``CustomRoutingStrategyBase``), which needs that Router. So ``install()`` still changes two things in LiteLLM,
and ``uninstall()`` puts both back:

1. the name: ``"cognitora"`` is added to ``litellm.router_utils.routing_groups.VALID_ROUTING_STRATEGIES`` (a
   module-global tuple ``Router.__init__`` and ``update_settings`` check names against; without it a config naming
   the strategy fails before any plugin code runs);
2. ``Router.routing_strategy_init``, the public method every Router calls when it takes a strategy (from
   ``__init__``, after its model list and cache exist, and from ``update_settings`` on a strategy change), is
   wrapped: after LiteLLM's own, a Router whose strategy is ``cognitora`` gets a ``CognitoraRoutingStrategy``
   through ``set_custom_routing_strategy``, and one switching away has its strategy closed. ``__init__`` is left
   alone: its signature, which the proxy reads to pick ``router_settings`` keys, stays LiteLLM's own.

Inside the proxy, the strategy also reads two facts the proxy leaves for its workers (``litellm_plugin.proxy``):
the LiteLLM config's path (relative paths in ``routing_strategy_args`` are relative to its folder) and the worker
count (embedded mode is refused under ``--num_workers`` > 1: each worker would keep a store and a collector of its
own).

Every LiteLLM internal touched here is pinned by tests/litellm/test_litellm_contract.py.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from cognitora.config import CognitoraConfig, ConfigError
from litellm_plugin.proxy import PROXY_WORKERS_ENV, in_proxy, litellm_config_dir, proxy_workers

if TYPE_CHECKING:
    from litellm_plugin.hooks import CognitoraCallbacks
    from litellm_plugin.metrics import MetricsPages
    from litellm_plugin.strategy import CognitoraRoutingStrategy

__all__ = [
    "PROXY_WORKERS_ENV",
    "STRATEGY_NAME",
    "SUPPORTED_LITELLM",
    "LiteLLMIncompatible",
    "Plugin",
    "bootstrap",
    "embedded_mode_problem",
    "in_proxy",
    "install",
    "installed",
    "litellm_config_dir",
    "proxy_workers",
    "routing_groups_module",
    "strategy_for",
    "uninstall",
]

STRATEGY_NAME = "cognitora"
"""The value of ``router_settings.routing_strategy`` that selects Cognitora."""
SUPPORTED_LITELLM = ">=1.106.0,<=1.108.7"
"""The LiteLLM versions ``make test`` runs the plugin against (both ends): the ``litellm`` extra's range."""
_UPGRADE_HINT = (
    f"install a LiteLLM the plugin is tested with: pip install 'litellm[proxy]{SUPPORTED_LITELLM}' (the "
    "cognitora-router[litellm] extra), or see docs/litellm.md ('What breaks on upgrade')"
)

_ROUTING_GROUPS_MODULES = (
    "litellm.router_utils.routing_groups",  # 1.108.x
    "litellm.litellm_core_utils.routing_groups",  # 1.110.x moved it here
)
_NAMES = "VALID_ROUTING_STRATEGIES"
_SEAM = "routing_strategy_init"
"""The Router method wrapped (see the module docstring, 2.)."""

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
        if hasattr(module, _NAMES):
            return module
    raise LiteLLMIncompatible(
        f"cannot find {_NAMES} in " + " or ".join(_ROUTING_GROUPS_MODULES) + ": this LiteLLM "
        f"version validates strategy names elsewhere: {_UPGRADE_HINT}."
    )


class Plugin:
    """The plugin's state in this process, made by ``install()`` and dropped by ``uninstall()``.

    ``callbacks`` is the one ``CustomLogger`` LiteLLM calls for every Cognitora strategy (the instance the proxy's
    callback line names); ``pages`` serves each strategy's metrics; ``strategies`` are the installed strategies.
    """

    def __init__(self) -> None:
        from litellm_plugin.hooks import CognitoraCallbacks
        from litellm_plugin.metrics import MetricsPages

        self.callbacks: CognitoraCallbacks = CognitoraCallbacks()
        self.pages: MetricsPages = MetricsPages()
        self._strategies: weakref.WeakSet[CognitoraRoutingStrategy] = weakref.WeakSet()
        self._names_module: ModuleType | None = None
        self._names_before: tuple[str, ...] = ()
        self._seam_before: Callable[..., None] | None = None

    def strategies(self) -> list[CognitoraRoutingStrategy]:
        """The strategies installed on Routers that still exist."""
        return list(self._strategies)

    # -- what install() changes in LiteLLM, and puts back ------------------------------------------------------
    def _apply(self) -> None:
        import litellm

        router_cls = litellm.Router
        if not callable(getattr(router_cls, "set_custom_routing_strategy", None)):
            raise LiteLLMIncompatible(
                "litellm.Router.set_custom_routing_strategy is gone (LiteLLM >= 1.110 uses Router.register_plugin): "
                f"{_UPGRADE_HINT}."
            )
        if not hasattr(router_cls, "get_model_from_alias"):
            # Before 1.106 it was private (_get_model_from_alias): the strategy's fallback to LiteLLM's own choice
            # (simple_shuffle) needs it, and would fail at the first request of a model group Cognitora does not
            # place.
            raise LiteLLMIncompatible(
                f"litellm.Router.get_model_from_alias is missing (LiteLLM < 1.106): {_UPGRADE_HINT}."
            )
        original = getattr(router_cls, _SEAM, None)
        if not callable(original):
            raise LiteLLMIncompatible(
                f"litellm.Router.{_SEAM} is gone: a Router no longer says when it takes a strategy: {_UPGRADE_HINT}."
            )
        groups = routing_groups_module()
        names: tuple[str, ...] = tuple(getattr(groups, _NAMES))
        self._names_module, self._names_before = groups, names
        if STRATEGY_NAME not in names:
            setattr(groups, _NAMES, (*names, STRATEGY_NAME))
        self._seam_before = original
        setattr(router_cls, _SEAM, _wrap_seam(original, self))

    def _revert(self) -> None:
        import litellm

        if self._seam_before is not None:
            setattr(litellm.Router, _SEAM, self._seam_before)
            self._seam_before = None
        if self._names_module is not None:
            setattr(self._names_module, _NAMES, self._names_before)
            self._names_module = None
        for strategy in self.strategies():
            _reset(strategy.router)
            strategy.close()
        self._strategies.clear()
        for name in _CALLBACK_LISTS:
            found = getattr(litellm, name, None)
            if isinstance(found, list) and self.callbacks in found:
                setattr(litellm, name, [c for c in found if c is not self.callbacks])

    # -- a Router taking a strategy ------------------------------------------------------------------------------
    def _took_strategy(self, router: Any, previous: CognitoraRoutingStrategy | None, name: Any, args: Any) -> None:
        """After LiteLLM's ``routing_strategy_init``: close the Router's previous Cognitora strategy (LiteLLM has
        just dropped it) and, when the new strategy is ``cognitora``, build and hand it the new one."""
        if previous is not None:
            self._strategies.discard(previous)
            previous.close()  # before the new one: its metrics port and collector sockets are freed first
        if str(getattr(name, "value", name)) != STRATEGY_NAME:
            return
        if not args:
            # update_settings(routing_strategy="cognitora") without args: the Router's own, as before the switch
            args = getattr(router, "routing_strategy_args", None)
        strategy = _build_strategy(router, dict(args or {}), self)
        router.set_custom_routing_strategy(strategy)
        self._strategies.add(strategy)
        log.info("cognitora routing strategy installed for %d deployments", len(router.model_list or []))


_CALLBACK_LISTS = (
    "callbacks",
    "success_callback",
    "failure_callback",
    "_async_success_callback",
    "_async_failure_callback",
)
"""LiteLLM's module lists a ``CustomLogger`` ends up in once it has been called (``function_setup`` fans
``litellm.callbacks`` out into the others)."""

_plugin: Plugin | None = None
_guard = threading.Lock()


def install() -> Plugin:
    """Install the plugin in this process (see the module docstring) and return its state. Idempotent: a second
    call returns the same ``Plugin``. Raises ``LiteLLMIncompatible`` on a LiteLLM outside the tested range."""
    global _plugin
    with _guard:
        if _plugin is None:
            plugin = Plugin()
            plugin._apply()
            _plugin = plugin
        return _plugin


def installed() -> Plugin | None:
    """The installed plugin, or None."""
    return _plugin


def uninstall() -> None:
    """Undo ``install()``: close every Cognitora strategy (Routers using one fall back to LiteLLM's default
    choice), take the callback out of LiteLLM's lists, and put back the strategy names and the Router method."""
    global _plugin
    with _guard:
        plugin, _plugin = _plugin, None
        if plugin is not None:
            plugin._revert()


def bootstrap() -> None:
    """Entry for ``LITELLM_WORKER_STARTUP_HOOKS=litellm_plugin.register:bootstrap`` (an alternative trigger)."""
    install()


def strategy_for(router: Any) -> CognitoraRoutingStrategy | None:
    """The Cognitora strategy ``router`` routes with, or None: read from what LiteLLM's public
    ``set_custom_routing_strategy`` stored on it (the bound method's owner)."""
    from litellm_plugin.strategy import CognitoraRoutingStrategy

    method = vars(router).get("async_get_available_deployment")
    owner = getattr(method, "__self__", None)
    return owner if isinstance(owner, CognitoraRoutingStrategy) else None


def _reset(router: Any) -> None:
    """Drop a custom strategy from ``router`` as LiteLLM's own reset does (the instance attributes it set)."""
    for attr in ("get_available_deployment", "async_get_available_deployment"):
        vars(router).pop(attr, None)


def _wrap_seam(original: Callable[..., None], plugin: Plugin) -> Callable[..., None]:
    @functools.wraps(original)
    def routing_strategy_init(self: Any, *args: Any, **kwargs: Any) -> None:
        previous = strategy_for(self)
        original(self, *args, **kwargs)  # validates the name and drops any custom strategy, as without the plugin
        bound = _bind_seam_args(args, kwargs)
        plugin._took_strategy(self, previous, bound[0], bound[1])

    return routing_strategy_init


def _bind_seam_args(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(routing_strategy, routing_strategy_args)`` of a ``routing_strategy_init`` call, however they were passed."""
    values = list(args) + [None] * 2
    return kwargs.get("routing_strategy", values[0]), kwargs.get("routing_strategy_args", values[1])


def _build_strategy(router: Any, routing_strategy_args: dict[str, Any], plugin: Plugin) -> CognitoraRoutingStrategy:
    """The Cognitora strategy for ``router`` from its model_list and args, once the start-up checks pass."""
    from litellm_plugin import auth, metrics
    from litellm_plugin.fleet import build_fleet
    from litellm_plugin.router_redis import router_redis_url
    from litellm_plugin.store_mode import split_collector, store_mode
    from litellm_plugin.strategy import CognitoraRoutingStrategy

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
    strategy = CognitoraRoutingStrategy.for_fleet(
        router, fleet, plugin.callbacks, plugin.pages, metrics_settings, mode.in_process_collector
    )
    strategy.watch_config(fleet_args, litellm_config_dir())  # the config: file reloads when it changes
    return strategy


def embedded_mode_problem(config: CognitoraConfig, workers: int) -> str | None:
    """Why this config cannot run in a proxy of ``workers`` processes, or None (the core's rule: embedded mode runs
    its own collector, ``cognitora.core.deployment``)."""
    from cognitora.core.deployment import CollectorPlace, DeploymentRule, deployment_problem

    rule = deployment_problem(config.redis_url, CollectorPlace.IN_PROCESS, workers)
    if rule is not DeploymentRule.WORKERS_NEED_SHARED_STORE:
        return None
    return (
        f"routing_strategy_args has no redis_url (embedded mode), but the proxy runs {workers} worker processes "
        f"(--num_workers / {PROXY_WORKERS_ENV}={workers}): each would keep its own store and its own collector, and "
        "place blind to the other workers' in-flight requests and routed prefixes. Set redis_url in "
        "routing_strategy_args (the workers then share one store) and run `cognitora collector --config "
        "cognitora.yaml` once beside the proxy (`python -m litellm_plugin.export <litellm config> -o cognitora.yaml` "
        "writes that file), or start the proxy with --num_workers 1."
    )
