"""N simulated engines in one process: one asyncio loop, one aiohttp listener per engine, one ZMQ context.

A crash fault closes that engine's listener (clients get "connection refused") and its ZMQ sockets; "recover"
brings it back as a fresh process would come back: empty cache, event sequence from 0. Because a crashed engine
cannot take HTTP requests, faults can also be sent to any other engine of the fleet (``{"engine": i}``) or to the
fleet's admin listener (``--admin-port``), which serves ``POST /sim/fault`` and ``GET /sim/state`` for all engines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from dataclasses import dataclass
from typing import Any

import zmq.asyncio
from aiohttp import web

from cognitora_sim.disagg import SIM_KV_BYTES_PER_TOKEN, KvLink, PdEngine
from cognitora_sim.engine import EngineConfig, EngineTime, SimEngine
from cognitora_sim.host_cores import HostCores
from cognitora_sim.http_json import error_response, read_json
from cognitora_sim.server import FAULT_KINDS, EngineServer
from cognitora_sim.tokenizer import SimTokenizer

log = logging.getLogger(__name__)


@dataclass
class _Member:
    engine: SimEngine
    server: EngineServer
    runner: web.AppRunner | None = None


class Fleet:
    def __init__(
        self,
        configs: list[EngineConfig],
        tokenizer: SimTokenizer,
        time_scale: float,
        *,
        accept_any_model: bool = False,
        admin_port: int | None = None,
        pd: PdSettings | None = None,
        host_cores: int | None = None,
    ) -> None:
        self.configs = configs
        self.tokenizer = tokenizer
        self.clock = EngineTime(time_scale)
        self.accept_any_model = accept_any_model
        self.admin_port = admin_port
        self.pd = pd or PdSettings()
        self.host = HostCores(host_cores) if host_cores is not None else None
        """All engines on one host of that many cores (``cognitora_sim.host_cores``); None: each has its own."""
        self.members: list[_Member] = []
        self._zmq: zmq.asyncio.Context | None = None
        self._admin: web.AppRunner | None = None

    async def start(self) -> None:
        self._zmq = zmq.asyncio.Context()
        for cfg in self.configs:
            engine = SimEngine(cfg, self.tokenizer, self._zmq, self.clock, self.host)
            server = EngineServer(engine, self.fault, self.accept_any_model, self.pd.engine(engine))
            member = _Member(engine, server)
            self.members.append(member)
            engine.start()
            await self._listen(member)
        if self.admin_port is not None:
            app = web.Application()
            app.router.add_post("/sim/fault", self._admin_fault)
            app.router.add_get("/sim/state", self._admin_state)
            app.router.add_get("/health", lambda _r: _ok())
            self._admin = web.AppRunner(app, access_log=None)
            await self._admin.setup()
            await web.TCPSite(self._admin, "127.0.0.1", self.admin_port).start()

    async def _listen(self, member: _Member) -> None:
        cfg = member.engine.config
        runner = web.AppRunner(member.server.build_app(), access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True).start()
        member.runner = runner

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.cleanup()
        for m in self.members:
            await m.engine.stop()
            await m.server.pd.close()
            if m.runner is not None:
                await m.runner.cleanup()
                m.runner = None
        if self._zmq is not None:
            self._zmq.destroy(linger=0)  # never block exit on a socket someone forgot
            self._zmq = None

    def startup_lines(self) -> list[dict[str, Any]]:
        lines = []
        for m in self.members:
            c = m.engine.config
            # Only the kinds that publish KV events have an events address (llama.cpp, MLX, TRT-LLM have none here).
            has_events = c.events_port is not None and m.engine.publisher is not None
            lines.append(
                {
                    "engine": c.index,
                    "url": f"http://{c.host}:{c.port}",
                    "endpoint_id": c.endpoint_id,
                    "model": c.model,
                    "profile": c.profile.name,
                    "role": m.server.pd.role,
                    "engine_kind": c.engine_kind,
                    "events": f"tcp://{c.host}:{c.events_port}" if has_events else None,
                    "replay": f"tcp://{c.host}:{c.replay_port}" if has_events and c.replay_port is not None else None,
                    "topic": c.topic,
                    "block_size": c.block_size,
                    "num_gpu_blocks": c.num_blocks,
                    "admin": f"http://127.0.0.1:{self.admin_port}" if self.admin_port is not None else None,
                }
            )
        return lines

    # ---- faults ---------------------------------------------------------------------------------------------
    async def fault(self, index: int, kind: str, factor: float | None) -> None:
        if not 0 <= index < len(self.members):
            raise IndexError(f"no engine {index} in this fleet of {len(self.members)}")
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {', '.join(FAULT_KINDS)}")
        m = self.members[index]
        e = m.engine
        pd = m.server.pd.faults
        if kind in ("crash_after_prefill", "stall_kv", "reject_kv"):
            setattr(pd, kind, True)
        elif kind == "crash":
            if e.crashed:
                return
            e.crash()
            if m.runner is not None:
                runner, m.runner = m.runner, None
                await runner.cleanup()
        elif kind == "recover":
            pd.crash_after_prefill = pd.stall_kv = pd.reject_kv = False
            was_crashed = e.crashed
            e.recover()
            if was_crashed and m.runner is None:
                await self._listen(m)
        elif kind == "hang":
            e.hang()
        elif kind == "slow":
            if factor is None:
                raise ValueError("fault 'slow' needs a positive 'factor'")
            e.set_slow(factor)
        elif kind == "clear_cache":
            e.clear_cache()
        elif kind == "restart":
            e.restart()

    async def _admin_fault(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        index, kind, factor = body.get("engine"), body.get("kind"), body.get("factor")
        if not isinstance(index, int):
            return error_response(400, "'engine' (the engine index) is required", param="engine")
        try:
            await self.fault(index, str(kind), float(factor) if isinstance(factor, (int, float)) else None)
        except (IndexError, ValueError) as exc:
            return error_response(400, str(exc))
        return web.json_response({"engine": index, "kind": kind, "factor": factor})

    async def _admin_state(self, request: web.Request) -> web.Response:
        return web.json_response({"engines": [m.engine.state() for m in self.members]})


@dataclass(frozen=True)
class PdSettings:
    """The fleet's prefill/decode settings (``cognitora_sim.disagg``)."""

    roles: tuple[str, ...] = ("both",)
    """Cycled over the engines, like ``--profile``."""
    link: KvLink | None = None
    """Every pair's link; None: from the two engines' profiles."""
    kv_bytes_per_token: int = SIM_KV_BYTES_PER_TOKEN
    park_s: float = 30.0
    transfer_timeout_s: float = 10.0

    def engine(self, engine: SimEngine) -> PdEngine:
        role = self.roles[engine.config.index % len(self.roles)]
        return PdEngine(
            engine,
            role,
            link=self.link,
            kv_bytes_per_token=self.kv_bytes_per_token,
            park_s=self.park_s,
            transfer_timeout_s=self.transfer_timeout_s,
        )


async def _ok() -> web.Response:
    return web.Response(status=200)


async def serve(fleet: Fleet) -> int:
    """Run until SIGTERM/SIGINT; print one JSON line per engine once all listen."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await fleet.start()
    except (OSError, zmq.ZMQError) as exc:
        await fleet.stop()
        print(
            f"cognitora sim: cannot listen: {exc} (pick free ports with --base-port/--events-base-port)",
            file=sys.stderr,
        )
        return 1
    for line in fleet.startup_lines():
        print(json.dumps(line), flush=True)
    await stop.wait()
    await fleet.stop()
    return 0
