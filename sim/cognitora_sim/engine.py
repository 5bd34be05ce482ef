"""One simulated engine: the scheduler and prefix cache driven by a clock, its events, metrics, power and faults.

Time. Engine time runs ``time_scale`` times faster than wall time. The engine keeps a virtual clock: a step that
the profile says takes ``d`` seconds ends exactly ``d`` after it started, in engine time, and the engine sleeps until
the matching wall instant; if the process falls behind, the next step starts late (as a busy real engine would).
Every timestamp a metric sees is engine time, so histograms and rates do not depend on the time scale.

Cheapness. An idle engine awaits a future (no polling). While only decoding happens and nothing can change (no one
finishes, no one can be admitted, the blocks are free), the engine sleeps once for a run of up to ``chunk`` decode
steps (``--stream-chunk-tokens``; 16 when no request streams). An arrival interrupts the run: the step in progress
completes, the steps not yet started are dropped and the new request joins the next step, exactly when it would
have joined in a step-by-step simulation.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import logging
import random
import time
import uuid
from array import array
from dataclasses import dataclass

import zmq.asyncio

from cognitora_sim.block_hash import BlockHasher
from cognitora_sim.engine_kinds import surface
from cognitora_sim.host_cores import HostCores
from cognitora_sim.kv_cache import PrefixCache
from cognitora_sim.kv_events import KvEventPublisher, topic_for
from cognitora_sim.metrics import EngineMetrics, observe_many
from cognitora_sim.power import EnergyMeter
from cognitora_sim.profiles import HardwareProfile
from cognitora_sim.scheduler import ScheduledStep, Scheduler, SimRequest
from cognitora_sim.tokenizer import SimTokenizer
from cognitora_sim.trtllm_events import TrtllmEventBuffer

log = logging.getLogger(__name__)

NO_STREAM_RUN = 16
MAX_LAG_WALL_S = 0.25


class EngineTime:
    """Engine seconds since start, ``scale`` times faster than the wall clock."""

    def __init__(self, scale: float) -> None:
        if scale <= 0:
            raise ValueError(f"--time-scale must be positive, got {scale}")
        self.scale = scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.scale

    def wall_delay(self, engine_t: float) -> float:
        return (engine_t - self.now()) / self.scale


@dataclass(frozen=True)
class EngineConfig:
    index: int
    port: int
    model: str
    profile: HardwareProfile
    host: str = "127.0.0.1"
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    events_port: int | None = None
    replay_port: int | None = None
    legacy_events: bool = False
    stream_chunk_tokens: int = 1
    seed: int = 0
    default_max_tokens: int = 128
    max_num_seqs: int | None = None
    """Overrides the profile's (vLLM ``--max-num-seqs``)."""
    max_num_batched_tokens: int | None = None
    """Overrides the profile's (vLLM ``--max-num-batched-tokens``)."""
    cpu_offload_tokens: int = 0
    """Tokens the CPU offload tier holds (vLLM's CPU OffloadingConnector); 0: no tier."""
    cpu_offload_gb_per_s: float = 25.0
    """Host-to-GPU bandwidth of a reload from that tier (GB/s, engine time)."""
    engine_kind: str = "vllm"
    """What the engine shows the outside (``cognitora_sim.engine_kinds``): routes, metric names, events."""
    responses_store: bool = False
    """Keep every Responses answer for ``previous_response_id`` (vLLM: ``VLLM_ENABLE_RESPONSES_API_STORE=1``)."""
    scale_out: bool = True
    """Serve the ``/render`` routes, as vLLM 0.32 does only with ``--enable-scale-out``; False answers them 403 as vLLM
    does by default (vllm-router's cache_aware then has no token ids: the real engines' benchmark found it)."""

    @property
    def endpoint_id(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def num_blocks(self) -> int:
        tokens = self.kv_capacity_tokens or self.profile.kv_capacity_tokens
        return max(1, tokens // self.block_size)

    @property
    def topic(self) -> str:
        return topic_for(self.host, self.port, self.model)


class RequestRejected(ValueError):
    """The engine refuses a request up front (too long for the model or the KV cache): HTTP 400."""


class EngineDown(RuntimeError):
    """The engine crashed (fault injection): no new requests."""


class SimEngine:
    def __init__(
        self,
        config: EngineConfig,
        tokenizer: SimTokenizer,
        zmq_ctx: zmq.asyncio.Context,
        clock: EngineTime,
        host: HostCores | None = None,
    ) -> None:
        self.config = config
        self.host = host
        """The cores this engine shares with the fleet's others (``cognitora_sim.host_cores``); None: its own."""
        self._busy_seen = False
        self.profile = config.profile
        self.tokenizer = tokenizer
        self.clock = clock
        self._zmq_ctx = zmq_ctx
        self.cache = PrefixCache(config.num_blocks, config.block_size, config.cpu_offload_tokens // config.block_size)
        self.scheduler = Scheduler(
            self.cache,
            BlockHasher(config.block_size),
            tokenizer.output_vocabulary(),
            max_num_seqs=config.max_num_seqs or self.profile.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens or self.profile.max_num_batched_tokens,
        )
        self.meter = EnergyMeter(self.profile.idle_watts * self.profile.gpus, start=clock.now())
        self.metrics = self._new_metrics()
        self.publisher: KvEventPublisher | None = None
        self.trtllm_events = self._new_trtllm_events()
        """TRT-LLM's pulled ``/kv_cache_events`` buffer (trtllm kind only)."""
        self.slow_factor = 1.0
        self.hung = False
        self.crashed = False
        self._resume = asyncio.Event()
        self._resume.set()
        self._interrupt: asyncio.Future[bool] | None = None
        self._epoch = 0
        self._interrupted_at = 0.0
        # scheduler totals already added to the (monotonic) Prometheus counters
        self._seen_queries = 0
        self._seen_hits = 0
        self._seen_preemptions = 0
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.http_requests: dict[str, int] = {}
        """HTTP requests received, by path (``/sim/`` excluded), for ``/sim/state``."""
        if host is not None:
            host.join(self)

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._start_publisher()
        # engine time starts now, not when the loop first runs the task: a request submitted meanwhile starts at its
        # arrival, and the loop's latency in starting the task (a loaded host) is not engine time
        started = self.clock.now()
        self._task = asyncio.get_running_loop().create_task(self._run(started), name=f"sim-engine-{self.config.index}")

    def _start_publisher(self) -> None:
        c = self.config
        if c.events_port is None or c.replay_port is None or not surface(c.engine_kind).publishes_events:
            return
        self.publisher = KvEventPublisher(
            self._zmq_ctx,
            f"tcp://{c.host}:{c.events_port}",
            f"tcp://{c.host}:{c.replay_port}",
            c.topic,
            legacy=c.legacy_events,
        )
        self.publisher.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for r in self.scheduler.drop_all():
            r.wakeup.set()
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    def _new_metrics(self) -> EngineMetrics:
        m = EngineMetrics(self.config.model, 0)
        m.set_cache_config(
            self.config.block_size,
            self.config.num_blocks,
            {
                "enable_prefix_caching": "True",
                "prefix_caching_hash_algo": "sha256_cbor",
                "cache_dtype": "auto",
                "gpu_memory_utilization": "0.9",
            },
        )
        m.child(m.running).set_function(lambda: len(self.scheduler.running))
        m.child(m.waiting).set_function(lambda: len(self.scheduler.waiting))
        m.child(m.kv_usage).set_function(self.cache.usage)
        m.add_power(
            self.profile.gpus,
            self.profile.accelerator,
            lambda: self.meter.watts(self.clock.now()),
            lambda: self.meter.energy_joules(self.clock.now()),
            lambda: self.meter.utilization(self.clock.now()),
        )
        m.declare_clock(self.clock.scale)
        return m

    # ---- requests -------------------------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], max_tokens: int, stream: bool, rid: str | None = None) -> SimRequest:
        if self.crashed:
            raise EngineDown("engine is down")
        p = self.profile
        if max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt_ids) + max_tokens > p.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {p.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        need_blocks = -(-(len(prompt_ids) + max_tokens) // self.config.block_size)
        if need_blocks > self.cache.num_blocks:
            raise RequestRejected(
                f"request needs {need_blocks} KV blocks (prompt {len(prompt_ids)} + max_tokens {max_tokens} tokens) "
                f"but the engine's KV cache holds {self.cache.num_blocks} blocks: lower max_tokens or raise "
                "--kv-capacity-tokens"
            )
        req = SimRequest(
            rid=rid or uuid.uuid4().hex,
            tokens=list(prompt_ids),
            prompt_len=len(prompt_ids),
            max_tokens=max_tokens,
            arrival=self.clock.now(),
            stream=stream,
            rng=random.Random(self._output_seed(prompt_ids)),
        )
        self.scheduler.add(req)
        self._wake()
        self._note_busy()
        return req

    def _output_seed(self, prompt_ids: list[int]) -> int:
        # Same prompt, same reply (like greedy decoding), so multi-turn conversations reuse decode-filled blocks.
        digest = hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=8, key=str(self.config.seed).encode())
        return int.from_bytes(digest.digest(), "big")

    def abort(self, req: SimRequest) -> None:
        if not req.finished and not req.aborted:
            self.scheduler.abort(req)
            self.publish_kv_events()
            self._wake()
            self._note_busy()

    def _wake(self) -> None:
        self._interrupted_at = self.clock.now()
        fut = self._interrupt
        if fut is not None and not fut.done():
            fut.set_result(True)

    # ---- the host's cores (cognitora_sim.host_cores) --------------------------------------------------------
    @property
    def busy(self) -> bool:
        return not self.crashed and not self.hung and self.scheduler.has_work()

    def host_changed(self) -> None:
        self._wake()

    def _note_busy(self) -> None:
        """Tell the host's other engines when this one turns busy or idle: their shares of the cores change."""
        busy = self.busy
        if busy != self._busy_seen:
            self._busy_seen = busy
            if self.host is not None:
                self.host.changed(self)

    # ---- faults ---------------------------------------------------------------------------------------------
    def set_slow(self, factor: float) -> None:
        if factor <= 0:
            raise ValueError(f"slow factor must be positive, got {factor}")
        self.slow_factor = factor

    def hang(self) -> None:
        self.hung = True
        self._resume.clear()
        self._note_busy()

    async def wait_unhung(self) -> None:
        await self._resume.wait()

    def clear_cache(self) -> None:
        self.cache.reset([r.table for r in self.scheduler.running])
        self.publish_kv_events()

    def restart(self) -> None:
        """A process restart without downtime: requests dropped, cache empty, events restart at sequence 0."""
        self._epoch += 1
        for r in self.scheduler.drop_all():
            r.wakeup.set()
        self.cache.reset([], announce=False)
        self.cache.drain()
        if self.publisher is not None:
            self.publisher.restart()
        self.trtllm_events = self._new_trtllm_events()  # a new process: a new cache, announced as "created"
        self.metrics = self._new_metrics()
        self._wake()

    def crash(self) -> None:
        self.crashed = True
        self.restart()
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    def recover(self) -> None:
        """Undo every fault: a crashed engine comes back as a new process (empty cache, sequence 0)."""
        self.slow_factor = 1.0
        if self.crashed:
            self.crashed = False
            self._start_publisher()
        if self.hung:
            self.hung = False
            self._resume.set()
        self._wake()

    def state(self) -> dict[str, object]:
        s = self.scheduler
        return {
            "engine": self.config.index,
            "endpoint_id": self.config.endpoint_id,
            "profile": self.profile.name,
            "engine_kind": self.config.engine_kind,
            "running": len(s.running),
            "waiting": len(s.waiting),
            "cached_blocks": self.cache.cached_blocks,
            "cpu_cached_blocks": len(self.cache.cpu),
            "used_blocks": self.cache.used_blocks,
            "num_blocks": self.cache.num_blocks,
            "kv_cache_usage": self.cache.usage(),
            "next_event_seq": self.publisher.next_seq if self.publisher else None,
            "engine_time": self.clock.now(),
            "steps": self.steps,
            "http_requests": dict(self.http_requests),
            "counters": self._counters(),
            "preemptions": s.preemptions,
            "faults": {"crashed": self.crashed, "hung": self.hung, "slow_factor": self.slow_factor},
        }

    def _counters(self) -> dict[str, float]:
        """What the benchmark harness reads of every engine whatever its kind shows (bench.run_all)."""
        registry = self.metrics.registry
        labels = {"model_name": self.config.model, "engine": "0"}

        def value(name: str, extra: dict[str, str] | None = None) -> float:
            return registry.get_sample_value(name, {**labels, **(extra or {})}) or 0.0

        return {
            "requests": value("vllm:request_success_total", {"finished_reason": "length"}),
            "prompt_tokens": value("vllm:prefix_cache_queries_total"),
            "cached_tokens": value("vllm:prefix_cache_hits_total"),
            "generation_tokens": value("vllm:generation_tokens_total"),
            "energy_j": self.meter.energy_joules(self.clock.now()),
        }

    # ---- the step loop --------------------------------------------------------------------------------------
    async def _sleep_until(self, engine_t: float, interruptible: bool) -> bool:
        """Sleep until engine time ``engine_t``; True if an arrival interrupted (only when ``interruptible``)."""
        delay = self.clock.wall_delay(engine_t)
        if delay <= 0:
            return False
        if not interruptible:
            await asyncio.sleep(delay)
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._interrupt = fut
        handle = loop.call_later(delay, _resolve, fut, False)
        try:
            return await fut
        finally:
            handle.cancel()
            self._interrupt = None

    async def _wait_for_work(self) -> None:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._interrupt = fut
        try:
            await fut
        finally:
            self._interrupt = None

    async def _run(self, started: float) -> None:
        vt = started
        while True:
            try:
                self._note_busy()
                if self.hung:
                    await self._resume.wait()
                    self._note_busy()
                if self.crashed or not self.scheduler.has_work():
                    await self._wait_for_work()
                    continue
                vt = await self._one_round(self._next_step_start(vt))
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad step must not kill the fleet
                log.exception("engine %d: step failed", self.config.index)
                await asyncio.sleep(0.1)

    def _next_step_start(self, vt: float) -> float:
        """When the next step starts, in engine time.

        Back to back with the previous step (``vt``), or at the arrival that ended an idle spell: the wall-clock
        latency of waking this coroutine is not engine time (at --time-scale 50 a 1 ms wake-up would add 50 ms to
        every TTFT). A process that falls behind (a stall of the shared machine) catches up by running steps
        without sleeping, so engine time stays exactly what the model says; a request admitted meanwhile joins the
        first step that starts after its arrival. Beyond ``MAX_LAG_WALL_S`` of wall time behind (an overloaded
        machine), the engine accepts the slip and starts now.
        """
        now = self.clock.now()
        s = self.scheduler
        start = vt if s.running else max(vt, min((r.arrival for r in s.waiting), default=now))
        if now - start > MAX_LAG_WALL_S * self.clock.scale:
            return now
        return start

    async def _one_round(self, start: float) -> float:
        sched = self.scheduler
        step = sched.schedule(start)
        self.publish_kv_events()  # evictions made room for this step before it ran
        for r in step.admitted:
            if r.first_scheduled is None:
                r.first_scheduled = start
        if not step.work:
            await self._wait_for_work()
            return start
        limit = self.config.stream_chunk_tokens if any(r.stream for r, _ in step.work) else NO_STREAM_RUN
        k = sched.decode_run_length(step, limit)
        share = self.host.factor() if self.host is not None else 1.0
        ends = self._step_ends(step, start, k, share)
        epoch = self._epoch
        done = k
        if k == 1 and self.host is not None:
            ends[0] = await self._shared_step(start, ends[0], share)
        elif k > 1 and await self._sleep_until(ends[-1], interruptible=True):
            # the step running when the interrupting request arrived completes; later ones are replanned
            done = min(bisect.bisect_left(ends, self._interrupted_at), k - 1) + 1
            await self._sleep_until(ends[done - 1], interruptible=False)
        elif k == 1 and self.host is None:
            await self._sleep_until(ends[0], interruptible=False)
        if epoch != self._epoch:  # restarted or crashed while the step ran
            return self.clock.now()
        t = start
        for i in range(done):
            if i > 0:
                sched.extend_decode(step)
            self._commit(step, t, ends[i])
            t = ends[i]
        return t

    async def _shared_step(self, start: float, end: float, share: float) -> float:
        """Sleep through one step on shared cores; its end moves whenever the share does. Returns the end.

        Processor sharing: at each wake-up (an engine of the host turned busy or idle, or a request arrived here),
        the step's remaining work, ``(end - t) / share``, runs from ``t`` at the share of that moment.
        """
        assert self.host is not None
        while await self._sleep_until(end, interruptible=True):
            t = max(self._interrupted_at, start)
            if t >= end:
                break
            now = self.host.factor()
            end = t + (end - t) * now / share
            share = now
        return end

    def _step_ends(self, step: ScheduledStep, start: float, k: int, share: float = 1.0) -> list[float]:
        """When each of a run of ``k`` steps ends; ``share``: the host's slowdown (``cognitora_sim.host_cores``)."""
        p, slow = self.profile, self.slow_factor * share
        b = len(step.work)
        ends: list[float] = []
        t = start
        # loading blocks back from host memory happens before the step computes (the first of a decode run)
        t += step.reload_tokens * p.kv_bytes_per_token / (self.config.cpu_offload_gb_per_s * 1e9)
        for i in range(k):
            ctx = step.decode_context_tokens + i * b
            t += p.step_time(step.batched_tokens, step.prefill_attention_pairs, ctx) * slow
            ends.append(t)
        return ends

    def _commit(self, step: ScheduledStep, start: float, end: float) -> None:
        self.steps += 1
        m = self.metrics
        lab = m.child
        batched = step.batched_tokens
        result = self.scheduler.commit(step, end)
        self.meter.add_step(start, end, self.profile.step_power(batched, (end - start) / self.slow_factor))
        self.publish_kv_events()
        lab(m.iteration_tokens).observe(batched)
        lab(m.generation_tokens).inc(len(result.sampled))
        itl_counts: dict[float, int] = {}
        for req, prev in result.sampled:
            if prev is None:
                m.observe_prompt(req.prompt_len, req.cached_tokens or 0)
                lab(m.ttft).observe(end - req.arrival)
            else:
                itl = end - prev
                itl_counts[itl] = itl_counts.get(itl, 0) + 1
            req.wakeup.set()
        itl_hist = lab(m.itl)
        for itl, count in itl_counts.items():
            observe_many(itl_hist, itl, count)
        for req in result.finished:
            self._observe_finished(req)
        s = self.scheduler
        if s.prefix_queries != self._seen_queries:
            lab(m.prefix_queries).inc(s.prefix_queries - self._seen_queries)
            lab(m.prefix_hits).inc(s.prefix_hits - self._seen_hits)
            self._seen_queries, self._seen_hits = s.prefix_queries, s.prefix_hits
        if s.preemptions != self._seen_preemptions:
            lab(m.preemptions).inc(s.preemptions - self._seen_preemptions)
            self._seen_preemptions = s.preemptions

    def _observe_finished(self, req: SimRequest) -> None:
        m = self.metrics
        lab = m.child
        assert req.finished_at is not None and req.first_token_at is not None
        scheduled = req.first_scheduled if req.first_scheduled is not None else req.arrival
        lab(m.e2e).observe(req.finished_at - req.arrival)
        lab(m.queue_time).observe(scheduled - req.arrival)
        lab(m.prefill_time).observe(req.first_token_at - scheduled)
        lab(m.decode_time).observe(req.finished_at - req.first_token_at)
        lab(m.inference_time).observe(req.finished_at - scheduled)
        if req.output_len > 1:
            tpot = (req.finished_at - req.first_token_at) / (req.output_len - 1)
            lab(m.tpot).observe(tpot)
        lab(m.request_prompt_tokens).observe(req.prompt_len)
        lab(m.request_prefill_kv_computed_tokens).observe(req.prompt_len - (req.cached_tokens or 0))
        lab(m.request_generation_tokens).observe(req.output_len)
        m.success.labels(self.config.model, "0", "length").inc()

    def _new_trtllm_events(self) -> TrtllmEventBuffer | None:
        if not surface(self.config.engine_kind).kv_events_route:
            return None
        c = self.config
        return TrtllmEventBuffer(c.num_blocks, c.cpu_offload_tokens // c.block_size, self.profile.max_model_len)

    def publish_kv_events(self) -> None:
        """Send the KV cache's pending block events (stored, removed) to the ZMQ publisher and the TRT-LLM buffer.
        Called after every change to the cache: the engine's own steps and a disaggregated transfer's commit."""
        events = self.cache.drain()
        if events and self.publisher is not None:
            self.publisher.publish(events)
        if events and self.trtllm_events is not None:
            self.trtllm_events.add(events)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
