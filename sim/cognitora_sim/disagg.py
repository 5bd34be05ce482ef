"""The simulated engine's half of prefill/decode disaggregation: roles, the pair protocols, a modeled KV link.

An engine has a role (``--roles``, cycled over the fleet like ``--profile``): ``both`` (the default: nothing
changes), ``prefill`` or ``decode``. Which side of a pair a request is on comes from its body, as on the real
engines (docs/disaggregation.md has the field tables):

- vLLM NixlConnector: ``kv_transfer_params.do_remote_decode`` is the prefill side; ``do_remote_prefill`` with
  ``remote_host``, ``remote_port``, ``remote_request_id`` the decode side;
- SGLang: ``bootstrap_room`` on a ``prefill`` engine is the prefill side; on a ``decode`` engine, the decode side,
  which pulls from ``bootstrap_host:bootstrap_port``;
- TRT-LLM: ``disaggregated_params.request_type`` ``context_only`` (prefill) or ``generation_only`` (decode, which
  pulls from ``opaque_state``: the sim puts its ``host:port`` there, a real server an opaque blob).

The prefill side computes the prompt (one output token), keeps its KV *parked* for ``--kv-park-s`` engine
seconds, and answers with what the decode side needs. The decode side pulls the parked KV over HTTP
(``POST /kv/pull`` on the prefill engine: the sim's stand-in for NIXL's side channel and SGLang's bootstrap
server), waits the modeled transfer time, stores the blocks it lacked in its own prefix cache (they appear in its
KV events as ``BlockStored``), then decodes: its prompt is a prefix hit but for the last partial block.

Transfer time, in engine seconds: ``link_latency_s + tokens_moved x kv_bytes_per_token x 8 / (link_gbps x 1e9)``,
where ``tokens_moved`` are the prompt's full blocks the decode engine did not hold, and the link of a pair is the
slower of the two engines' NICs (``LINK_BY_PROFILE``) unless ``--link-gbps`` / ``--link-latency-ms`` set it.

The decode answer's ``cached_tokens`` is what no engine of the pair had to compute: the larger of the decode
engine's own prefix hit and the prefill engine's.

Faults (``POST /sim/fault``): ``crash_after_prefill`` (the next prefill answers, then the engine crashes: it dies
between the two steps), ``stall_kv`` (pulls from this engine never answer: the transfer times out) and
``reject_kv`` (this decode engine refuses transfers); ``recover`` clears them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from cognitora_sim.block_hash import event_hash
from cognitora_sim.kv_cache import BlockTable

if TYPE_CHECKING:
    from cognitora_sim.engine import SimEngine

__all__ = ["ROLES", "KvLink", "PdEngine", "PdSide", "TransferFailed", "classify"]

ROLES = ("both", "prefill", "decode")
SIM_KV_BYTES_PER_TOKEN = 131072
"""Llama-3-8B in bf16: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes (the h100 and mac profiles)."""


@dataclass(frozen=True)
class KvLink:
    gbps: float
    latency_s: float

    def transfer_s(self, tokens: int, kv_bytes_per_token: int) -> float:
        return self.latency_s + tokens * kv_bytes_per_token * 8.0 / (self.gbps * 1e9)


LINK_BY_PROFILE: dict[str, KvLink] = {
    "h100": KvLink(gbps=400.0, latency_s=0.0005),  # one ConnectX-7 NDR port (400 Gb/s InfiniBand, RDMA), NIXL
    "h100x2": KvLink(gbps=400.0, latency_s=0.0005),
    "mac": KvLink(gbps=10.0, latency_s=0.001),  # 10 GbE (Mac Studio), TCP
}
DEFAULT_LINK = KvLink(gbps=100.0, latency_s=0.001)


def pair_link(prefill_profile: str, decode_profile: str) -> KvLink:
    """The slower NIC of the two bounds the bandwidth; the larger latency is the pair's."""
    a = LINK_BY_PROFILE.get(prefill_profile, DEFAULT_LINK)
    b = LINK_BY_PROFILE.get(decode_profile, DEFAULT_LINK)
    return KvLink(gbps=min(a.gbps, b.gbps), latency_s=max(a.latency_s, b.latency_s))


