"""``cognitora sim cloud``: a simulated cloud provider (OpenAI-compatible), for tests, the demo and benchmarks.

What routing to a cloud depends on, and nothing more:

- ``POST /v1/chat/completions`` and ``/v1/completions``, streamed (SSE, ``stream_options.include_usage``) or not,
  with ``usage``; any ``model`` in ``--models`` (default: any), echoed back;
- a latency model: a network round trip (``--rtt-ms``) before anything, then a time to first token
  (``--ttft-ms``, the provider's own queue and prefill, independent of our fleet), then ``--tokens-per-s`` per
  sequence; prompt tokens are counted as characters / 4 (no tokenizer: the cloud's is not ours);
- a rate limit: beyond ``--max-concurrency`` requests in flight it answers 429 with ``Retry-After``;
- ``Authorization: Bearer`` checked against ``--api-key-env`` (401 when wrong), as a provider does;
- an outage switch: ``POST /admin/outage {"down": true}`` answers 503 to every request until
  ``{"down": false}``; ``POST /admin/limit {"max_concurrency": n}`` changes the rate limit;
- failures on command (``POST /admin/fault {"mode": ...}``, or ``--fault`` at start), for every inference request
  until ``{"mode": "none"}``: ``500``, ``503``, ``429`` (with ``Retry-After``), ``reset`` (the connection is
  dropped with a TCP reset before any answer), ``hang`` (accepted, never answered: the request waits until its
  client gives up or the fault is cleared), ``slow`` (answers, ``slow_ms`` late: ``{"mode": "slow", "slow_ms":
  3000}``); ``sim_cloud_received_total`` counts every inference request that arrived, whatever became of it;
- its counters on ``GET /metrics`` (requests by status, tokens, cost at ``--input-usd-per-mtok`` /
  ``--output-usd-per-mtok``);
- TLS (``--tls-dir``): a generated CA and certificate (``cognitora_sim.tls``), so a gateway's path to the cloud
  is a real TLS upstream with SNI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import ssl
import struct
import sys
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import prometheus_client
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from cognitora import jsonlog
from cognitora.redaction import register_secret
from cognitora_sim import tls

CHARS_PER_TOKEN = 4
WORD = "cloud "
HANG_MAX_S = 3600.0
"""A hung request waits at most this long (or until the fault changes, or its client leaves)."""


class Fault(StrEnum):
    """What the simulated provider does to every inference request (``/admin/fault``, ``--fault``)."""

    NONE = "none"
    HTTP_500 = "500"
    HTTP_503 = "503"
    HTTP_429 = "429"
    RESET = "reset"
    """The connection is dropped with a TCP reset before any byte of an answer."""
    HANG = "hang"
    """Accepted and never answered."""
    SLOW = "slow"
    """Answered, ``slow_ms`` late (before the first byte)."""


@dataclass
class CloudSettings:
    rtt_s: float = 0.02
    ttft_s: float = 0.1
    tokens_per_s: float = 200.0
    max_concurrency: int = 64
    retry_after_s: int = 2
    default_max_tokens: int = 64
    models: frozenset[str] = frozenset()
    """Served model names; empty: any."""
    api_key: str | None = None
    input_usd_per_mtok: float = 0.15
    output_usd_per_mtok: float = 0.6
    fault: Fault = Fault.NONE
    slow_s: float = 3.0


@dataclass
class CloudCounters:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("sim_cloud_requests", "Requests answered, by HTTP status.", ["status"], registry=r)
        self.received = Counter("sim_cloud_received", "Inference requests that arrived, answered or not.", registry=r)
        self.faults = Counter("sim_cloud_faults", "Requests failed on command, by fault mode.", ["mode"], registry=r)
        self.tokens = Counter("sim_cloud_tokens", "Tokens served, kind prompt or completion.", ["kind"], registry=r)
        self.cost = Counter("sim_cloud_cost_usd", "What the served tokens cost at the configured prices.", registry=r)
        self.inflight = Gauge("sim_cloud_requests_running", "Requests in flight.", registry=r)
        self.down = Gauge("sim_cloud_down", "1 while the outage switch is on.", registry=r)


class SimCloud:
    """The aiohttp application of the simulated provider."""

    def __init__(self, settings: CloudSettings) -> None:
        self.settings = settings
        self.counters = CloudCounters()
        self.down = False
        self.running = 0
        self._fault_changed = asyncio.Event()

    def build_app(self) -> web.Application:
        app = web.Application()
        r = app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.list_models)
        r.add_get("/metrics", self.metrics)
        r.add_get("/health", self.health)
        r.add_post("/admin/outage", self.outage)
        r.add_post("/admin/limit", self.limit)
        r.add_post("/admin/fault", self.set_fault)
        return app

    # -- admin -------------------------------------------------------------------------------------------------
    async def outage(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.down = bool(body.get("down", True))
        self.counters.down.set(1 if self.down else 0)
        return web.json_response({"down": self.down})

    async def limit(self, request: web.Request) -> web.Response:
        body = await request.json()
        value = body.get("max_concurrency")
        if not isinstance(value, int) or value < 0:
            return _error(400, "max_concurrency must be a non-negative integer", "invalid_request_error")
        self.settings.max_concurrency = value
        return web.json_response({"max_concurrency": value})

    async def set_fault(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            mode = Fault(str(body.get("mode", "none")))
        except ValueError:
            known = ", ".join(f.value for f in Fault)
            return _error(400, f"mode must be one of {known}, got {body.get('mode')!r}", "invalid_request_error")
        slow_ms = body.get("slow_ms")
        if slow_ms is not None:
            if not isinstance(slow_ms, int | float) or slow_ms < 0:
                return _error(400, "slow_ms must be a non-negative number", "invalid_request_error")
            self.settings.slow_s = float(slow_ms) / 1000
        self.settings.fault = mode
        self._fault_changed.set()  # wakes the hung requests: they answer by the new mode
        self._fault_changed = asyncio.Event()
        return web.json_response({"mode": mode.value, "slow_ms": self.settings.slow_s * 1000})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.counters.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"down": self.down}, status=503 if self.down else 200)

    async def list_models(self, request: web.Request) -> web.Response:
        names = sorted(self.settings.models)
        return web.json_response({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

    # -- inference ---------------------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        s = self.settings
        self.counters.received.inc()
        await asyncio.sleep(s.rtt_s / 2)  # the request's way in
        failed = await self._fault(request)
        if failed is not None:
            return failed
        refusal = self._refusal(request)
        if refusal is not None:
            await asyncio.sleep(s.rtt_s / 2)
            self.counters.requests.labels(str(refusal.status)).inc()
            return refusal
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._answer(_error(400, "request body is not valid JSON", "invalid_request_error"))
        model = body.get("model")
        if not isinstance(model, str) or (s.models and model not in s.models):
            return self._answer(_error(404, f"the model {model!r} does not exist", "invalid_request_error"))
        self.running += 1
        self.counters.inflight.set(self.running)
        try:
            return await self._generate(request, body, model, chat)
        finally:
            self.running -= 1
            self.counters.inflight.set(self.running)

    async def _fault(self, request: web.Request) -> web.StreamResponse | None:
        """The commanded failure of this request, if one is on (``Fault``)."""
        fault = self.settings.fault
        if fault is Fault.HANG:
            self.counters.faults.labels(fault.value).inc()
            changed, deadline = self._fault_changed, time.monotonic() + HANG_MAX_S
            # aiohttp does not cancel a handler whose client left: look, twice a second.
            while not changed.is_set() and time.monotonic() < deadline and not _gone(request):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 0.5)
            if _gone(request):
                return web.Response(status=499)  # nobody reads it: aiohttp drops it quietly
            fault = self.settings.fault  # released: answer by what is commanded now
        if fault is Fault.NONE or fault is Fault.HANG:
            return None
        if fault is Fault.SLOW:
            self.counters.faults.labels(fault.value).inc()
            await asyncio.sleep(self.settings.slow_s)
            return None
        self.counters.faults.labels(fault.value).inc()
        if fault is Fault.RESET:
            _reset(request)
            return web.Response(status=499)  # never written: the connection is gone
        status = int(fault.value)
        kind = {500: "server_error", 503: "server_error", 429: "rate_limit_exceeded"}[status]
        response = _error(status, f"simulated failure ({fault.value})", kind)
        if status == 429:
            response.headers["Retry-After"] = str(self.settings.retry_after_s)
        return self._answer(response)

    def _refusal(self, request: web.Request) -> web.Response | None:
        s = self.settings
        if s.api_key is not None and request.headers.get("Authorization") != f"Bearer {s.api_key}":
            return _error(401, "incorrect API key provided", "invalid_request_error")
        if self.down:
            return _error(503, "the service is temporarily unavailable (simulated outage)", "server_error")
        if self.running >= s.max_concurrency:
            response = _error(429, "rate limit reached: too many requests in flight", "rate_limit_exceeded")
            response.headers["Retry-After"] = str(s.retry_after_s)
            return response
        return None

    def _answer(self, response: web.Response) -> web.Response:
        self.counters.requests.labels(str(response.status)).inc()
        return response

    async def _generate(self, request: web.Request, body: dict[str, Any], model: str, chat: bool) -> web.StreamResponse:
        s = self.settings
        prompt_tokens = max(1, len(json.dumps(body.get("messages") if chat else body.get("prompt"))) // CHARS_PER_TOKEN)
        wanted = body.get("max_completion_tokens") or body.get("max_tokens") or s.default_max_tokens
        completion_tokens = max(1, int(wanted))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        per_token = 1.0 / s.tokens_per_s
        await asyncio.sleep(s.ttft_s + s.rtt_s / 2)
        if not body.get("stream"):
            await asyncio.sleep(per_token * (completion_tokens - 1))
            text = WORD * completion_tokens
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            self._count(200, prompt_tokens, completion_tokens)
            return web.json_response(
                {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        started = time.monotonic()
        for i in range(completion_tokens):
            finish = "length" if i == completion_tokens - 1 else None
            delta: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                delta["delta"] = {"role": "assistant", "content": WORD} if i == 0 else {"content": WORD}
            else:
                delta["text"] = WORD
            await resp.write(
                _sse({"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": [delta]})
            )
            # Paced against the start, not per sleep: a loaded event loop does not slow the simulated provider.
            wait = started + (i + 1) * per_token - time.monotonic()
            if wait > 0 and i < completion_tokens - 1:
                await asyncio.sleep(wait)
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(
                _sse(
                    {"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": [], "usage": usage}
                )
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self._count(200, prompt_tokens, completion_tokens)
        return resp

    def _count(self, status: int, prompt: int, completion: int) -> None:
        s, c = self.settings, self.counters
        c.requests.labels(str(status)).inc()
        c.tokens.labels("prompt").inc(prompt)
        c.tokens.labels("completion").inc(completion)
        c.cost.inc((prompt * s.input_usd_per_mtok + completion * s.output_usd_per_mtok) / 1e6)


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _reset(request: web.Request) -> None:
    """Drop the request's connection with a TCP RST (SO_LINGER 0), as a provider's load balancer resetting it."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _error(status: int, message: str, type_: str) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": str(status)}}
    return web.json_response(body, status=status)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


