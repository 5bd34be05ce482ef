"""Where Envoy sends a placed request: endpoint ids (the store's names) <-> the literal ``IP:port`` Envoy needs,
and the order it may try them in.

One ``AddressBook`` per process, built at start from the engines as their hosts resolved (``address_book``) and
updated in place on a config reload (``envoy_extproc.live``); every stream's ``processor.Exchange`` reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from cognitora.config import ConfigError
from cognitora.decision import Decision
from cognitora.preflight import EngineAddress, unresolved_problems

__all__ = ["AddressBook", "address_book", "fallback_order"]

log = logging.getLogger("cognitora.extproc")


class AddressBook:
    """Endpoint ids (the store's names) <-> the literal ``IP:port`` Envoy needs (it resolves no names here).

    Ids without an entry are already literal addresses (the default id of an endpoint is its ``host:port``).
    """

    def __init__(self, addresses: Mapping[str, str], cloud_keys: Mapping[str, str] | None = None) -> None:
        self.addresses = dict(addresses)
        self.cloud_keys = dict(cloud_keys or {})
        """Cloud target -> API key the service injects (``burst.targets[].credential_env``); never logged."""
        self._endpoints = {address: endpoint for endpoint, address in self.addresses.items()}

    def address(self, endpoint: str) -> str:
        return self.addresses.get(endpoint, endpoint)

    def update(self, other: AddressBook) -> None:
        """Take ``other``'s entries (a config reload): one assignment each, so a stream reading meanwhile sees the
        old book or the new one, never a mix within one lookup."""
        self._endpoints = dict(other._endpoints)
        self.cloud_keys = dict(other.cloud_keys)
        self.addresses = dict(other.addresses)

    def endpoint(self, address: str) -> str:
        return self._endpoints.get(address, address)


def fallback_order(decision: Decision, count: int) -> list[str]:
    """The pick, then up to ``count`` of the core's fallbacks, in the core's order."""
    assert decision.endpoint is not None
    return [decision.endpoint, *decision.fallbacks[:count]]


def address_book(engines: Mapping[str, EngineAddress]) -> AddressBook:
    """Endpoint id -> literal ``IP:port``, from the engines as their hosts resolved at start
    (``cognitora.preflight.resolve_engines``): Envoy's ORIGINAL_DST and override_host take only literal addresses.

    Raises ``ConfigError`` naming each endpoint whose host did not resolve, and the host."""
    problems = unresolved_problems(engines)
    if problems:
        detail = (
            problems[0]
            if len(problems) == 1
            else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
        )
        raise ConfigError(
            f"{detail}\nEnvoy is handed literal addresses, so this service resolves each engine's host once, at "
            "start: fix the name (or its DNS), or write the engine's IP address in the url"
        )
    addresses: dict[str, str] = {}
    for engine in engines.values():
        address = engine.socket_address
        assert address is not None  # (resolved: checked above)
        if engine.host not in engine.addresses:
            log.info("endpoint %s: %s resolved to %s (resolved once, at start)", engine.endpoint, engine.host, address)
        addresses[engine.endpoint] = address
    return AddressBook(addresses)
