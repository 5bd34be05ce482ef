"""One engine's HTTP face: vLLM's OpenAI-compatible server, as far as routers and gateways can tell.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE when ``stream``, usage with
``prompt_tokens_details.cached_tokens``, a usage chunk when ``stream_options.include_usage``, usage in every chunk
too with vLLM's ``continuous_usage_stats``), ``POST /v1/embeddings`` (a deterministic embedding of the tokens of
each input, read as vLLM reads it: ``cognitora_sim.embeddings``), ``GET /v1/models``, ``GET /health``,
``GET /metrics``, ``GET /load``, ``POST /tokenize``, ``POST /detokenize`` (built-in tokenizer: 400),
``POST /v1/chat/completions/render`` and ``POST /v1/completions/render`` (vllm-router's cache_aware needs them),
``POST /reset_prefix_cache``, ``GET /kv_event_sources`` (vLLM 0.32: where its KV events are), Anthropic Messages and
OpenAI Responses (``cognitora_sim.surface_server``), and the simulator's admin API ``POST /sim/fault`` and
``GET /sim/state``.

Prompts are read by ``kvstate.surfaces`` (chat and completions by ``kvstate.prompt``'s rules, images keyed by
content) with vLLM's rules (``kvstate.prompt``'s module docstring): chats with ``tools``,
``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs`` and ``add_special_tokens`` (default
false); completions ``prompt`` as a string, strings, token ids or token-id lists with ``add_special_tokens``
(default true). A completions batch runs one engine request per prompt, one choice each (``index`` = the prompt's
position), ``usage`` summed over the batch with the last prompt's ``cached_tokens`` (as vLLM reports it).
``/tokenize`` takes vLLM's two shapes: ``{"prompt": str, "add_special_tokens"}`` or ``{"messages", "tools", ...}``.

Tokenizing runs off the event loop for long prompts, as vLLM's API server does (a thread pool): one engine's 10 MB
prompt must not stall every engine of a fleet process. An inference request whose prompt is longer than the
model's context is refused as vLLM refuses it (400), as soon as that is proven: its text is counted chunk by chunk,
no further than the context length, instead of tokenizing all of it first.

Unknown request fields are ignored; ``max_completion_tokens`` and ``max_tokens`` are both accepted. Errors use
vLLM's shape ``{"error": {"message", "type", "param", "code"}}``. No ``/server_info``/``/model_info``: sglang-router
would then try to download a tokenizer (peer-routers.md section 8).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from cognitora_sim.disagg import PdEngine, PdSide, TransferFailed, classify
from cognitora_sim.embeddings import embeddings_response
from cognitora_sim.engine import EngineDown, RequestRejected, SimEngine
from cognitora_sim.engine_kinds import surface
from cognitora_sim.http_json import cut_connection, error_response, read_json
from cognitora_sim.kind_pages import PAGES, IterationStats, llamacpp_slots
from cognitora_sim.scheduler import SimRequest
from cognitora_sim.surface_server import SurfaceEndpoints
from kvstate.prompt import ChatPrompt, ChatTokenizer, PromptError, PromptTokenizer
from kvstate.surfaces.openai import read_chat, read_completions, read_embeddings
from kvstate.surfaces.request import SurfaceError, SurfaceRequest
from kvstate.surfaces.tokens import surface_prompt_chars, surface_token_ids

FaultHandler = Callable[[int, str, float | None], Coroutine[Any, Any, None]]
FAULT_KINDS = (
    "crash",
    "hang",
    "slow",
    "clear_cache",
    "restart",
    "recover",
    "crash_after_prefill",
    "stall_kv",
    "reject_kv",
)

INLINE_TOKENIZE_CHARS = 16_384
"""Prompts up to this size (``kvstate.prompt.prompt_chars``) are tokenized on the loop (~20 ms at most); larger
ones on the engine's tokenizer thread."""
COUNT_CHUNK_CHARS = 65_536
"""A text longer than this is first counted in chunks of this size, stopping once past the context length."""


