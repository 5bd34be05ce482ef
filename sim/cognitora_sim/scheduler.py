"""Continuous batching with a per-step token budget, like vLLM v1's scheduler.

Every step, running requests go first (a decoding request takes one token, a prefilling one a chunk of what is left),
then waiting requests are admitted in arrival order while there is token budget (``max_num_batched_tokens``), a seat
(``max_num_seqs``) and KV blocks. A new request first reuses its longest cached prefix (whole blocks, never the
whole prompt: at least one token is computed, as vLLM does). When a running request needs a block and none is free,
the most recently admitted running request is preempted: its blocks are freed and it recomputes later (its cached
prefix usually survives, so recomputing is cheap). A step that completes a request's remaining tokens samples one
new token for it.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field

from cognitora_sim.block_hash import BlockHasher, event_hash
from cognitora_sim.kv_cache import BlockTable, PrefixCache


@dataclass
class SimRequest:
    rid: str
    tokens: list[int]
    """Prompt tokens followed by every generated token."""
    prompt_len: int
    max_tokens: int
    arrival: float
    """Engine time."""
    stream: bool = False
    rng: random.Random = field(default_factory=random.Random)
    table: BlockTable = field(default_factory=BlockTable)
    digests: list[bytes] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    num_computed: int = 0
    committed_blocks: int = 0
    """Blocks already handed to the cache as full."""
    cached_tokens: int | None = None
    """Prefix-cache hit at first scheduling (what usage.prompt_tokens_details.cached_tokens reports)."""
    first_scheduled: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    output_text: list[str] = field(default_factory=list)
    preemptions: int = 0
    aborted: bool = False
    planned: list[tuple[int, str]] = field(default_factory=list)
    """The reply, drawn from the vocabulary when the first token is sampled."""
    """Cut off (client gone, engine crashed or restarted): the engine forgets it, its client gets no answer."""
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever new tokens were sampled or the request ended, so its HTTP handler writes them out."""

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def remaining_outputs(self) -> int:
        return self.max_tokens - self.output_len

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass
class ScheduledStep:
    work: list[tuple[SimRequest, int]]
    """(request, tokens computed for it this step)."""
    prefill_tokens: int = 0
    prefill_attention_pairs: int = 0
    decode_context_tokens: int = 0
    reload_tokens: int = 0
    """Prompt tokens loaded back from the CPU offload tier for requests admitted in this step."""
    admitted: list[SimRequest] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)

    @property
    def batched_tokens(self) -> int:
        return sum(n for _, n in self.work)

    @property
    def decode_only(self) -> bool:
        return self.prefill_tokens == 0


@dataclass
class StepResult:
    sampled: list[tuple[SimRequest, float | None]]
    """Requests that got a token this step, with the time of their previous token (None for the first)."""
    finished: list[SimRequest]


def _pairs(n: int) -> int:
    return n * (n + 1) // 2