# -- the command -------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cognitora sim cloud", description="a simulated OpenAI-compatible provider")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--models", default="", help="comma list of served model names (default: any)")
    p.add_argument("--rtt-ms", type=float, default=20.0, help="network round trip")
    p.add_argument("--ttft-ms", type=float, default=100.0, help="the provider's own time to first token")
    p.add_argument("--tokens-per-s", type=float, default=200.0, help="decode speed per sequence")
    p.add_argument("--max-concurrency", type=int, default=64, help="beyond this many in flight: 429")
    p.add_argument("--retry-after-s", type=int, default=2, help="Retry-After of a 429")
    p.add_argument("--default-max-tokens", type=int, default=64)
    p.add_argument("--api-key-env", default=None, help="environment variable holding the expected API key")
    p.add_argument("--input-usd-per-mtok", type=float, default=0.15)
    p.add_argument("--output-usd-per-mtok", type=float, default=0.6)
    p.add_argument("--fault", choices=[f.value for f in Fault], default="none", help="fail every request so")
    p.add_argument("--slow-ms", type=float, default=3000.0, help="the delay of --fault slow")
    p.add_argument("--tls-dir", type=Path, default=None, help="serve HTTPS with a CA + certificate generated here")
    p.add_argument("--tls-hostname", default="cloud.sim.test", help="the certificate's name (the SNI clients send)")
    p.add_argument("--log-level", default="WARNING")
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    jsonlog.configure(args.log_level)
    prometheus_client.disable_created_metrics()
    if args.tokens_per_s <= 0 or args.max_concurrency < 0 or min(args.rtt_ms, args.ttft_ms) < 0:
        parser.error("--tokens-per-s must be positive; --max-concurrency, --rtt-ms and --ttft-ms not negative")
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            parser.error(f"--api-key-env {args.api_key_env}: that environment variable is not set")
        register_secret(api_key)
    settings = CloudSettings(
        rtt_s=args.rtt_ms / 1000,
        ttft_s=args.ttft_ms / 1000,
        tokens_per_s=args.tokens_per_s,
        max_concurrency=args.max_concurrency,
        retry_after_s=args.retry_after_s,
        default_max_tokens=args.default_max_tokens,
        models=frozenset(m for m in args.models.split(",") if m),
        api_key=api_key,
        input_usd_per_mtok=args.input_usd_per_mtok,
        output_usd_per_mtok=args.output_usd_per_mtok,
        fault=Fault(args.fault),
        slow_s=args.slow_ms / 1000,
    )
    context = None
    if args.tls_dir is not None:
        files = tls.generate(args.tls_dir, args.tls_hostname)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(files.cert, files.key)
    app = SimCloud(settings).build_app()
    web.run_app(app, host=args.host, port=args.port, ssl_context=context, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
