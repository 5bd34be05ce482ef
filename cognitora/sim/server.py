"""One engine's HTTP face: vLLM's OpenAI-compatible server, as far as routers and gateways can tell.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE when ``stream``, usage with
``prompt_tokens_details.cached_tokens``, a usage chunk when ``stream_options.include_usage``, usage in every chunk
too with vLLM's ``continuous_usage_stats``), ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``GET /load``, ``POST /tokenize``, ``POST /detokenize`` (built-in tokenizer: 400),
``POST /v1/chat/completions/render`` and ``POST /v1/completions/render`` (vllm-router's cache_aware needs them),
``POST /reset_prefix_cache``, and the simulator's admin API ``POST /sim/fault`` and ``GET /sim/state``.

Unknown request fields are ignored; ``max_completion_tokens`` and ``max_tokens`` are both accepted. Errors use
vLLM's shape ``{"error": {"message", "type", "param", "code"}}``. No ``/server_info``/``/model_info``: sglang-router
would then try to download a tokenizer (peer-routers.md section 8).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from cognitora.sim.engine import EngineDown, RequestRejected, SimEngine
from cognitora.sim.scheduler import SimRequest
from cognitora.sim.tokenizer import prompt_token_ids

FaultHandler = Callable[[int, str, float | None], Coroutine[Any, Any, None]]
FAULT_KINDS = ("crash", "hang", "slow", "clear_cache", "restart", "recover")


def error_response(status: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return web.json_response(body, status=status)


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise web.HTTPBadRequest(
            text=json.dumps(
                {
                    "error": {
                        "message": f"request body is not valid JSON: {exc}",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                }
            ),
            content_type="application/json",
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps(
                {
                    "error": {
                        "message": "request body must be a JSON object",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                }
            ),
            content_type="application/json",
        )
    return body


class EngineServer:
    """The aiohttp application of one engine. ``fault`` applies a fault to an engine of the fleet by index."""

    def __init__(self, engine: SimEngine, fault: FaultHandler, accept_any_model: bool = False) -> None:
        self.engine = engine
        self.fault = fault
        self.accept_any_model = accept_any_model
        self.model = engine.config.model
        self.created = int(time.time())

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._hang_middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_get("/load", self.load)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/v1/chat/completions/render", self.render_chat)
        r.add_post("/v1/completions/render", self.render_completion)
        r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        r.add_post("/sim/fault", self.sim_fault)
        r.add_get("/sim/state", self.sim_state)
        return app

    @web.middleware
    async def _hang_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.engine.hung and not request.path.startswith("/sim/"):
            await self.engine.wait_unhung()  # accept, never answer (until "recover")
        return await handler(request)

    # ---- plain endpoints ------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.engine.profile.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.engine.metrics.exposition())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def load(self, request: web.Request) -> web.Response:
        s = self.engine.scheduler
        return web.json_response({"server_load": len(s.running) + len(s.waiting)})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.clear_cache()
        return web.Response(status=200)

    # ---- tokenizer endpoints --------------------------------------------------------------------------------
    def _tokens_of(self, body: dict[str, Any]) -> list[int]:
        tok = self.engine.tokenizer
        if "messages" in body:
            return tok.encode_chat(body["messages"])
        if "prompt" in body:
            return prompt_token_ids(tok, body["prompt"])
        raise ValueError("give 'prompt' (text or token ids) or 'messages' (a chat)")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            ids = self._tokens_of(body)
        except ValueError as exc:
            return error_response(400, str(exc))
        return web.json_response(
            {"count": len(ids), "max_model_len": self.engine.profile.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        chat = getattr(self.engine.tokenizer, "chat", None)
        if chat is None:
            return error_response(400, "the built-in tokenizer cannot detokenize; start the fleet with --tokenizer")
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            return error_response(400, "'tokens' must be a list of token ids", param="tokens")
        return web.json_response({"prompt": chat.tokenizer.decode(tokens, skip_special_tokens=False)})

    async def render_chat(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            ids = self.engine.tokenizer.encode_chat(_messages(body))
        except ValueError as exc:
            return error_response(400, str(exc), param="messages")
        return web.json_response(
            {"request_id": f"chatcmpl-{uuid.uuid4().hex}", "token_ids": ids, "prompt_token_ids": ids}
        )

    async def render_completion(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            ids = prompt_token_ids(self.engine.tokenizer, body.get("prompt"))
        except ValueError as exc:
            return error_response(400, str(exc), param="prompt")
        return web.json_response(
            [{"request_id": f"cmpl-{uuid.uuid4().hex}", "token_ids": ids, "prompt_token_ids": ids}]
        )

    # ---- completions ----------------------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        try:
            prompt_ids = self.engine.tokenizer.encode_chat(_messages(body))
        except ValueError as exc:
            return error_response(400, str(exc), param="messages")
        return await self._generate(request, body, prompt_ids, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        try:
            prompt_ids = prompt_token_ids(self.engine.tokenizer, body.get("prompt"))
        except ValueError as exc:
            return error_response(400, str(exc), param="prompt")
        return await self._generate(request, body, prompt_ids, chat=False)

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt_ids: list[int], chat: bool
    ) -> web.StreamResponse:
        model = body.get("model", self.model)
        if model != self.model and not self.accept_any_model:
            return error_response(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw_max is None:
            raw_max = self.engine.config.default_max_tokens
        if not isinstance(raw_max, int) or isinstance(raw_max, bool):
            return error_response(400, "max_tokens must be an integer", param="max_tokens")
        stream = bool(body.get("stream", False))
        stream_options = body.get("stream_options") or {}
        if not isinstance(stream_options, dict):
            return error_response(400, "stream_options must be an object", param="stream_options")
        include_usage = bool(stream_options.get("include_usage"))
        # vLLM's extension: usage in every chunk as well
        continuous_usage = include_usage and bool(stream_options.get("continuous_usage_stats"))
        prefix = "chatcmpl" if chat else "cmpl"
        rid = f"{prefix}-{uuid.uuid4().hex}"
        try:
            req = self.engine.submit(prompt_ids, raw_max, stream, rid)
        except RequestRejected as exc:
            return error_response(400, str(exc))
        except EngineDown:
            return _cut_connection(request)
        try:
            if stream:
                return await self._stream(request, req, chat, str(model), include_usage, continuous_usage)
            return await self._complete(request, req, chat, str(model))
        finally:
            if not req.finished:
                self.engine.abort(req)

    async def _complete(self, request: web.Request, req: SimRequest, chat: bool, model: str) -> web.StreamResponse:
        while not req.finished:
            await req.wakeup.wait()
            req.wakeup.clear()
            if req.aborted:
                return _cut_connection(request)
        text = "".join(req.output_text)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            obj = "text_completion"
        return web.json_response(
            {
                "id": req.rid,
                "object": obj,
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": _usage(req),
            }
        )

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        chat: bool,
        model: str,
        include_usage: bool,
        continuous_usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        sent = 0
        while True:
            await req.wakeup.wait()
            req.wakeup.clear()
            if req.aborted:
                return _cut_connection(request, resp)
            new = req.output_text[sent:]
            if not new and not req.finished:
                continue
            parts: list[bytes] = []
            finish = "length" if req.finished else None
            if chat:
                if sent == 0:
                    parts.append(
                        _sse(
                            {
                                "id": req.rid,
                                "object": obj,
                                "created": created,
                                "model": model,
                                "choices": [
                                    {
                                        "index": 0,
                                        "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None,
                                        "finish_reason": None,
                                    }
                                ],
                            }
                        )
                    )
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": {"content": "".join(new)},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            else:
                choice = {"index": 0, "text": "".join(new), "logprobs": None, "finish_reason": finish}
            if finish:
                choice["stop_reason"] = None
            chunk: dict[str, Any] = {
                "id": req.rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if continuous_usage:
                chunk["usage"] = _usage(req)
            parts.append(_sse(chunk))
            sent += len(new)
            if req.finished:
                if include_usage:
                    parts.append(
                        _sse(
                            {
                                "id": req.rid,
                                "object": obj,
                                "created": created,
                                "model": model,
                                "choices": [],
                                "usage": _usage(req),
                            }
                        )
                    )
                parts.append(b"data: [DONE]\n\n")
            await resp.write(b"".join(parts))
            if req.finished:
                await resp.write_eof()
                return resp

    # ---- simulator admin ------------------------------------------------------------------------------------
    async def sim_fault(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        kind = body.get("kind")
        if kind not in FAULT_KINDS:
            return error_response(400, f"fault 'kind' must be one of {', '.join(FAULT_KINDS)}", param="kind")
        factor = body.get("factor")
        if kind == "slow" and (not isinstance(factor, (int, float)) or factor <= 0):
            return error_response(400, "fault 'slow' needs a positive 'factor' (step time multiplier)", param="factor")
        target = body.get("engine", self.engine.config.index)
        if not isinstance(target, int):
            return error_response(400, "'engine' must be an engine index of this fleet", param="engine")
        resp = web.json_response({"engine": target, "kind": kind, "factor": factor})
        if kind == "crash" and target == self.engine.config.index:
            # answer first: the crash takes this very listener down
            await resp.prepare(request)
            await resp.write_eof()
            asyncio.get_running_loop().create_task(self.fault(target, kind, None))
            return resp
        try:
            await self.fault(target, kind, float(factor) if factor is not None else None)
        except (IndexError, ValueError) as exc:
            return error_response(400, str(exc), param="engine")
        return resp

    async def sim_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.state())


def _messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    return messages


def _usage(req: SimRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_len,
        "total_tokens": req.prompt_len + req.output_len,
        "completion_tokens": req.output_len,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens or 0},
    }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _cut_connection(request: web.Request, resp: web.StreamResponse | None = None) -> web.StreamResponse:
    """The engine went away mid-request: drop the TCP connection, as a crashed process would."""
    if request.transport is not None:
        request.transport.abort()
    return resp if resp is not None else web.Response(status=503)