class Scheduler:
    def __init__(
        self,
        cache: PrefixCache,
        hasher: BlockHasher,
        vocabulary: list[tuple[int, str]],
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.cache = cache
        self.hasher = hasher
        self.bs = cache.block_size
        self.vocabulary = vocabulary
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0

    # ---- requests -------------------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self._hash_full_blocks(req)
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        req.aborted = True
        if req in self.running:
            self.running.remove(req)
            self.cache.free(req.table)
        elif req in self.waiting:
            self.waiting.remove(req)

    def drop_all(self) -> list[SimRequest]:
        """Forget every request (a crash or restart); returns them so their clients can be cut off."""
        dropped = list(self.running) + list(self.waiting)
        for r in self.running:
            self.cache.free(r.table)
        for r in dropped:
            r.aborted = True
        self.running.clear()
        self.waiting.clear()
        return dropped

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _hash_full_blocks(self, req: SimRequest) -> None:
        before = len(req.digests)
        self.hasher.extend(req.digests, req.tokens)
        req.hashes.extend(event_hash(d) for d in req.digests[before:])

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    # ---- one step -------------------------------------------------------------------------------------------
    def schedule(self, now: float = float("inf")) -> ScheduledStep:
        """The next step, starting at engine time ``now``: requests that arrive later wait for a later step."""
        step = ScheduledStep(work=[])
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(len(req.tokens) - req.num_computed, budget)
            need = self._blocks_for(req.num_computed + n) - len(req.table)
            while need > self.cache.free_blocks and self.running[-1] is not req:
                self._preempt(self.running[-1], step)
            if need > self.cache.free_blocks:
                self._preempt(req, step)
                break
            self.cache.allocate(req.table, need)
            self._add_work(step, req, n)
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not step.preempted:
            req = self.waiting[0]
            if req.arrival > now:
                break
            max_hit = (len(req.tokens) - 1) // self.bs
            hit = self.cache.longest_prefix(req.hashes[:max_hit])
            # blocks host memory holds after the GPU hit load back into new GPU blocks instead of being computed
            reload = self.cache.cpu_prefix(req.hashes[hit:max_hit]) if self.cache.cpu_blocks else 0
            start = (hit + reload) * self.bs
            n = min(len(req.tokens) - start, budget)
            need = self._blocks_for(start + n) - hit
            hit_evictable = sum(1 for h in req.hashes[:hit] if self.cache.refs[h] == 0)
            if need > self.cache.free_blocks - hit_evictable:
                break
            self.waiting.popleft()
            self.cache.touch(req.table, req.hashes[:hit])
            req.num_computed = start
            req.committed_blocks = hit  # the reloaded blocks are cached again when this step commits
            if req.cached_tokens is None:
                req.cached_tokens = start
            self.prefix_queries += len(req.tokens)
            self.prefix_hits += start
            step.reload_tokens += reload * self.bs
            self.cache.allocate(req.table, need)
            self.running.append(req)
            step.admitted.append(req)
            self._add_work(step, req, n)
            budget -= n
        return step

    def _add_work(self, step: ScheduledStep, req: SimRequest, n: int) -> None:
        step.work.append((req, n))
        if req.num_computed + n == len(req.tokens) and n == 1 and req.output_len > 0:
            step.decode_context_tokens += req.num_computed + 1
        else:
            step.prefill_tokens += n
            step.prefill_attention_pairs += _pairs(req.num_computed + n) - _pairs(req.num_computed)

    def _preempt(self, req: SimRequest, step: ScheduledStep) -> None:
        self.running.remove(req)
        self.cache.free(req.table)
        req.num_computed = 0
        req.committed_blocks = 0
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)
        step.work = [(r, n) for r, n in step.work if r is not req]
        step.preempted.append(req)

    def decode_run_length(self, step: ScheduledStep, limit: int) -> int:
        """How many identical decode steps can follow from ``step`` with nothing else changing (>= 1).

        Used to sleep once for several steps when only decoding happens, nobody finishes, nobody can be admitted
        and the KV blocks those steps need are free. An arrival interrupts the run (see engine.py).
        """
        if limit <= 1 or not step.decode_only or not step.work or step.preempted:
            return 1
        if self.waiting and len(self.running) < self.max_num_seqs:
            return 1
        k = min(limit, min(req.remaining_outputs for req, _ in step.work))
        if k <= 1:
            return 1
        need = sum(
            self._blocks_for(req.num_computed + k) - self._blocks_for(req.num_computed + 1) for req, _ in step.work
        )
        return k if need <= self.cache.free_blocks else 1

    def extend_decode(self, step: ScheduledStep) -> None:
        """Allocate for one more decode step of the same batch (guaranteed to fit by decode_run_length)."""
        step.decode_context_tokens = 0
        for req, _ in step.work:
            if req.aborted or req.finished:
                continue
            need = self._blocks_for(req.num_computed + 1) - len(req.table)
            self.cache.allocate(req.table, need)
            step.decode_context_tokens += req.num_computed + 1

    def commit(self, step: ScheduledStep, now: float) -> StepResult:
        """The step finished at engine time ``now``: advance computed tokens, cache full blocks, sample tokens."""
        result = StepResult(sampled=[], finished=[])
        bs = self.bs
        for req, n in step.work:
            if req.finished or req.aborted:
                continue
            req.num_computed += n
            full = req.num_computed // bs
            if full > req.committed_blocks:
                self._hash_full_blocks(req)
                first = req.committed_blocks
                parent = req.hashes[first - 1] if first > 0 else None
                self.cache.commit_full(
                    req.table, first, req.hashes[first:full], req.tokens[first * bs : full * bs], parent
                )
                req.committed_blocks = full
            if req.num_computed == len(req.tokens):
                if not req.planned:
                    # the whole reply at once: one RNG call per request rather than per token
                    vocab = self.vocabulary
                    req.planned = req.rng.choices(vocab, k=req.max_tokens)
                token_id, text = req.planned[req.output_len]
                req.tokens.append(token_id)
                req.output_text.append(text)
                if req.first_token_at is None:
                    req.first_token_at = now
                result.sampled.append((req, req.last_token_at))
                req.last_token_at = now
                if req.remaining_outputs <= 0:
                    req.finished_at = now
                    self.running.remove(req)
                    self.cache.free(req.table)
                    result.finished.append(req)
        return result