class EngineServer:
    """The aiohttp application of one engine. ``fault`` applies a fault to an engine of the fleet by index."""

    def __init__(
        self, engine: SimEngine, fault: FaultHandler, accept_any_model: bool = False, pd: PdEngine | None = None
    ) -> None:
        self.engine = engine
        self.pd = pd if pd is not None else PdEngine(engine, "both")
        self.fault = fault
        self.accept_any_model = accept_any_model
        self.model = engine.config.model
        self.created = int(time.time())
        self._tokenizer_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._iteration_stats = IterationStats(engine)
        self.traceparents: deque[str] = deque(maxlen=256)
        """The W3C ``traceparent`` of the last requests that carried one (``GET /sim/traceparents``): where a real
        vLLM would continue the trace, tests read what the gateway handed on."""

    def build_app(self) -> web.Application:
        kind = surface(self.engine.config.engine_kind)
        app = web.Application(
            middlewares=[self._count_middleware, self._hang_middleware], client_max_size=64 * 1024 * 1024
        )
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/v1/models", self.models)
        if kind.prometheus_path is not None:
            r.add_get(kind.prometheus_path, self.metrics)
        if kind.iteration_stats_path is not None:
            r.add_get(kind.iteration_stats_path, self.iteration_stats)
        if kind.slots_route:
            r.add_get("/slots", self.slots)
        if kind.kv_events_route:
            r.add_post("/kv_cache_events", self.kv_cache_events)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/embeddings", self.embeddings)
        if kind.vllm_routes:
            r.add_get("/load", self.load)
            r.add_post("/tokenize", self.tokenize)
            r.add_post("/detokenize", self.detokenize)
            scale_out = self.engine.config.scale_out
            r.add_post("/v1/chat/completions/render", self.render_chat if scale_out else _scale_out_disabled)
            r.add_post("/v1/completions/render", self.render_completion if scale_out else _scale_out_disabled)
            r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
            r.add_get("/kv_event_sources", self.kv_event_sources)
            SurfaceEndpoints(
                self.engine,
                self.token_ids,
                accept_any_model=self.accept_any_model,
                responses_store=self.engine.config.responses_store,
            ).add_routes(r)
        r.add_post("/kv/pull", self.pd.serve_pull)
        r.add_post("/sim/fault", self.sim_fault)
        r.add_get("/sim/state", self.sim_state)
        r.add_get("/sim/traceparents", self.sim_traceparents)
        return app

    @web.middleware
    async def _count_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # Every request by path, routes this kind lacks included: tests prove nothing scrapes what is not there.
        if not request.path.startswith("/sim/"):
            counts = self.engine.http_requests
            counts[request.path] = counts.get(request.path, 0) + 1
            traceparent = request.headers.get("traceparent")
            if traceparent is not None:
                self.traceparents.append(traceparent)
        return await handler(request)

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
            "owned_by": surface(self.engine.config.engine_kind).owned_by,
            "root": self.model,
            "parent": None,
            "max_model_len": self.engine.profile.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        page = PAGES.get(self.engine.config.engine_kind)
        own = self.engine.metrics.exposition() if page is None else page(self.engine)
        resp = web.Response(body=own + self.pd.exposition())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def slots(self, request: web.Request) -> web.Response:
        return web.json_response(llamacpp_slots(self.engine))

    async def kv_cache_events(self, request: web.Request) -> web.Response:
        buffer = self.engine.trtllm_events
        return web.json_response([] if buffer is None else buffer.drain())

    async def iteration_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self._iteration_stats.drain())

    async def load(self, request: web.Request) -> web.Response:
        s = self.engine.scheduler
        return web.json_response({"server_load": len(s.running) + len(s.waiting)})

    async def kv_event_sources(self, request: web.Request) -> web.Response:
        """vLLM 0.32's answer: each data-parallel rank's KV-events config (one rank here), ``{}`` without events."""
        c = self.engine.config
        if self.engine.publisher is None or c.events_port is None:
            return web.json_response({})
        rank = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://{c.host}:{c.events_port}",
            "replay_endpoint": None if c.replay_port is None else f"tcp://{c.host}:{c.replay_port}",
            "buffer_steps": 10_000,
            "hwm": 100_000,
            "max_queue_size": 100_000,
            "topic": c.topic,
        }
        return web.json_response({"0": rank})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.clear_cache()
        return web.Response(status=200)

    # ---- tokenizer endpoints --------------------------------------------------------------------------------
    def _token_ids(self, request: SurfaceRequest) -> list[list[int]]:
        return surface_token_ids(self.engine.tokenizer, request)

    async def token_ids(self, request: SurfaceRequest, within_context: bool = False) -> list[list[int]]:
        """The token ids the engine runs for ``request`` (``kvstate.surfaces.tokens``), on the tokenizer thread for a
        long prompt. ``within_context``: refuse (``RequestRejected``) a prompt proven longer than the model's
        context before tokenizing all of it."""
        if surface_prompt_chars(request) <= INLINE_TOKENIZE_CHARS:
            return self._token_ids(request)
        if self._tokenizer_thread is None:
            self._tokenizer_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sim-tokenizer")
        work = self._token_ids_within_context if within_context else self._token_ids
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, work, request)

    def _token_ids_within_context(self, request: SurfaceRequest) -> list[list[int]]:
        tokenizer, limit = self.engine.tokenizer, self.engine.profile.max_model_len
        prompt = request.prompt
        if isinstance(prompt, ChatPrompt):
            texts = [tokenizer.render_chat(prompt)]
        else:
            texts = [p for p in prompt.prompts if isinstance(p, str)]
        for text in texts:
            if len(text) > COUNT_CHUNK_CHARS:
                at_least = _count_tokens_past(tokenizer, text, limit)
                if at_least > limit:
                    raise RequestRejected(
                        f"This model's maximum context length is {limit} tokens. However, your prompt has at least "
                        f"{at_least} tokens. Please reduce the length of the messages or prompt."
                    )
        return self._token_ids(request)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            if "messages" in body:
                (ids,) = await self.token_ids(read_chat(body))
            else:
                # vLLM's TokenizeCompletionRequest: one text prompt (token ids and batches go to /render).
                if not isinstance(body.get("prompt"), str):
                    raise PromptError("'prompt' must be a string, or give 'messages' (a chat)")
                (ids,) = await self.token_ids(_completion_prompt(body))
        except ValueError as exc:
            return error_response(400, str(exc), param=_param(exc, "messages" if "messages" in body else "prompt"))
        return web.json_response(
            {"count": len(ids), "max_model_len": self.engine.profile.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        tok = self.engine.tokenizer
        if not isinstance(tok, ChatTokenizer):
            return error_response(400, "the built-in tokenizer cannot detokenize; start the fleet with --tokenizer")
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            return error_response(400, "'tokens' must be a list of token ids", param="tokens")
        return web.json_response({"prompt": tok.tokenizer.decode(tokens, skip_special_tokens=False)})

    async def render_chat(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            (ids,) = await self.token_ids(read_chat(body))
        except ValueError as exc:
            return error_response(400, str(exc), param=_param(exc, "messages"))
        return web.json_response(
            {"request_id": f"chatcmpl-{uuid.uuid4().hex}", "token_ids": ids, "prompt_token_ids": ids}
        )

    async def render_completion(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            batch = await self.token_ids(_completion_prompt(body))
        except ValueError as exc:
            return error_response(400, str(exc), param=_param(exc, "prompt"))
        rid = f"cmpl-{uuid.uuid4().hex}"
        return web.json_response(
            [{"request_id": f"{rid}-{i}", "token_ids": ids, "prompt_token_ids": ids} for i, ids in enumerate(batch)]
        )

    # ---- completions ----------------------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        try:
            batch = await self.token_ids(read_chat(body), within_context=True)
        except ValueError as exc:
            return error_response(400, str(exc), param=_param(exc, "messages"))
        return await self._generate(request, body, batch, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        try:
            batch = await self.token_ids(_completion_prompt(body), within_context=True)
        except ValueError as exc:
            return error_response(400, str(exc), param=_param(exc, "prompt"))
        return await self._generate(request, body, batch, chat=False)

    async def _generate(
        self, request: web.Request, body: dict[str, Any], batch: list[list[int]], chat: bool
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
        side = classify(body, self.pd.role)
        if isinstance(side, str):
            return error_response(400, side)
        reported_cached: int | None = None
        if side is not None:
            if len(batch) != 1:
                return error_response(400, "a prefill/decode pair takes one prompt per request")
            if side.prefill:  # the prefill step: its first token only, answered whole
                raw_max, stream = 1, False
            else:
                try:
                    reported_cached = await self.pd.receive(side, batch[0])
                except TransferFailed as exc:
                    return error_response(exc.status, str(exc), "KVTransferError", "kv_transfer_params")
        reqs: list[SimRequest] = []
        try:
            try:
                for i, prompt_ids in enumerate(batch):
                    # vLLM runs each prompt of a batch as its own request, named after the batch's id.
                    reqs.append(
                        self.engine.submit(prompt_ids, raw_max, stream, rid if len(batch) == 1 else f"{rid}-{i}")
                    )
            except RequestRejected as exc:
                return error_response(400, str(exc))
            except EngineDown:
                return cut_connection(request)
            if reported_cached is not None:
                reqs[0].cached_tokens = reported_cached  # set before its first step: the scheduler keeps it
            if stream:
                return await self._stream(request, rid, reqs, chat, str(model), include_usage, continuous_usage)
            return await self._complete(request, rid, reqs, chat, str(model), side if side and side.prefill else None)
        finally:
            for req in reqs:
                if not req.finished:
                    self.engine.abort(req)

    async def _complete(
        self,
        request: web.Request,
        rid: str,
        reqs: list[SimRequest],
        chat: bool,
        model: str,
        prefill_side: PdSide | None = None,
    ) -> web.StreamResponse:
        for req in reqs:
            while not req.finished:
                await req.wakeup.wait()
                req.wakeup.clear()
                if req.aborted:
                    return cut_connection(request)
        top: dict[str, Any] = {}
        in_choice: dict[str, Any] = {}
        if prefill_side is not None:
            req = reqs[0]
            await self.pd.park(prefill_side.key or rid, req.tokens[: req.prompt_len], req.cached_tokens or 0)
            top, in_choice = self.pd.prefill_answer(prefill_side, rid, req.tokens[: req.prompt_len])
            if self.pd.faults.crash_after_prefill:
                self.pd.faults.crash_after_prefill = False
                # answered first, then gone: the decode side's pull finds nobody
                asyncio.get_running_loop().call_soon(
                    lambda: asyncio.ensure_future(self.fault(self.engine.config.index, "crash", None))
                )
        choices: list[dict[str, Any]] = []
        for index, req in enumerate(reqs):
            text = "".join(req.output_text)
            if chat:
                choices.append(
                    {
                        "index": index,
                        "message": {"role": "assistant", "content": text, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                )
            else:
                choices.append(
                    {"index": index, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
                )
            choices[-1].update(in_choice)
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                "usage": _usage(reqs),
                **top,
            }
        )

    async def _stream(
        self,
        request: web.Request,
        rid: str,
        reqs: list[SimRequest],
        chat: bool,
        model: str,
        include_usage: bool,
        continuous_usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        sent = [0] * len(reqs)
        done = [False] * len(reqs)
        while True:
            await _any_wakeup([r for r, d in zip(reqs, done, strict=True) if not d])
            parts: list[bytes] = []
            for index, req in enumerate(reqs):
                if done[index] or not req.wakeup.is_set():
                    continue
                req.wakeup.clear()
                if req.aborted:
                    return cut_connection(request, resp)
                new = req.output_text[sent[index] :]
                if not new and not req.finished:
                    continue
                finish = "length" if req.finished else None
                if chat:
                    if sent[index] == 0:
                        parts.append(
                            _sse(
                                {
                                    "id": rid,
                                    "object": obj,
                                    "created": created,
                                    "model": model,
                                    "choices": [
                                        {
                                            "index": index,
                                            "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None,
                                            "finish_reason": None,
                                        }
                                    ],
                                }
                            )
                        )
                    choice: dict[str, Any] = {
                        "index": index,
                        "delta": {"content": "".join(new)},
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                else:
                    choice = {"index": index, "text": "".join(new), "logprobs": None, "finish_reason": finish}
                if finish:
                    choice["stop_reason"] = None
                chunk: dict[str, Any] = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
                if continuous_usage:
                    chunk["usage"] = _usage([req])
                parts.append(_sse(chunk))
                sent[index] += len(new)
                done[index] = req.finished
            finished = all(done)
            if finished:
                if include_usage:
                    parts.append(
                        _sse(
                            {
                                "id": rid,
                                "object": obj,
                                "created": created,
                                "model": model,
                                "choices": [],
                                "usage": _usage(reqs),
                            }
                        )
                    )
                parts.append(b"data: [DONE]\n\n")
            if parts:
                await resp.write(b"".join(parts))
            if finished:
                await resp.write_eof()
                return resp

    # ---- simulator admin ------------------------------------------------------------------------------------
    async def embeddings(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            ids = await self.token_ids(read_embeddings(body))
        except ValueError as exc:
            return error_response(400, str(exc), param=_param(exc, "input"))
        return web.json_response(embeddings_response(self.model, ids))

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

    async def sim_traceparents(self, request: web.Request) -> web.Response:
        return web.json_response(list(self.traceparents))


_COUNT_SLACK = 1
"""Tokens a chunk boundary may add to a count (chunks are cut before a space, where the pre-tokenizer cuts too)."""


def _count_tokens_past(tokenizer: PromptTokenizer, text: str, limit: int) -> int:
    """A lower bound of ``text``'s token count, counted in chunks and no further than past ``limit``: the cost is
    that of ~``limit`` tokens, whatever the text's length. It exceeds ``limit`` only when the text does (each cut
    may count ``_COUNT_SLACK`` tokens too many, and is discounted)."""
    at_least, start = 0, 0
    while start < len(text) and at_least <= limit:
        end = min(len(text), start + COUNT_CHUNK_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + 1, end)
            end = cut if cut > start else end
        at_least += len(tokenizer.encode(text[start:end])) - (_COUNT_SLACK if start else 0)
        start = end
    return at_least


def _param(exc: ValueError, default: str) -> str:
    """The field an error names: a ``SurfaceError``'s own, else the endpoint's prompt field."""
    return exc.param if isinstance(exc, SurfaceError) else default


def _completion_prompt(body: dict[str, Any]) -> SurfaceRequest:
    if body.get("prompt") is None:
        raise PromptError("'prompt' is required: a string, a list of strings, token ids, or a list of token-id lists")
    return read_completions(body)


async def _any_wakeup(reqs: list[SimRequest]) -> None:
    """Until one of ``reqs`` has news. One request (the usual case) costs no task."""
    if len(reqs) == 1:
        await reqs[0].wakeup.wait()
        return
    if any(r.wakeup.is_set() for r in reqs):
        return
    waits = [asyncio.ensure_future(r.wakeup.wait()) for r in reqs]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _usage(reqs: list[SimRequest]) -> dict[str, Any]:
    """Summed over a batch, as vLLM reports it; cached tokens are the last prompt's (vLLM keeps only those)."""
    prompt = sum(r.prompt_len for r in reqs)
    output = sum(r.output_len for r in reqs)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + output,
        "completion_tokens": output,
        "prompt_tokens_details": {"cached_tokens": reqs[-1].cached_tokens or 0},
    }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _scale_out_disabled(_request: web.Request) -> web.Response:
    """vLLM 0.32's answer to a scale-out route (``/render``) on a server started without ``--enable-scale-out``."""
    message = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
    return web.json_response(
        {"error": {"message": message, "type": "PermissionDeniedError", "param": None, "code": 403}}, status=403
    )
