"""Which store the proxy's Cognitora uses, and who feeds it: the same rule as ``cognitora extproc``'s.

A store that nothing feeds (no KV events, no load, no health from any engine) places every request blind. Envoy's
service refuses to start that way (``envoy_extproc.server.blind_start_problem``): without ``redis_url`` it needs
``--collector``; with ``redis_url`` it reads what ``cognitora collector`` writes beside it, or feeds Redis itself
with ``--collector``. Here the same choice is ``routing_strategy_args.collector``:

- ``in_process``: this proxy runs the collector (embedded mode's only choice; with Redis, one worker only);
- ``external``: ``cognitora collector --config cognitora.yaml`` runs beside the proxy (Redis mode's default when
  ``routing_strategy_args.redis_url`` is set).

LiteLLM's own ``router_settings`` Redis (``redis_host``, ``redis_url``: set for LiteLLM's cooldowns and usage) is
used as Cognitora's store too when ``routing_strategy_args`` names none, but it no longer switches the mode silently:
without a ``collector`` choice that start is refused, with a message that says which line to add.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cognitora.config import ConfigError
from cognitora.core.deployment import CollectorPlace as Feeder
from cognitora.core.deployment import DeploymentRule, deployment_problem
from cognitora.redaction import redact_url

__all__ = ["StoreMode", "split_collector", "store_mode"]

ARGS_KEY = "collector"
"""The ``routing_strategy_args`` key of this module (never part of ``cognitora.yaml``)."""

CollectorPlace = Literal["in_process", "external"]
_PLACES: tuple[CollectorPlace, ...] = ("in_process", "external")


@dataclass(frozen=True)
class StoreMode:
    redis_url: str | None
    """The store's Redis (None: in-process)."""
    collector: CollectorPlace
    """Who feeds it."""

    @property
    def in_process_collector(self) -> bool:
        return self.collector == "in_process"


def split_collector(args: Mapping[str, Any]) -> tuple[CollectorPlace | None, dict[str, Any]]:
    """``routing_strategy_args.collector``, checked, and the rest of the arguments."""
    rest = dict(args)
    value = rest.pop(ARGS_KEY, None)
    if value is None:
        return None, rest
    if value not in _PLACES:
        raise ConfigError(f"routing_strategy_args.{ARGS_KEY}: expected one of {', '.join(_PLACES)}, got {value!r}")
    place: CollectorPlace = value
    return place, rest


def store_mode(
    *, args_redis_url: str | None, router_redis_url: str | None, collector: CollectorPlace | None, workers: int
) -> StoreMode:
    """The store and its feeder for these settings, or a ``ConfigError`` saying what to add."""
    if args_redis_url is not None:
        return _checked(StoreMode(args_redis_url, collector or "external"), workers)
    if router_redis_url is None:
        rule = deployment_problem(None, Feeder(collector or "in_process"), 1)
        if rule is DeploymentRule.EXTERNAL_NEEDS_SHARED_STORE:
            raise ConfigError(
                f"routing_strategy_args.{ARGS_KEY} is external, but there is no redis_url: an external `cognitora "
                "collector` can only feed a shared store. Set routing_strategy_args.redis_url, or remove "
                f"{ARGS_KEY} (the proxy then runs the collector itself)."
            )
        return StoreMode(None, "in_process")
    if collector is None:
        raise ConfigError(
            f"router_settings has a Redis ({redact_url(router_redis_url)}, LiteLLM's own) and routing_strategy_args "
            "none: Cognitora would keep the fleet's state there (Redis mode), where nothing feeds it unless a "
            "collector runs: no KV events, no load, no health from any engine, every request placed blind. Say "
            f"which: routing_strategy_args.{ARGS_KEY}: external (you run `cognitora collector --config "
            "cognitora.yaml` beside the proxy; `python -m litellm_plugin.export <this config> -o cognitora.yaml` "
            f"writes that file), or {ARGS_KEY}: in_process (this proxy feeds it; one worker)."
        )
    return _checked(StoreMode(router_redis_url, collector), workers)


def _checked(mode: StoreMode, workers: int) -> StoreMode:
    rule = deployment_problem(mode.redis_url, Feeder(mode.collector), workers)
    if rule is DeploymentRule.ONE_COLLECTOR_PER_STORE:
        raise ConfigError(
            f"routing_strategy_args.{ARGS_KEY} is in_process, but the proxy runs {workers} worker processes: each "
            "would run a collector of its own on the same Redis. Use external (run `cognitora collector` once "
            "beside the proxy), or start the proxy with --num_workers 1."
        )
    return mode
