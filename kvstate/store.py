"""The ``Store`` protocol: the one interface to the fleet's shared state.

Two backends implement it and pass ONE contract suite (``tests/kvstate/test_store_contract.py``):
``kvstate.memory_store.MemoryStore`` (single gateway process) and ``kvstate.redis_store.RedisStore`` (shared by
gateway replicas and the collector). Everything is async: gateways and the collector are asyncio programs.

Identifiers:
- ``model``: the model (or LoRA) name whose key space a block belongs to; Redis keys are hash-tagged by it.
- ``endpoint``: an endpoint id, ``host:port`` of the engine (what Envoy's ORIGINAL_DST cluster is handed).
- block keys: ``kvstate.keys.BlockKey`` (our own 64-bit keys, never engine hashes).

``Tier`` and the tier weights are defined in ``kvstate.tiers`` (a leaf both backends share) and exported here too,
beside the types that carry them. Opening a store (which backend) is ``kvstate.open.open_store``: this module sits
below both backends, so it cannot name them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvstate.keys import BlockKey
from kvstate.tiers import DEFAULT_TIER_WEIGHTS, SPECULATIVE_WEIGHT, Tier

__all__ = [
    "DEFAULT_TIER_WEIGHTS",
    "SPECULATIVE_WEIGHT",
    "EndpointSnapshot",
    "FleetView",
    "HealthMark",
    "Heartbeat",
    "InFlight",
    "MatchCheckpoint",
    "PrefixMatch",
    "Store",
    "StoreRefused",
    "StoreUnavailable",
    "Tier",
]


class StoreUnavailable(RuntimeError):
    """The backend cannot be reached (Redis down). Callers degrade; they do not crash."""


class StoreRefused(StoreUnavailable):
    """The backend answered but will not serve us as configured: it refused the credentials (a wrong Redis password
    or user), or it is not the kind of server the URL says (a Cluster client against a plain Redis). Unavailable all
    the same while serving; at a process's start a configuration error (``cognitora.preflight.check_store``)."""


@dataclass(frozen=True)
class PrefixMatch:
    """How much of a prompt's key chain one endpoint holds.

    ``blocks``: length of the longest consecutive prefix held in any tier (or speculatively).
    ``weighted_blocks``: the same prefix, each block weighted by its best tier (``DEFAULT_TIER_WEIGHTS`` unless the
    store was given others); ``weighted_blocks * tokens_per_block`` is the prefill the endpoint saves.
    ``cpu_blocks``/``disk_blocks``: how many of those blocks are held off the GPU only, by best tier, so placement
    can price their reload in seconds (``cognitora.placement.tier_reload``).
    """

    blocks: int
    weighted_blocks: float
    # Not part of equality: a match is "how much is held"; where it is held only changes what reusing it costs.
    cpu_blocks: int = field(default=0, compare=False)
    """Blocks of the prefix held confirmed in CPU memory and not on the GPU (a reload from host memory)."""
    disk_blocks: int = field(default=0, compare=False)
    """Blocks of the prefix held confirmed only on disk or external storage (the slowest reload)."""


@dataclass(frozen=True)
class InFlight:
    """Work the routers have sent to an endpoint and not yet seen finish."""

    requests: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0


