"""Every Redis key ``RedisStore`` uses, built in one place under one configurable prefix.

Model-level keys are hash-tagged by model (``{prefix}:{<model>}:...``) so one model's prefix lookup touches one
Redis Cluster slot and can run as one server-side script. Endpoint-level keys are hash-tagged by endpoint
(``{prefix}:ep:{<endpoint>}:...``) so an endpoint's in-flight ZSET and HASH are updated atomically together.

| key | type | content |
|---|---|---|
| ``{p}:{m}:b:<16 hex digits>`` | STRING | one block: byte ``i`` describes endpoint id ``i``: bits 0-2 its tiers |
| | | (GPU, CPU, DISK), bit 3 a speculative entry. A lookup is one GET, whatever the fleet size |
| ``{p}:{m}:e:<endpoint>`` | ZSET | block keys (hex) ``endpoint`` holds, scored by when last stored or routed |
| | | to (us): the per-endpoint key set for purges and for the cap |
| ``{p}:{m}:s:<endpoint>`` | ZSET | speculative block keys (hex) on ``endpoint``, scored by expiry (ms) |
| ``{p}:{m}:ids`` / ``names`` | HASH | endpoint -> small integer id / id -> endpoint |
| ``{p}:{m}:free_ids`` | ZSET | ids of purged endpoints, reused smallest first (block strings stay short) |
| ``{p}:models`` | SET | models with any block (``clear_endpoint`` without a model walks them) |
| ``{p}:ep:{e}:inflight`` | ZSET | in-flight request ids, scored by expiry (ms, server clock) |
| ``{p}:ep:{e}:inflight:tokens`` | HASH | request id -> ``"<prefill> <decode>"`` |
| ``{p}:ep:{e}:snapshot`` | HASH | ``EndpointSnapshot`` fields |
| ``{p}:snapshot_endpoints`` | SET | endpoints with a snapshot |
| ``{p}:snapshot_version`` | STRING | random token, replaced on every snapshot write: readers that hold the |
| | | snapshots of this version skip reading them again |
| ``{p}:health`` | HASH | endpoint -> ``"<expiry ms> <since ms> <reason>"``: gateways' health marks |

Braces inside a model or endpoint name would move the hash tag, so they are percent-escaped.
"""

from __future__ import annotations

from kvstate.keys import BlockKey

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

    # -- model level (hash-tagged by model) ---------------------------------------------------------------
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

    def models(self) -> str:
        return f"{self.prefix}:models"

    # -- endpoint level (hash-tagged by endpoint) ---------------------------------------------------------
    def endpoint_base(self, endpoint: str) -> str:
        return f"{self.prefix}:ep:{{{_tag(endpoint)}}}"

    def inflight(self, endpoint: str) -> str:
        return f"{self.endpoint_base(endpoint)}:inflight"

    def inflight_tokens(self, endpoint: str) -> str:
        return f"{self.endpoint_base(endpoint)}:inflight:tokens"

    def snapshot(self, endpoint: str) -> str:
        return f"{self.endpoint_base(endpoint)}:snapshot"

    def snapshot_endpoints(self) -> str:
        return f"{self.prefix}:snapshot_endpoints"

    def snapshot_version(self) -> str:
        return f"{self.prefix}:snapshot_version"

    def health(self) -> str:
        return f"{self.prefix}:health"
