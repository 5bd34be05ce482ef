"""The deployment rules, decided once for both gateways (``deployment_problem``); each adapter says a broken rule in
its own words, naming its own knobs (``cognitora extproc --collector``, LiteLLM's ``routing_strategy_args.collector``):

- a store nothing feeds places every request blind: the in-process store needs this process's collector, unless
  the operator said so (``CollectorPlace.NONE``: measurements);
- an external ``cognitora collector`` can only feed a shared store (Redis);
- several worker processes need a shared store (each would otherwise place on its own partial view), and with one
  only one of them may run the collector.

A leaf: an adapter checks its setup before it loads anything.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CollectorPlace", "DeploymentRule", "deployment_problem"]


class CollectorPlace(StrEnum):
    """Who feeds the store the core reads (KV events, load, health)."""

    IN_PROCESS = "in_process"
    """This process runs the collector: on a thread of its own over the in-process store (scrapes and KV events
    never wait behind the streams the gateway serves); on the core's loop over Redis (a client is bound to it)."""
    EXTERNAL = "external"
    """``cognitora collector`` runs beside the gateways and writes the shared store."""
    NONE = "none"
    """Nothing, and the operator said so (``--without-collector``: measurements of blind placement)."""


class DeploymentRule(StrEnum):
    """A deployment rule a setup breaks (``deployment_problem``)."""

    BLIND = "blind"
    """In-process store, and no collector chosen: nothing would feed it."""
    EXTERNAL_NEEDS_SHARED_STORE = "external_needs_shared_store"
    """An external collector, and no shared store for it to write."""
    WORKERS_NEED_SHARED_STORE = "workers_need_shared_store"
    """Several worker processes over in-process stores: each would place blind to the others' work."""
    ONE_COLLECTOR_PER_STORE = "one_collector_per_store"
    """Several worker processes, each running a collector on the same Redis."""


def deployment_problem(redis_url: str | None, collector: CollectorPlace | None, workers: int) -> DeploymentRule | None:
    """The rule this setup breaks, or None. ``collector``: the adapter's choice (None: none made)."""
    if redis_url is None:
        if workers > 1:
            return DeploymentRule.WORKERS_NEED_SHARED_STORE
        if collector is CollectorPlace.EXTERNAL:
            return DeploymentRule.EXTERNAL_NEEDS_SHARED_STORE
        if collector is None:
            return DeploymentRule.BLIND
        return None
    if collector is CollectorPlace.IN_PROCESS and workers > 1:
        return DeploymentRule.ONE_COLLECTOR_PER_STORE
    return None