class TransferFailed(Exception):
    """The decode side could not get the prompt's KV: the HTTP status and message its client gets."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class PdSide:
    """Which side of which protocol a request is on, and where its KV comes from (the decode side)."""

    protocol: str
    """``vllm``, ``sglang`` or ``trtllm``."""
    prefill: bool
    key: str = ""
    """The parked KV's name: the prefill's request id (vLLM, TRT-LLM) or the bootstrap room (SGLang)."""
    source: str = ""
    """``host:port`` of the prefill engine (the decode side)."""


def classify(body: dict[str, Any], role: str) -> PdSide | str | None:
    """The request's side, None for an ordinary request, or what is wrong with its P/D fields (a 400)."""
    params = body.get("kv_transfer_params")
    if isinstance(params, dict):
        if params.get("do_remote_decode"):
            return PdSide("vllm", prefill=True)
        if params.get("do_remote_prefill"):
            host, port, rid = params.get("remote_host"), params.get("remote_port"), params.get("remote_request_id")
            if not host or not isinstance(port, int) or not rid:
                return "kv_transfer_params.do_remote_prefill needs remote_host, remote_port and remote_request_id"
            return PdSide("vllm", prefill=False, key=str(rid), source=f"{host}:{port}")
        return None
    disagg = body.get("disaggregated_params")
    if isinstance(disagg, dict):
        kind = disagg.get("request_type")
        if kind == "context_only":
            return PdSide("trtllm", prefill=True)
        if kind == "generation_only":
            rid, source = disagg.get("ctx_request_id"), disagg.get("opaque_state")
            if not rid or not isinstance(source, str):
                return "disaggregated_params generation_only needs ctx_request_id and opaque_state"
            return PdSide("trtllm", prefill=False, key=str(rid), source=source)
        return f"disaggregated_params.request_type must be context_only or generation_only, got {kind!r}"
    if "bootstrap_room" in body:
        room, host, port = body.get("bootstrap_room"), body.get("bootstrap_host"), body.get("bootstrap_port")
        if isinstance(room, list):
            return "bootstrap fields for a batch are not simulated: send one prompt per request"
        if role == "prefill":
            return PdSide("sglang", prefill=True, key=str(room))
        if role == "decode":
            if not host or not isinstance(port, int):
                return "bootstrap_room needs bootstrap_host and bootstrap_port"
            return PdSide("sglang", prefill=False, key=str(room), source=f"{host}:{port}")
        return "bootstrap fields sent to an engine with role 'both': start it with --roles prefill or decode"
    return None


@dataclass
class _Parked:
    token_ids: list[int]
    cached_tokens: int
    expires: float
    """Engine time."""


@dataclass
class PdFaults:
    crash_after_prefill: bool = False
    stall_kv: bool = False
    reject_kv: bool = False


