"""Every Redis key of flow control's leases and shared fairness counters, under the config's ``key_prefix``.

All in ONE hash slot, tag ``{<prefix>.flow}``: a lease is granted by one script that must see, atomically, the
replicas' heartbeats (a dead replica's leases are released first), the engine's lease set and the flow's counters
(on a Redis Cluster too). The cost is that one node serves all of it: one small script per dispatch from the
queue, and one heartbeat per replica every third of ``replica_ttl_s``. It is not the store's fleet slot
(``kvstate.redis_keys``), so the per-request in-flight traffic and this may land on different nodes.

| key | type | content |
|---|---|---|
| ``L:replicas`` | HASH | replica id -> heartbeat expiry (ms, server clock) |
| ``L:leases:<endpoint>`` | ZSET | ``"<replica> <lease id>"`` scored by the lease's hard expiry (ms) |
| ``L:held:<replica>`` | HASH | lease id -> endpoint: what to release when the replica dies |
| ``L:served:<band>`` | HASH | flow -> cost served through every replica (cumulative, float) |
| ``L:depth`` | HASH | ``"<replica> <band>"`` -> requests waiting in that replica's queue |
| ``L:margin`` | HASH | replica -> ``"<factor> <samples>"``: its prediction margin, as its last heartbeat sent it |

``L`` is ``<prefix>:flow:{<prefix>.flow}``. Replica ids hold no space (the scripts split members at the first).
"""

from __future__ import annotations

__all__ = ["FlowKeys"]


class FlowKeys:
    def __init__(self, prefix: str = "cog") -> None:
        if not prefix or any(c in prefix for c in "{} "):
            raise ValueError(f"key prefix must be non-empty without braces or spaces, got {prefix!r}")
        self.base = f"{prefix}:flow:{{{prefix}.flow}}"

    def replicas(self) -> str:
        return f"{self.base}:replicas"

    def leases(self, endpoint: str) -> str:
        return f"{self.base}:leases:{endpoint}"

    def leases_base(self) -> str:
        """``leases(endpoint)`` is this plus the endpoint (the scripts build it for a dead replica's leases)."""
        return f"{self.base}:leases:"

    def held(self, replica: str) -> str:
        return f"{self.base}:held:{replica}"

    def held_base(self) -> str:
        return f"{self.base}:held:"

    def served(self, band: str) -> str:
        return f"{self.base}:served:{band}"

    def depth(self) -> str:
        return f"{self.base}:depth"

    def margin(self) -> str:
        return f"{self.base}:margin"
