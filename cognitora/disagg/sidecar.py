"""``cognitora pd-sidecar``: runs beside a decode engine and turns one request into a prefill/decode pair.

    cognitora pd-sidecar --listen 127.0.0.1:9101 --engine http://127.0.0.1:8101 --protocol vllm

Gateways send a decode endpoint's requests here (its ``url`` in cognitora.yaml is the sidecar's). A request with
``x-cognitora-prefill-endpoint: host:port`` (set by the gateway after placement, never by a client) is split:

- ``vllm``: the prefill step (``protocols.vllm_prefill_body``) on that endpoint, waited for; then the decode step
  (its ``kv_transfer_params``) on the local engine, whose answer is streamed back as it comes;
- ``sglang``: both bodies at once (bootstrap fields), the prefill's answer discarded, the decode's streamed back;
- ``trtllm``: context then generation, like vLLM's two steps with ``disaggregated_params``.

Faults end in one answer or one clear error, never two: a prefill step that fails (connection refused, an error
status, no answer within ``--prefill-timeout-s``, no KV parameters) or a decode step that refuses the transfer
(an error status before any byte reached the client, or no response headers within ``--transfer-timeout-s``) is
answered by the local engine prefilling itself, with ``x-cognitora-pd: fallback`` and the reason in
``x-cognitora-pd-fallback``. Only the local engine's own failure reaches the client (its status, or 502 when it
cannot be reached). Every other path (``/metrics``, ``/health``, ``/v1/models``) is passed to the engine as is, so
the collector can scrape the engine through the sidecar.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from cognitora import jsonlog, sd_notify
from cognitora.disagg import protocols, wire

__all__ = ["PROTOCOLS", "Sidecar", "SidecarSettings", "main"]

log = logging.getLogger(__name__)

PROTOCOLS = ("vllm", "sglang", "trtllm")
SPLIT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_HOP_BY_HOP = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"}
)
_PASS_BACK = ("content-type", "cache-control", "retry-after")
"""Response headers of the engine the client gets back."""


@dataclass(frozen=True)
class SidecarSettings:
    engine_url: str
    """The local decode engine, ``http://host:port``."""
    protocol: str = "vllm"
    prefill_timeout_s: float = 30.0
    """The prefill step (vLLM, TRT-LLM) must answer within this; else the engine prefills locally."""
    transfer_timeout_s: float = 30.0
    """The decode step carrying a transfer must send its response headers within this; else local prefill."""
    sglang_bootstrap_port: int | None = None
    """The prefill servers' bootstrap port (SGLang); None: the prefill endpoint's own HTTP port (``cognitora
    sim`` serves bootstrap there), a real SGLang's default is 8998."""
    allowed_prefill: frozenset[str] = frozenset()
    """``host:port`` of the prefill endpoints this sidecar may send a prefill step to; empty: any the header names
    (the gateway strips clients' copies of it, but a sidecar reachable by clients directly should list them)."""


@dataclass
class SidecarStats:
    split: int = 0
    local: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)


class _Fallback(Exception):
    """The split cannot go on: answer with local prefill, for this reason."""