@dataclass
class PdMetrics:
    role: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        Gauge("cognitora_sim:pd_role_info", "This engine's P/D role.", ["role"], registry=r).labels(self.role).set(1)
        self.steps = Counter(
            "cognitora_sim:pd_steps", "Pair steps served, by side and protocol.", ["side", "protocol"], registry=r
        )
        self.transfer_s = Histogram(
            "cognitora_sim:pd_kv_transfer_seconds",
            "Modeled KV transfer time of a decode step (engine seconds).",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.blocks = Counter("cognitora_sim:pd_kv_transferred_blocks", "KV blocks received.", registry=r)
        self.failures = Counter(
            "cognitora_sim:pd_transfer_failures", "Decode steps whose KV never came.", ["reason"], registry=r
        )


class PdEngine:
    """One engine's P/D state: its role, the KV it parked, its link, its P/D faults and metrics."""

    def __init__(
        self,
        engine: SimEngine,
        role: str,
        *,
        link: KvLink | None = None,
        kv_bytes_per_token: int = SIM_KV_BYTES_PER_TOKEN,
        park_s: float = 30.0,
        transfer_timeout_s: float = 10.0,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        self.engine = engine
        self.role = role
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.park_s = park_s
        self.transfer_timeout_s = transfer_timeout_s
        """Wall seconds the decode side waits for its KV before refusing the request."""
        self.faults = PdFaults()
        self.metrics = PdMetrics(role)
        self._parked: dict[str, _Parked] = {}
        self._arrived = asyncio.Condition()
        self._session: aiohttp.ClientSession | None = None

    def exposition(self) -> bytes:
        return generate_latest(self.metrics.registry)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the prefill side -------------------------------------------------------------------------------------
    async def park(self, key: str, token_ids: list[int], cached_tokens: int) -> None:
        now = self.engine.clock.now()
        for name in [k for k, p in self._parked.items() if p.expires <= now]:
            del self._parked[name]
        self._parked[key] = _Parked(list(token_ids), cached_tokens, now + self.park_s)
        async with self._arrived:
            self._arrived.notify_all()

    def prefill_answer(self, side: PdSide, rid: str, token_ids: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(top-level fields, choice fields) the prefill answer carries for the decode side."""
        c = self.engine.config
        self.metrics.steps.labels("prefill", side.protocol).inc()
        if side.protocol == "vllm":
            blocks = len(token_ids) // c.block_size
            return {
                "kv_transfer_params": {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_block_ids": list(range(blocks)),
                    "remote_engine_id": c.endpoint_id,
                    "remote_request_id": rid,
                    "remote_host": c.host,
                    "remote_port": c.port,
                    "tp_size": 1,
                }
            }, {}
        if side.protocol == "trtllm":
            params = {"request_type": "context_only", "ctx_request_id": rid, "opaque_state": c.endpoint_id}
            return {}, {"disaggregated_params": params}
        return {}, {}

    async def serve_pull(self, request: web.Request) -> web.Response:
        """``POST /kv/pull {key, wait_s}``: the parked KV (once), waiting up to ``wait_s`` for it to be parked."""
        body = await request.json()
        key, wait_s = str(body.get("key", "")), float(body.get("wait_s", 0.0))
        if self.faults.stall_kv:
            await asyncio.Event().wait()  # never answers: the decode side's deadline decides
        deadline = time.monotonic() + wait_s
        async with self._arrived:
            while key not in self._parked:
                left = deadline - time.monotonic()
                if left <= 0:
                    return web.json_response({"error": f"no KV parked under {key!r} (expired or never)"}, status=404)
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    continue
        parked = self._parked.pop(key)
        if parked.expires <= self.engine.clock.now():
            return web.json_response({"error": f"the KV parked under {key!r} expired"}, status=404)
        return web.json_response(
            {"token_ids": parked.token_ids, "cached_tokens": parked.cached_tokens, "profile": self.engine.profile.name}
        )

    # -- the decode side --------------------------------------------------------------------------------------
    async def receive(self, side: PdSide, prompt_ids: list[int]) -> int:
        """Pull ``side``'s KV, wait the modeled transfer, store the blocks this engine lacks; returns the prompt
        tokens the pair did not compute (the ``cached_tokens`` to report). Raises ``TransferFailed``."""
        if self.faults.reject_kv:
            self._failed("rejected")
            raise TransferFailed(503, "KV transfer refused by the decode engine (fault reject_kv)", "rejected")
        wait_s = self.transfer_timeout_s if side.protocol == "sglang" else 0.0
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"http://{side.source}/kv/pull"
        try:
            async with asyncio.timeout(self.transfer_timeout_s + wait_s):
                async with self._session.post(url, json={"key": side.key, "wait_s": wait_s}) as resp:
                    answer = await resp.json(content_type=None)
                    status = resp.status
        except TimeoutError:
            self._failed("timeout")
            raise TransferFailed(
                504, f"KV transfer from {side.source} timed out after {self.transfer_timeout_s:g} s", "timeout"
            ) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            self._failed("unreachable")
            why = f"KV transfer from {side.source} failed: {exc or type(exc).__name__}"
            raise TransferFailed(503, why, "unreachable") from None
        if status != 200 or not isinstance(answer, dict):
            self._failed("missing")
            detail = answer.get("error") if isinstance(answer, dict) else answer
            raise TransferFailed(503, f"KV transfer from {side.source} failed: {detail}", "missing")
        remote_ids = answer.get("token_ids") or []
        bs = self.engine.config.block_size
        full = (len(prompt_ids) - 1) // bs  # the last token is always computed here, as with a prefix hit
        if remote_ids[: full * bs] != prompt_ids[: full * bs]:
            self._failed("mismatch")
            raise TransferFailed(400, "the transferred KV is for another prompt", "mismatch")
        digests: list[bytes] = []
        self.engine.scheduler.hasher.extend(digests, prompt_ids[: full * bs])
        local_hit = self.engine.cache.longest_prefix([event_hash(d) for d in digests])
        link = self.link or pair_link(str(answer.get("profile", "")), self.engine.profile.name)
        seconds = link.transfer_s((full - local_hit) * bs, self.kv_bytes_per_token)
        await asyncio.sleep(seconds / self.engine.clock.scale)
        # The blocks land when the transfer is over; the caller submits the request before anything else runs.
        _, moved = self._store(prompt_ids[: full * bs])
        self.metrics.transfer_s.observe(seconds)
        self.metrics.blocks.inc(moved)
        self.metrics.steps.labels("decode", side.protocol).inc()
        return max(local_hit * bs, int(answer.get("cached_tokens") or 0))

    def _store(self, token_ids: list[int]) -> tuple[int, int]:
        """Put ``token_ids``' full blocks in this engine's prefix cache (announced in its KV events); returns (blocks
        it held already, blocks stored)."""
        engine = self.engine
        cache, hasher = engine.cache, engine.scheduler.hasher
        digests: list[bytes] = []
        hasher.extend(digests, token_ids)
        hashes = [event_hash(d) for d in digests]
        have = cache.longest_prefix(hashes)
        new = len(hashes) - have
        if new <= 0:
            return have, 0
        if new > cache.free_blocks:
            self._failed("no_room")
            why = f"no KV room for the transfer: {new} blocks needed, {cache.free_blocks} free"
            raise TransferFailed(503, why, "no_room")
        table = BlockTable()
        cache.touch(table, hashes[:have])
        cache.allocate(table, new)
        bs = cache.block_size
        cache.commit_full(table, have, hashes[have:], token_ids[have * bs :], hashes[have - 1] if have else None)
        cache.free(table)
        engine.publish_kv_events()
        return have, new

    def _failed(self, reason: str) -> None:
        self.metrics.failures.labels(reason).inc()
