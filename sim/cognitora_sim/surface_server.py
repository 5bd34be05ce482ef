"""The simulated engine's agent surfaces: Anthropic Messages and OpenAI Responses, served as vLLM 0.32 serves them.

Routes (vLLM kind only, as vLLM's server has them): ``POST /v1/messages`` (streamed or not),
``POST /v1/messages/count_tokens``, ``POST /v1/responses`` (streamed or not), and the render twins
``POST /v1/messages/render`` and ``POST /v1/responses/render`` (vLLM serves those with ``--enable-scale-out``).

A request is read by ``kvstate.surfaces`` (the rules the router keys with), turned into token ids the same way
(images included, ``kvstate.surfaces.media``), and run as one engine request like a chat: same scheduler, same
prefix cache, same KV events. So a conversation sent as a chat, as Messages or as Responses hits the same cached
blocks exactly where vLLM renders it the same. The answers' shapes are ``cognitora_sim.anthropic_api`` and
``cognitora_sim.responses_api``.

``previous_response_id``: like vLLM, the engine holds no responses unless started with ``--responses-store``
(vLLM: ``VLLM_ENABLE_RESPONSES_API_STORE=1``), and answers 404 for one it does not hold. With the store it keeps
each response's conversation (``kvstate.surfaces.history.ResponseHistory``, the router's own bounded map, here
with a large bound) and renders a continuation as vLLM does.

Not simulated: tool calls and thinking in the *answers* (the engine generates plain text, as it does for chats),
prefill/decode pairs on these routes.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from cognitora_sim import anthropic_api
from cognitora_sim.engine import EngineDown, RequestRejected, SimEngine
from cognitora_sim.http_json import cut_connection, error_response, read_json
from cognitora_sim.responses_api import ResponseShape, not_found_body
from cognitora_sim.scheduler import SimRequest
from kvstate.prompt import ChatTokenizer
from kvstate.surfaces.anthropic import read_messages
from kvstate.surfaces.history import ResponseHistory
from kvstate.surfaces.request import SurfaceError, SurfaceRequest
from kvstate.surfaces.responses import read_responses
from kvstate.surfaces.template_traits import DEFAULT_TRAITS, template_traits

__all__ = ["STORE_BYTES", "SurfaceEndpoints"]

TokenIds = Callable[[SurfaceRequest, bool], Awaitable[list[list[int]]]]
"""The engine server's tokenizer: a read request -> its token ids (``True``: refuse one longer than the context)."""

STORE_BYTES = 1 << 30
"""Bound of the simulated response store (vLLM's never evicts: a long benchmark must not exhaust the machine)."""


class _Gone(Exception):
    """The engine dropped the request (a crash or restart fault): cut the connection."""


async def _deltas(req: SimRequest) -> AsyncIterator[str]:
    """The answer's text as the engine samples it, chunk by chunk, until it finishes."""
    sent = 0
    while True:
        await req.wakeup.wait()
        req.wakeup.clear()
        if req.aborted:
            raise _Gone
        new = req.output_text[sent:]
        if new:
            sent += len(new)
            yield "".join(new)
        if req.finished:
            return


def _invalid(exc: SurfaceError) -> web.Response:
    """A body that does not validate: FastAPI's 400, as vLLM's routes answer it."""
    return error_response(400, exc.message, "Bad Request", f"body.{exc.param}")


def _sse_response() -> web.StreamResponse:
    return web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})


