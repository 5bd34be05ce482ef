"""The KV-block index on Redis: which blocks of a model each endpoint holds, in the model's hash slot.

One half of ``RedisStore`` (``kvstate.redis_store``; the other is ``kvstate.redis_fleet``). Keys: the model slot of
``kvstate.redis_keys``; the Lua: ``kvstate.redis_scripts``. Every write is one script whose keys share the model's
slot, so it is atomic and runs on one Cluster node.

- ``match_prefix`` is one read-only script call however long the prompt: it reads the block strings along the key
  chain (one byte per endpoint) and stops at the first block no remaining endpoint holds.
- Memory is bounded: at most ``max_blocks_per_endpoint`` blocks per (model, endpoint), the least recently stored or
  routed to trimmed first (``match_prefix`` itself never writes). Speculative entries expire by a server-clock
  timestamp and are swept on the endpoint's next speculative write or purge.
- ``clear_endpoint`` walks that endpoint's own key sets in chunks, never the keyspace.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstate import redis_scripts as scripts
from kvstate.keys import BlockKey
from kvstate.redis_client import Call, Script, ScriptRunner, text
from kvstate.redis_keys import RedisKeys
from kvstate.store import MatchCheckpoint, PrefixMatch
from kvstate.tiers import SPECULATIVE_WEIGHT, Tier, mask_weights

__all__ = ["CHUNK", "MATCH_FIELDS", "BlockIndex", "MatchRead", "hex_chain"]

CHUNK = 2000
"""Blocks per script call in bulk writes and purges, so no single script blocks Redis for long."""

MATCH_FIELDS = 5
"""Values per endpoint in ``redis_scripts.MATCH``'s reply: name, blocks, weighted blocks, CPU-only, disk-only."""


def hex_chain(keys: Sequence[BlockKey]) -> str:
    """The chain as one string of 16-hex-digit keys (the scripts slice it)."""
    try:
        return struct.pack(f">{len(keys)}Q", *keys).hex()
    except struct.error as exc:
        bad = next((k for k in keys if not isinstance(k, int) or not 0 <= k < 2**64), None)
        raise ValueError(
            f"block keys must be unsigned 64-bit integers (kvstate.keys), got {bad!r}; compute them with "
            "kvstate.keys / PromptKeyer rather than passing engine hashes"
        ) from exc


def _matches(flat: Sequence[Any]) -> dict[str, PrefixMatch]:
    """``redis_scripts.MATCH``'s flat reply: name, blocks, weighted blocks, CPU-only, disk-only per endpoint."""
    return {
        text(flat[i]): PrefixMatch(int(flat[i + 1]), float(text(flat[i + 2])), int(flat[i + 3]), int(flat[i + 4]))
        for i in range(0, len(flat), MATCH_FIELDS)
    }


def _checkpoint(blocks: int, matches: dict[str, PrefixMatch], raw: Sequence[Any]) -> MatchCheckpoint:
    """The checkpoint ``redis_scripts.MATCH`` took after ``blocks`` keys: [proof, held, until] (flat lists, ms)."""
    proof_flat, held_flat, until_ms = raw
    held = {
        text(held_flat[i]): PrefixMatch(
            blocks, float(text(held_flat[i + 1])), int(held_flat[i + 2]), int(held_flat[i + 3])
        )
        for i in range(0, len(held_flat), 4)
    }
    ended = {e: m for e, m in matches.items() if m.blocks < blocks}
    proof = tuple((int(proof_flat[i]), bytes(proof_flat[i + 1])) for i in range(0, len(proof_flat), 2))
    return MatchCheckpoint(blocks, ended, held, proof, int(until_ms))


class MatchRead(NamedTuple):
    """What ``BlockIndex.read_match`` read of a match reply."""

    matches: dict[str, PrefixMatch]
    checkpoint: MatchCheckpoint | None
    """The checkpoint the script took (None: none asked for, or none taken)."""
    resumed: bool
    """The script resumed the checkpoint it was given (the matches include the endpoints it had already ended)."""


