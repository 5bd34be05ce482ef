"""Every Redis key ``RedisStore`` uses, built in one place under one configurable prefix.

Two kinds of hash slot, so that every script and pipeline-transaction touches exactly one slot and runs on one
Redis Cluster node (docs/store.md, "Redis layout", says why it is these two):

- **model slot**, hash tag the model: ``{p}:{<model>}:...``. The block index: what every endpoint holds of that
  model's key space. It is most of the data and most of the writes, so models spread over the cluster's nodes.
- **fleet slot**, hash tag the prefix: ``{p}:fleet:{<p>}:...``. What is per endpoint rather than per model
  (in-flight work, snapshots, health marks), the collectors' heartbeats, and the registries. An engine's queue is
  one queue whatever model or LoRA a request names, so these cannot be split by model without writing each of them
  once per model.

| key | type | content |
|---|---|---|
| ``{p}:{m}:b:<16 hex digits>`` | STRING | one block: byte ``i`` describes endpoint id ``i``: bits 0-2 its tiers |
| | | (GPU, CPU, DISK), bit 3 a speculative entry. A lookup is one GET, whatever the fleet size |
| ``{p}:{m}:e:<endpoint>`` | ZSET | block keys (hex) ``endpoint`` holds, scored by when last stored or routed |
| | | to (us): the per-endpoint key set for purges, for the cap, and (ZCARD) ``cached_blocks`` |
| ``{p}:{m}:s:<endpoint>`` | ZSET | speculative block keys (hex) on ``endpoint``, scored by expiry (ms) |
| ``{p}:{m}:ids`` / ``names`` | HASH | endpoint -> small integer id / id -> endpoint |
| ``{p}:{m}:free_ids`` | ZSET | ids of purged endpoints, reused smallest first (block strings stay short) |
| ``F:models`` | SET | models with any block (``clear_endpoint`` without a model walks them) |
| ``F:inflight:<e>`` | ZSET | in-flight request ids on endpoint ``e``, scored by expiry (ms, server clock) |
| ``F:inflight_tokens:<e>`` | HASH | request id -> ``"<prefill> <decode>"`` |
| ``F:snapshot:<e>`` | HASH | ``EndpointSnapshot`` fields (``kvstate.redis_snapshot``) |
| ``F:snapshot_endpoints`` | SET | endpoints with a snapshot |
| ``F:snapshot_version`` | STRING | random token, replaced on every snapshot write: readers that hold the |
| | | snapshots of this version skip reading them again |
| ``F:health`` | HASH | endpoint -> ``"<expiry ms> <since ms> <reason>"``: gateways' health marks |
| ``F:heartbeats`` | HASH | writer name -> ``"<expiry ms> <at ms>"``: the collectors' heartbeats |

``F`` is ``{p}:fleet:{<p>}``. Only the first ``{...}`` of a key is its hash tag, so what follows it (an endpoint
name) never moves a key to another slot; braces inside a model name would, so they are percent-escaped. A fleet
key can never be a model key: those have ``{`` right after the prefix.
"""

from __future__ import annotations

from kvstate.keys import BlockKey

__all__ = ["BLOCK_HEX_DIGITS", "RedisKeys", "block_hex"]

BLOCK_HEX_DIGITS = 16
"""Block keys appear in key names as exactly this many lowercase hex digits (the scripts slice on it)."""

SPECULATIVE_BIT = 3
"""Bit of an endpoint's byte in a block string that marks a speculative entry (bits 0-2 are ``Tier`` values)."""


def _tag(name: str) -> str:
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def block_hex(key: BlockKey) -> str:
    return f"{key:016x}"


class RedisKeys:
    """Key builder for one prefix."""

    def __init__(self, prefix: str = "cog") -> None:
        if not prefix or any(c in prefix for c in "{} "):
            raise ValueError(f"key prefix must be non-empty without braces or spaces, got {prefix!r}")
        self.prefix = prefix
        self._fleet = f"{prefix}:fleet:{{{prefix}}}"

    # -- model slot (hash-tagged by model) ----------------------------------------------------------------
    def model_base(self, model: str) -> str:
        return f"{self.prefix}:{{{_tag(model)}}}"

    def block_base(self, model: str) -> str:
        """Prefix of every block hash of ``model``; append ``block_hex(key)`` for one block."""
        return f"{self.model_base(model)}:b:"

    def block(self, model: str, key: BlockKey) -> str:
        return self.block_base(model) + block_hex(key)

    def endpoint_blocks(self, model: str, endpoint: str) -> str:
        return f"{self.model_base(model)}:e:{endpoint}"

    def endpoint_speculative(self, model: str, endpoint: str) -> str:
        return f"{self.model_base(model)}:s:{endpoint}"

    def endpoint_ids(self, model: str) -> str:
        return f"{self.model_base(model)}:ids"

    def endpoint_names(self, model: str) -> str:
        return f"{self.model_base(model)}:names"

    def free_ids(self, model: str) -> str:
        return f"{self.model_base(model)}:free_ids"

    # -- fleet slot (hash-tagged by the prefix) -----------------------------------------------------------
    def fleet_base(self) -> str:
        return self._fleet

    def models(self) -> str:
        return f"{self._fleet}:models"

    def inflight(self, endpoint: str) -> str:
        return f"{self._fleet}:inflight:{endpoint}"

    def inflight_tokens(self, endpoint: str) -> str:
        return f"{self._fleet}:inflight_tokens:{endpoint}"

    def snapshot(self, endpoint: str) -> str:
        return f"{self._fleet}:snapshot:{endpoint}"

    def snapshot_endpoints(self) -> str:
        return f"{self._fleet}:snapshot_endpoints"

    def snapshot_version(self) -> str:
        return f"{self._fleet}:snapshot_version"

    def health(self) -> str:
        return f"{self._fleet}:health"

    def heartbeats(self) -> str:
        return f"{self._fleet}:heartbeats"
