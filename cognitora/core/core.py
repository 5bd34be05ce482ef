"""``Core``: the decision core one gateway process runs, built in one place for both gateways.

    prepared = prepare(config)                                   # at start: tokenizers, templates, intent policy
    problem = deployment_problem(config.redis_url, place, workers)   # at start: a setup that cannot work
    core = await Core.open(config, collector=place, prepared=prepared)   # on the loop that serves requests
    decision, attempt = await core.router.admit(request)
    await core.close()

The deployment rules are the core's, decided once (``cognitora.core.deployment``); each adapter says a broken rule
in its own words, naming its own knobs.

``prepare`` is what is loaded once per process, before serving, and handed to the core that starts later (LiteLLM
starts its core on the first request): the prompt keyers and the intent source (fitting a classifier takes a
second; it is not done twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cognitora.collector import Collector, CollectorThread
from cognitora.config import CognitoraConfig
from cognitora.core.deployment import CollectorPlace, DeploymentRule, deployment_problem
from cognitora.core.router import Router
from cognitora.flow.redis_leases import RedisLeases
from cognitora.intent import IntentSource
from cognitora.preflight import prompt_keyers
from kvstate.memory_store import MemoryStore
from kvstate.open import open_store
from kvstate.prompt import PromptKeyer
from kvstate.redis_store import RedisStore
from kvstate.store import Store

__all__ = ["CollectorPlace", "Core", "DeploymentRule", "Prepared", "deployment_problem", "open_leases", "prepare"]


@dataclass(frozen=True)
class Prepared:
    """What a process loads once, at start, for the core it runs."""

    keyers: Mapping[str, PromptKeyer]
    """Each model's prompt keyer, its tokenizer and chat template loaded and compiled."""
    intent: IntentSource | None
    """The model-rewrite policy in force (None: the config has no ``intent`` section)."""


def prepare(config: CognitoraConfig) -> Prepared:
    """Load what the core needs from files, now. Raises ``ConfigError`` naming the key of a bad tokenizer, chat
    template or intent policy."""
    keyers = prompt_keyers(config)
    intent = None if config.intent is None else IntentSource(config.intent, set(config.model_names()))
    return Prepared(keyers, intent)


def open_leases(config: CognitoraConfig, store: Store) -> RedisLeases | None:
    """The flow-control leases this replica shares with the others through the store's Redis, heartbeat started;
    None when ``flow_control.leases`` is off or the store is in process (one process: the queue's own count)."""
    flow = config.flow_control
    if flow is None or not flow.leases.enabled or not isinstance(store, RedisStore):
        return None
    leases = RedisLeases(store.client, config.key_prefix, flow.leases)
    leases.start()
    return leases


class Core:
    """The Router over its store and, when this process feeds the store, the collector. Built by ``open``."""

    def __init__(self, router: Router, collector: Collector | CollectorThread | None) -> None:
        self.router = router
        self.collector = collector

    @classmethod
    async def open(
        cls, config: CognitoraConfig, *, collector: CollectorPlace, prepared: Prepared | None = None
    ) -> Core:
        """The core over the store the config names (Redis, or a Redis Cluster, at ``redis_url``; else in process),
        its collector started when it is this process's. Call on the loop that will serve the requests: the store's
        and the collector's sockets are bound to it. ``prepared``: loaded at start (``prepare``); absent, now."""
        if prepared is None:
            prepared = prepare(config)
        store = open_store(config.redis_url, config.key_prefix, config.redis_cluster)
        leases = open_leases(config, store)
        router = Router(config, store, keyers=prepared.keyers, intent=prepared.intent, leases=leases)
        feeder: Collector | CollectorThread | None = None
        if collector is CollectorPlace.IN_PROCESS:
            feeder = CollectorThread(config, store) if isinstance(store, MemoryStore) else Collector(config, store)
            try:
                await feeder.start()
            except BaseException:
                await router.close()
                raise
        return cls(router, feeder)

    async def close(self) -> None:
        """Stop the collector, let the attempts' store writes land, close the store."""
        if self.collector is not None:
            await self.collector.stop()
        await self.router.close()