@dataclass(frozen=True)
class EndpointSnapshot:
    """The latest scraped view of one endpoint (written by the scraper, read by placement).

    Every field is named and typed here, once: the scraper fills them, both stores keep them, placement reads them.
    A ``None`` is "not known": the engine does not expose that counter, or the scraper has not learned it yet.
    """

    endpoint: str
    healthy: bool = True
    """The scraper's verdict (``kvstate.scrape``). A gateway's own verdict is a ``HealthMark``, kept apart."""
    last_seen: float = 0.0
    """Unix time of the last successful scrape."""
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    """0..1 share of the KV cache in use."""
    prefill_tokens_per_s: float = 0.0
    """Learned prefill throughput; 0 = not learned yet (placement then uses the configured default)."""
    prefill_rate_from_short_prompts: bool = False
    """``prefill_tokens_per_s`` was learned from short prompts only, so it is mostly the fixed cost of a step and
    understates what the engine does on a long prompt (``kvstate.rates.RateEstimator``)."""
    prefill_rate_prompt_tokens: float = 0.0
    """The context per request (prompt plus cached tokens) ``prefill_tokens_per_s`` was learned at: the rate
    includes the attention of prompts that long, which placement divides back out
    (``cognitora.placement.long_context.attention_free_rate``). 0 = not known: the rate is taken as free of it."""
    short_prompt_prefill_s: float = 0.0
    """Smoothed prefill seconds per request of short (or mostly cached) prompts: the least a request's own prefill
    takes there, whatever the rate; 0 = not learned yet."""
    decode_tokens_per_s: float = 0.0
    power_watts: float = 0.0
    energy_joules: float = 0.0
    """Cumulative energy counter, as the engine's power meter reports it."""
    block_size: int = 0
    kv_capacity_tokens: int = 0
    """Tokens the engine's KV cache holds (its cache config's blocks x block size); 0 = not reported."""
    consecutive_failures: int = 0
    """Health rounds failed in a row (0 after a good one)."""
    mean_service_s: float | None = None
    """The learned mean time (s) a request holds a batch slot (``RateEstimator``). Placement's slot-wait term
    divides it into the running count for a departure rate."""
    clock_rate: float | None = None
    """Engine seconds per gateway second, learned from the engine's own latencies (``RateEstimator.clock_rate``):
    1 on a real engine; the time scale of a time-scaled simulator. None: not learned."""
    clock_declared: bool = False
    """``clock_rate`` is what the engine declares (the simulator's time scale: ``kvstate.engines.declared_clock``),
    exact, not an estimate."""
    seats: int = 0
    """Requests the engine runs at once (its batch slots), when it says: llama.cpp's ``/slots`` count (``-np``).
    vLLM and SGLang export no such gauge; their ``--max-num-seqs`` is configured (``cost.max_num_seqs``). 0 = not
    known."""
    joules_per_token: float | None = None
    """The learned marginal energy per token (J, prompt and generated alike) from the endpoint's own power meter
    (``kvstate.energy``): learned once, by the scraper, for every gateway replica."""
    prompt_tokens_total: float | None = None
    """The engine's cumulative counters, when it exposes them."""
    generation_tokens_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_queries_total: float | None = None
    requests_finished_total: float | None = None
    """Finished requests, every finish reason (vLLM ``vllm:request_success``)."""
    cached_blocks: int | None = None
    """Blocks the store's index holds for the endpoint, every model and tier, confirmed by its KV events
    (``Store.cached_blocks``), counted by the scraper when it wrote this snapshot: how full its prefix cache is, for
    the tie-break's load bound (``cognitora.placement.affinity``). None: not counted."""

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency (s, engine clock): the inverse of the learned, smoothed decode speed, so how long
        a decode step takes lately, prefill chunks sharing it included. None until the speed is learned."""
        return 1.0 / self.decode_tokens_per_s if self.decode_tokens_per_s > 0 else None


@dataclass(frozen=True)
class HealthMark:
    """A gateway saw the endpoint fail (connection refused, reset): placement skips it until a healthy snapshot
    newer than ``since`` arrives, or the mark's time to live passes.

    Its own record, apart from the scraper's snapshot: a mark never makes an old snapshot look fresh."""

    since: float
    """Unix time the failure was seen (in the store: by the store's clock, the Redis server's on Redis)."""
    reason: str


@dataclass(frozen=True)
class Heartbeat:
    """A process that feeds the store (the collector) said it was alive: ``Store.put_heartbeat``.

    Both times are the store's clock (the Redis server's on Redis), so a reader's own clock skew never makes the
    fleet's state look fresher or older than it is."""

    at: float
    """Unix time of the beat."""
    age_s: float
    """Seconds from the beat to the read that returned it."""


@dataclass(frozen=True)
class MatchCheckpoint:
    """Where a prefix match stood after a chain's first ``blocks`` keys, kept to resume a later match of a chain that
    begins with the same keys (``Store.fleet_view``): requests that share a long system prompt then walk only what
    follows it.

    ``ended``: the endpoints whose match ends before ``blocks`` (final). ``held``: those holding all ``blocks``, as
    matched so far. ``proof``: what a store re-reads to tell that the checkpoint still stands (on Redis: the block
    strings where a holder's change would show: the first block, the checkpoint's, and each shorter holder's last
    block and the one after it). A change that none of them shows (a block lost mid-prefix, a tier change inside
    it) is not seen while the caller keeps the checkpoint: the caller bounds that by how long it keeps one. None is
    taken over an expired speculative entry (renewing it would change no block string).
    """

    blocks: int
    ended: dict[str, PrefixMatch]
    held: dict[str, PrefixMatch]
    proof: tuple[tuple[int, bytes], ...]
    until_ms: int = 0
    """When a speculative entry it counts expires (the store's clock, ms): it no longer stands from then. 0: none."""


@dataclass(frozen=True)
class FleetView:
    """What one placement reads about a model's endpoints: ``Store.fleet_view``."""

    matches: dict[str, PrefixMatch]
    """As ``match_prefix``: endpoints holding nothing of the prefix are absent."""
    inflight: dict[str, InFlight]
    """As ``inflight``: every endpoint asked for is present."""
    snapshots: dict[str, EndpointSnapshot]
    """As ``snapshots``: endpoints without a snapshot are absent."""
    health_marks: dict[str, HealthMark] = field(default_factory=dict)
    """As ``health_marks``: endpoints without a live mark are absent."""
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    """As ``heartbeats()``: every live beat, by writer name (how old the state the view holds may be)."""
    # Not part of equality: how the matches were read, not what the fleet holds.
    checkpoint: MatchCheckpoint | None = field(default=None, compare=False)
    """The match after ``fleet_view(checkpoint=n)``'s first ``n`` keys, when the store takes checkpoints."""
    resumed: bool = field(default=False, compare=False)
    """The matches continued from ``fleet_view(resume=...)``'s checkpoint, which still stood."""