class Sidecar:
    def __init__(self, settings: SidecarSettings) -> None:
        if settings.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {settings.protocol!r}")
        self.settings = settings
        self.stats = SidecarStats()
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[None]] = set()

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_get("/sidecar/stats", self._stats)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        # No total timeout: a decode streams as long as it streams; each step sets its own deadlines.
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))

    async def _close(self, _: web.Application) -> None:
        for task in list(self._background):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the app has not started"
        return self._session

    async def _stats(self, _: web.Request) -> web.Response:
        s = self.stats
        return web.json_response({"split": s.split, "local": s.local, "fallbacks": s.fallbacks})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        target = request.headers.get(wire.PREFILL_ENDPOINT_HEADER, "").strip()
        headers = _forward_headers(request.headers)
        if request.method != "POST" or request.path not in SPLIT_PATHS or not target:
            if request.path in SPLIT_PATHS:
                self.stats.local += 1
            return await self._relay(request, request.method, raw, headers, {wire.PD_HEADER: "local"})
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):  # the engine answers a bad body with its own error
            return await self._relay(request, "POST", raw, headers, {wire.PD_HEADER: "local"})
        headers.setdefault(wire.REQUEST_ID_HEADER, uuid.uuid4().hex)
        prefill_url = _base_url(target)
        try:
            allowed = self.settings.allowed_prefill
            if allowed and urlsplit(prefill_url).netloc not in allowed:
                raise _Fallback(f"prefill not allowed: {urlsplit(prefill_url).netloc} is not a --allow-prefill")
            return await self._split(request, body, prefill_url, headers)
        except _Fallback as why:
            reason = str(why)
            key = reason.split(":", 1)[0]
            self.stats.fallbacks[key] = self.stats.fallbacks.get(key, 0) + 1
            log.warning("request %s: %s; prefilling locally", headers[wire.REQUEST_ID_HEADER], reason)
            extra = {wire.PD_HEADER: "fallback", wire.PD_FALLBACK_HEADER: _header_safe(reason)}
            return await self._relay(request, "POST", raw, headers, extra)

    async def _split(
        self, request: web.Request, body: dict[str, Any], prefill_url: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        protocol = self.settings.protocol
        extra = {wire.PD_HEADER: "split"}
        if protocol == "sglang":
            parts = urlsplit(prefill_url)
            port = self.settings.sglang_bootstrap_port or parts.port or wire.SGLANG_DEFAULT_BOOTSTRAP_PORT
            prefill_body, decode_body = protocols.sglang_bodies(
                body, parts.hostname or "", port, protocols.sglang_room()
            )
            task = asyncio.create_task(self._sglang_prefill(prefill_url + request.path, prefill_body, headers))
            # Not cancelled when the client goes away (llm-d's sidecar does the same): the decode side waits on it.
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            started = time.monotonic()
            step = protocols.vllm_prefill_body(body) if protocol == "vllm" else protocols.trtllm_context_body(body)
            answer = await self._prefill(prefill_url + request.path, step, headers)
            try:
                if protocol == "vllm":
                    decode_body = protocols.vllm_decode_body(body, answer)
                else:
                    decode_body = protocols.trtllm_generation_body(body, answer)
            except protocols.ProtocolError as exc:
                raise _Fallback(f"prefill answer unusable: {exc}") from None
            extra[wire.PD_PREFILL_MS_HEADER] = f"{(time.monotonic() - started) * 1000:.1f}"
        upstream = await self._decode(request.path, decode_body, headers)
        self.stats.split += 1
        return await _stream_back(request, upstream, extra)

    async def _prefill(self, url: str, body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.settings.prefill_timeout_s)
        try:
            async with self.session.post(url, json=body, headers=headers, timeout=timeout) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise _Fallback(f"prefill failed: {url} answered {resp.status}: {_short(text)}")
                answer = json.loads(text)
        except TimeoutError:
            raise _Fallback(
                f"prefill timed out: no answer from {url} within {self.settings.prefill_timeout_s:g} s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise _Fallback(f"prefill unreachable: {url}: {exc or type(exc).__name__}") from None
        except ValueError:
            raise _Fallback(f"prefill answer unusable: {url} sent no JSON") from None
        if not isinstance(answer, dict):
            raise _Fallback(f"prefill answer unusable: {url} sent no JSON object")
        return answer

    async def _sglang_prefill(self, url: str, body: dict[str, Any], headers: Mapping[str, str]) -> None:
        try:
            async with self.session.post(url, json=body, headers=headers) as resp:
                await resp.read()
                if resp.status >= 400:
                    log.warning("SGLang prefill on %s answered %d", url, resp.status)
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("SGLang prefill on %s failed: %s", url, exc or type(exc).__name__)

    async def _decode(self, path: str, body: dict[str, Any], headers: Mapping[str, str]) -> aiohttp.ClientResponse:
        """The decode step's response, its headers read; a refusal or a silent engine raises ``_Fallback``."""
        url = self.settings.engine_url + path
        try:
            async with asyncio.timeout(self.settings.transfer_timeout_s):
                resp = await self.session.post(url, json=body, headers=headers)
        except TimeoutError:
            raise _Fallback(
                f"transfer timed out: the decode engine did not start within {self.settings.transfer_timeout_s:g} s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise _Fallback(f"decode unreachable: {url}: {exc or type(exc).__name__}") from None
        if resp.status >= 400:
            text = await resp.text()
            resp.release()
            raise _Fallback(f"transfer refused: the decode engine answered {resp.status}: {_short(text)}")
        return resp

    async def _relay(
        self, request: web.Request, method: str, raw: bytes, headers: Mapping[str, str], extra: Mapping[str, str]
    ) -> web.StreamResponse:
        url = self.settings.engine_url + request.path_qs
        try:
            upstream = await self.session.request(method, url, data=raw, headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            message = f"the decode engine at {self.settings.engine_url} cannot be reached: {exc or type(exc).__name__}"
            error = {"error": {"message": message, "type": "BadGatewayError", "param": None, "code": 502}}
            return web.json_response(error, status=502, headers=dict(extra))
        return await _stream_back(request, upstream, extra)


async def _stream_back(
    request: web.Request, upstream: aiohttp.ClientResponse, extra: Mapping[str, str]
) -> web.StreamResponse:
    """The engine's response to the client as it comes (SSE chunks unbuffered), with ``extra`` headers."""
    headers = {k: upstream.headers[k] for k in _PASS_BACK if k in upstream.headers}
    resp = web.StreamResponse(status=upstream.status, headers={**headers, **extra})
    try:
        await resp.prepare(request)
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientError):
        # The client (or the engine) went away mid-answer: closing the upstream response ends the engine's work.
        pass
    finally:
        upstream.release()
    return resp


def _forward_headers(incoming: Mapping[str, str]) -> dict[str, str]:
    drop = _HOP_BY_HOP | {wire.PREFILL_ENDPOINT_HEADER}
    return {k: v for k, v in incoming.items() if k.lower() not in drop}


def _base_url(target: str) -> str:
    return (target if "://" in target else f"http://{target}").rstrip("/")


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _header_safe(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)[:300]


# -- command line -------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cognitora pd-sidecar", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--listen",
        action="append",
        required=True,
        metavar="HOST:PORT",
        help="where to serve (repeat, one per --engine)",
    )
    p.add_argument(
        "--engine", action="append", required=True, metavar="URL", help="the local decode engine (repeat, in order)"
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="vllm", help="the engines' P/D protocol (default vllm)")
    p.add_argument("--prefill-timeout-s", type=float, default=30.0)
    p.add_argument("--transfer-timeout-s", type=float, default=30.0)
    p.add_argument("--sglang-bootstrap-port", type=int, default=None)
    p.add_argument(
        "--allow-prefill",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a prefill endpoint this sidecar may use (repeat); default: any the gateway names",
    )
    p.add_argument("--log-level", default="INFO")
    return p


async def _serve(pairs: list[tuple[str, int, SidecarSettings]]) -> None:
    runners: list[web.AppRunner] = []
    for host, port, settings in pairs:
        runner = web.AppRunner(Sidecar(settings).build_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
        print(json.dumps({"pd_sidecar": f"http://{host}:{port}", "engine": settings.engine_url}), flush=True)
    sd_notify.ready(f"serving {len(runners)} decode engine(s)")  # systemd Type=notify (deploy/systemd/)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    jsonlog.configure(args.log_level)  # JSON lines like every other command: what journalctl shows
    if len(args.listen) != len(args.engine):
        print(
            f"cognitora pd-sidecar: {len(args.listen)} --listen but {len(args.engine)} --engine: give one --listen "
            "per --engine",
            flush=True,
        )
        return 2
    pairs = []
    for listen, engine in zip(args.listen, args.engine, strict=True):
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            print(f"cognitora pd-sidecar: --listen wants HOST:PORT, got {listen!r}", flush=True)
            return 2
        settings = SidecarSettings(
            engine_url=engine.rstrip("/"),
            protocol=args.protocol,
            prefill_timeout_s=args.prefill_timeout_s,
            transfer_timeout_s=args.transfer_timeout_s,
            sglang_bootstrap_port=args.sglang_bootstrap_port,
            allowed_prefill=frozenset(args.allow_prefill),
        )
        pairs.append((host, int(port), settings))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(pairs))
    return 0