class BlockIndex:
    """The block index of every model, on the ``ScriptRunner`` of a ``RedisStore``."""

    def __init__(
        self, runner: ScriptRunner, keys: RedisKeys, tier_weights: dict[Tier, float] | None, max_blocks: int
    ) -> None:
        self._runner = runner
        self._keys = keys
        self._cap = max_blocks
        self._known_models: set[str] = set()
        self._match_weights = [repr(w) for w in mask_weights(tier_weights)[1:]] + [repr(SPECULATIVE_WEIGHT)]
        self._match = Script(scripts.MATCH)
        self._add = Script(scripts.ADD)
        self._add_speculative = Script(scripts.ADD_SPECULATIVE)
        self._remove = Script(scripts.REMOVE)
        self._clear_chunk = Script(scripts.CLEAR_CHUNK)

    def _index_keys(self, model: str, endpoint: str) -> list[str]:
        """KEYS of the block-index write scripts (all in the model's slot)."""
        k = self._keys
        return [
            k.endpoint_blocks(model, endpoint),
            k.endpoint_speculative(model, endpoint),
            k.endpoint_ids(model),
            k.endpoint_names(model),
            k.free_ids(model),
        ]

    def _registry(self, model: str) -> list[tuple[str, ...]]:
        """Record that ``model`` exists (once per process): ``clear_endpoint`` without a model walks every model.

        The set only grows (but for ``RedisStore.delete_everything``), so remembering what this process added is
        safe, and keeps the hot write path at one command.
        """
        if model in self._known_models:
            return []
        return [("SADD", self._keys.models(), model)]

    def forget_models(self) -> None:
        """The models' registry was deleted (``RedisStore.delete_everything``): the next write of each records it."""
        self._known_models.clear()

    async def _write(self, calls: Sequence[Call], model: str) -> None:
        then = self._registry(model)
        if len(calls) == 1 and not then:
            script, keys, args = calls[0]
            await self._runner.run(script, keys, args)  # no pipeline object: the common case of one event batch
        else:
            await self._runner.run_many(calls, then)
            self._known_models.add(model)

    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        if not keys:
            return
        zkeys = self._index_keys(model, endpoint)
        base = self._keys.block_base(model)
        calls: list[Call] = [
            (self._add, zkeys, [base, endpoint, int(tier), self._cap, hex_chain(keys[i : i + CHUNK])])
            for i in range(0, len(keys), CHUNK)
        ]
        with self._runner.unavailable("add_blocks"):
            await self._write(calls, model)

    async def remove_blocks(
        self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier | None = None
    ) -> None:
        if not keys:
            return
        zkeys = self._index_keys(model, endpoint)[:3]
        base = self._keys.block_base(model)
        which = -1 if tier is None else int(tier)
        calls: list[Call] = [
            (self._remove, zkeys, [base, endpoint, which, hex_chain(keys[i : i + CHUNK])])
            for i in range(0, len(keys), CHUNK)
        ]
        with self._runner.unavailable("remove_blocks"):
            await self._runner.run_many(calls)

    async def clear_endpoint(self, endpoint: str, model: str | None = None) -> None:
        k = self._keys
        with self._runner.unavailable("clear_endpoint"):
            if model is not None:
                models = [model]
            else:
                models = [text(m) for m in await (await self._runner.ready()).smembers(k.models())]
            for m in models:
                # a model the endpoint holds nothing of costs one call that finds no id for it
                zkeys = self._index_keys(m, endpoint)
                while await self._runner.run(self._clear_chunk, zkeys, [k.block_base(m), endpoint, CHUNK]):
                    pass

    async def cached_blocks(self, endpoint: str) -> int:
        """The sizes of the endpoint's block key sets (ZCARD, one per model: each in its model's slot, so one
        pipeline that a Cluster client splits per node), after one read of the models' registry."""
        k = self._keys
        with self._runner.unavailable("cached_blocks"):
            models = [text(m) for m in await (await self._runner.ready()).smembers(k.models())]
            if not models:
                return 0
            async with self._runner.pipeline() as pipe:
                for m in models:
                    pipe.zcard(k.endpoint_blocks(m, endpoint))
                counts = await pipe.execute()
        return sum(int(c) for c in counts)

    async def add_speculative(self, model: str, endpoint: str, keys: Sequence[BlockKey], ttl_s: float) -> None:
        if not keys:
            return
        ttl_ms = max(1, round(ttl_s * 1000))
        blocks_zset, spec_zset, *registry = self._index_keys(model, endpoint)
        zkeys = [spec_zset, blocks_zset, *registry]
        base = self._keys.block_base(model)
        calls: list[Call] = [
            (self._add_speculative, zkeys, [base, endpoint, ttl_ms, self._cap, hex_chain(keys[i : i + CHUNK])])
            for i in range(0, len(keys), CHUNK)
        ]
        with self._runner.unavailable("add_speculative"):
            await self._write(calls, model)

    # -- the prefix match -----------------------------------------------------------------------------------
    async def match_prefix(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str] | None = None
    ) -> dict[str, PrefixMatch]:
        if not keys or (endpoints is not None and not endpoints):
            return {}
        zkeys, args = self.match_script_call(model, keys, endpoints)
        with self._runner.unavailable("match_prefix"):
            flat = await self._runner.run(self._match, zkeys, args)
        return _matches(flat)

    def match_call(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str] | None = None,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> Call:
        """The match as one script call, for a pipeline beside other calls (``RedisStore.fleet_view``)."""
        zkeys, args = self.match_script_call(model, keys, endpoints, checkpoint, resume)
        return (self._match, zkeys, args)

    def match_script_call(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str] | None = None,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> tuple[list[str], list[str | bytes]]:
        """KEYS and ARGV of ``redis_scripts.MATCH`` for this lookup: what ``match_prefix`` sends. Public so that a
        diagnostic can run the script on its own (``bench.store_bench`` times it inside redis-server)."""
        k = self._keys
        zkeys = [k.block(model, keys[0]), k.endpoint_ids(model), k.endpoint_names(model)]
        args: list[str | bytes] = [
            k.block_base(model),
            hex_chain(keys),
            k.endpoint_speculative(model, ""),
            *self._match_weights,
        ]
        if resume is not None:
            proof = [str(v) if isinstance(v, int) else v for pair in resume.proof for v in pair]
            held = [
                str(v)
                for e, m in resume.held.items()
                for v in (e, repr(m.weighted_blocks), m.cpu_blocks, m.disk_blocks)
            ]
            args += [str(resume.blocks), repr(resume.until_ms), str(len(proof)), str(len(held)), *proof, *held]
        else:
            args += [str(checkpoint), "0", "0", "0"]
        if endpoints is not None:
            args.extend(dict.fromkeys(endpoints))  # a repeated endpoint must not be counted twice
        return zkeys, args

    @staticmethod
    def read_match(reply: Sequence[Any], at: int, resume: MatchCheckpoint | None) -> MatchRead:
        """A ``match_call`` reply: with a checkpoint asked for at ``at`` blocks, [matches, checkpoint, resumed]."""
        taken: MatchCheckpoint | None = None
        resumed = False
        if at and reply:
            flat, raw_checkpoint, resumed_flag = reply
            matches = _matches(flat)
            resumed = bool(resumed_flag)
            if resumed and resume is not None:
                matches = {**resume.ended, **matches}
            elif raw_checkpoint:
                taken = _checkpoint(at, matches, raw_checkpoint)
        else:
            matches = _matches(reply)
        return MatchRead(matches, taken, resumed)