@runtime_checkable
class Store(Protocol):
    """The fleet's shared state. Every method may raise ``StoreUnavailable``."""

    # -- KV block index -------------------------------------------------------------------------------------
    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        """Record that ``endpoint`` holds ``keys`` in ``tier`` (a BlockStored event, after key translation)."""
        ...

    async def remove_blocks(
        self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier | None = None
    ) -> None:
        """Forget ``keys`` on ``endpoint`` in ``tier`` (all tiers when None): a BlockRemoved event."""
        ...

    async def clear_endpoint(self, endpoint: str, model: str | None = None) -> None:
        """Forget everything ``endpoint`` holds (for ``model`` only, or every model): restart, cleared cache, gap."""
        ...

    async def cached_blocks(self, endpoint: str) -> int:
        """How many blocks the index holds for ``endpoint``: confirmed ones (KV events), every model and tier, no
        speculative entries. O(models) on either backend (the per-endpoint key sets purges walk already exist); the
        scraper reads it once per round, so placement never pays for it per request."""
        ...

    async def match_prefix(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Longest consecutive held prefix of ``keys`` per endpoint, tier-weighted, speculative entries included.

        One round trip on Redis however long ``keys`` is. Endpoints holding nothing of the prefix are absent.
        ``endpoints`` restricts the answer (None: all endpoints that hold the first key).
        """
        ...

    async def add_speculative(self, model: str, endpoint: str, keys: Sequence[BlockKey], ttl_s: float) -> None:
        """Blocks we just routed to ``endpoint``: counted by ``match_prefix`` until confirmed or ``ttl_s`` passes."""
        ...

    # -- in-flight work, counted by the routers themselves -------------------------------------------------
    async def inflight_add(
        self, endpoint: str, request_id: str, prefill_tokens: int, decode_tokens: int, ttl_s: float
    ) -> None:
        """Count a dispatched request. It expires after ``ttl_s`` unless released, so a dead gateway heals."""
        ...

    async def inflight_prefill_done(self, endpoint: str, request_id: str) -> None:
        """The request's first token came back: its prefill no longer queues ahead of others."""
        ...

    async def inflight_release(self, endpoint: str, request_id: str) -> None:
        """The request finished (success, failure or stream end). Idempotent."""
        ...

    async def inflight(self, endpoints: Sequence[str]) -> dict[str, InFlight]:
        """Current in-flight totals per endpoint (every endpoint asked for is present)."""
        ...

    # -- endpoint snapshots ---------------------------------------------------------------------------------
    async def put_snapshot(self, snapshot: EndpointSnapshot) -> None: ...

    async def snapshots(self, endpoints: Sequence[str] | None = None) -> dict[str, EndpointSnapshot]:
        """Latest snapshots (None: all known endpoints)."""
        ...

    # -- gateway health marks ---------------------------------------------------------------------------------
    async def mark_unhealthy(self, endpoint: str, reason: str, ttl_s: float) -> None:
        """A gateway saw ``endpoint`` fail: every reader sees the mark (``since`` now, by the store's clock) until
        ``ttl_s`` passes. A new mark replaces the endpoint's previous one. Snapshots are left untouched."""
        ...

    async def health_marks(self, endpoints: Sequence[str] | None = None) -> dict[str, HealthMark]:
        """Live marks (None: of every endpoint); endpoints without one are absent. Whether a healthy snapshot newer
        than a mark has healed it is placement's rule (``cognitora.placement.filters``), not the store's."""
        ...

    # -- heartbeats of the processes that feed the store ----------------------------------------------------------
    async def put_heartbeat(self, name: str, ttl_s: float) -> None:
        """``name`` (a collector) is alive now, by the store's clock. The beat replaces ``name``'s previous one and is
        kept ``ttl_s``: long (the collector's is a day), so a writer that died leaves a beat that ages where every
        reader sees it, rather than one that vanishes."""
        ...

    async def heartbeats(self) -> dict[str, Heartbeat]:
        """Every live beat, by name, with its age now (the store's clock)."""
        ...

    # -- everything placement reads ---------------------------------------------------------------------------
    async def fleet_view(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str],
        *,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> FleetView:
        """``match_prefix(model, keys, endpoints)``, ``inflight(endpoints)``, ``snapshots(endpoints)``,
        ``health_marks(endpoints)`` and ``heartbeats()`` together (no endpoints: nothing is read, all empty).

        The router's read for every decision: one round trip on Redis, where the five calls cost five. Empty
        ``keys`` give no matches.

        ``checkpoint`` (0 < n <= len(keys)): also return the match after the first ``n`` keys (``FleetView.checkpoint``)
        where the store can resume from one; others return None. ``resume``: a checkpoint taken on a chain whose
        first ``resume.blocks`` keys are ``keys``'s; if its proof still reads the same the match walks on from it,
        else (or where the store does not resume) the whole chain is matched, with a new checkpoint at the same
        place. Matches are the same either way while the fleet's holdings have not changed. A store that takes
        checkpoints says so with a class attribute ``takes_match_checkpoints = True`` (``RedisStore``).
        """
        ...

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def ping(self) -> bool:
        """True when the backend answers."""
        ...

    async def close(self) -> None: ...