class SurfaceEndpoints:
    """The Messages and Responses routes of one simulated engine."""

    def __init__(
        self, engine: SimEngine, token_ids: TokenIds, *, accept_any_model: bool = False, responses_store: bool = False
    ) -> None:
        self.engine = engine
        self._token_ids = token_ids
        self.model = engine.config.model
        self.accept_any_model = accept_any_model
        self.history = ResponseHistory(STORE_BYTES) if responses_store else None
        tok = engine.tokenizer
        self.traits = template_traits(tok.template) if isinstance(tok, ChatTokenizer) else DEFAULT_TRAITS

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/messages", self.messages)
        router.add_post("/v1/messages/count_tokens", self.count_tokens)
        router.add_post("/v1/messages/render", self.render_messages)
        router.add_post("/v1/responses", self.responses)
        router.add_post("/v1/responses/render", self.render_responses)

    # -- Anthropic Messages -----------------------------------------------------------------------------------
    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        try:
            sreq = read_messages(body, self.traits)
            (ids,) = await self._token_ids(sreq, True)
        except SurfaceError as exc:
            return _invalid(exc)
        except ValueError as exc:  # a template error, or a prompt longer than the context
            return _anthropic_error(400, "BadRequestError", str(exc))
        model = str(body.get("model"))
        if model != self.model and not self.accept_any_model:
            return _anthropic_error(404, "NotFoundError", f"The model `{model}` does not exist.")
        assert sreq.max_tokens is not None  # required by read_messages
        rid = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        try:
            req = self.engine.submit(ids, sreq.max_tokens, sreq.stream, rid)
        except RequestRejected as exc:
            return _anthropic_error(400, "BadRequestError", str(exc))
        except EngineDown:
            return cut_connection(request)
        try:
            if not sreq.stream:
                text = "".join([t async for t in _deltas(req)])
                usage = (req.prompt_len, req.output_len, req.cached_tokens or 0)
                return web.json_response(anthropic_api.message_body(rid, model, text, *usage))
            resp = _sse_response()
            await resp.prepare(request)
            started = False
            async for text in _deltas(req):
                head = b"" if started else anthropic_api.stream_start(rid, model, req.prompt_len)
                started = True
                await resp.write(head + anthropic_api.stream_delta(text))
            tail = b"" if started else anthropic_api.stream_start(rid, model, req.prompt_len)
            await resp.write(tail + anthropic_api.stream_end(req.prompt_len, req.output_len, req.cached_tokens or 0))
            await resp.write_eof()
            return resp
        except _Gone:
            return cut_connection(request)
        finally:
            if not req.finished:
                self.engine.abort(req)

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            ids = await self._token_ids(read_messages(body, self.traits, count_tokens=True), False)
        except SurfaceError as exc:
            return _invalid(exc)
        except ValueError as exc:
            return _anthropic_error(400, "BadRequestError", str(exc))
        return web.json_response(anthropic_api.count_tokens_body(sum(map(len, ids))))

    async def render_messages(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            (ids,) = await self._token_ids(read_messages(body, self.traits), False)
        except SurfaceError as exc:
            return _invalid(exc)
        except ValueError as exc:
            return error_response(400, str(exc), param="messages")
        return web.json_response({"request_id": f"chatcmpl-{uuid.uuid4().hex}", "token_ids": ids})

    # -- OpenAI Responses -------------------------------------------------------------------------------------
    def _read_responses(self, body: dict[str, Any]) -> SurfaceRequest | web.Response:
        previous = body.get("previous_response_id")
        if isinstance(previous, str) and (self.history is None or self.history.get(previous) is None):
            return web.json_response(not_found_body(previous), status=404)
        try:
            return read_responses(body, self.history)
        except SurfaceError as exc:
            return _invalid(exc)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        sreq = self._read_responses(body)
        if isinstance(sreq, web.Response):
            return sreq
        try:
            (ids,) = await self._token_ids(sreq, True)
        except ValueError as exc:
            return error_response(400, str(exc), "BadRequestError", "input")
        model = str(body.get("model") or self.model)
        if model != self.model and not self.accept_any_model:
            return error_response(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        max_tokens = sreq.max_tokens if sreq.max_tokens is not None else self.engine.config.default_max_tokens
        shape = ResponseShape(body, model, max_tokens)
        try:
            req = self.engine.submit(ids, max_tokens, sreq.stream, shape.response_id)
        except RequestRejected as exc:
            return error_response(400, str(exc), "BadRequestError", "input")
        except EngineDown:
            return cut_connection(request)
        try:
            if not sreq.stream:
                text = "".join([t async for t in _deltas(req)])
                self._remember(body, sreq, shape.response_id, text)
                usage = (req.prompt_len, req.output_len, req.cached_tokens or 0)
                return web.json_response(shape.response("incomplete", text, usage))
            resp = _sse_response()
            await resp.prepare(request)
            await resp.write(shape.start_events())
            pieces: list[str] = []
            async for text in _deltas(req):
                head = b"" if pieces else shape.first_token_events()
                pieces.append(text)
                await resp.write(head + shape.delta_event(text))
            full = "".join(pieces)
            self._remember(body, sreq, shape.response_id, full)
            await resp.write(shape.end_events(full, req.prompt_len, req.output_len, req.cached_tokens or 0))
            await resp.write_eof()
            return resp
        except _Gone:
            return cut_connection(request)
        finally:
            if not req.finished:
                self.engine.abort(req)

    def _remember(self, body: dict[str, Any], sreq: SurfaceRequest, response_id: str, text: str) -> None:
        chat = sreq.chat
        if self.history is not None and body.get("store", True) is not False and chat is not None:
            self.history.remember(response_id, chat.messages, [text] if text else [])

    async def render_responses(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        sreq = self._read_responses(body)
        if isinstance(sreq, web.Response):
            return sreq
        try:
            (ids,) = await self._token_ids(sreq, False)
        except ValueError as exc:
            return error_response(400, str(exc), param="input")
        return web.json_response({"request_id": f"resp_{uuid.uuid4().hex}", "token_ids": ids})


def _anthropic_error(status: int, type_: str, message: str) -> web.Response:
    return web.json_response(anthropic_api.error_body(type_, message), status=status)
