"""One HTTP request's ext_proc exchange: one method per phase, and one seam into the core (``PlacementCore``).

The phases, in the order Envoy sends them (BUFFERED request body, see examples/envoy.yaml):

1. request headers: note the path and the trusted identity headers; answer "continue" (routing waits for the body).
2. request body: parse, place, answer with the pick (metadata + header) and, when needed, the rewritten body;
   or answer the client directly (400 for a bad body, the core's rejection such as 429).
3. response headers: see who answered and how; tell the core if the pick was unreachable; choose how much of the
   response body to read (``mode_override``: STREAMED for SSE, BUFFERED for JSON, NONE when usage is not wanted).
4. response body: usage, first token, end of stream -> the outcome.

The dispatch is counted in this process at once (``note_dispatch``). Core calls that the response to Envoy does not
depend on (the dispatch's store write, first token, finished, mark unhealthy) run in the background, in order, so
store round trips never sit between Envoy and the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from cognitora.config import DEFAULT_PRIORITY
from cognitora.decision import Decision
from cognitora.request import Outcome, RouteRequest
from envoy_extproc import headers, protocol
from envoy_extproc.lifecycle import PlacedRequest
from envoy_extproc.openai_body import BadRequest, parse_body, rewrite_body
from envoy_extproc.settings import ExtprocSettings
from envoy_extproc.usage import SseUsageScanner, usage_from_json

log = logging.getLogger("cognitora.extproc")

NONE = protocol.BodySendMode.NONE
STREAMED = protocol.BodySendMode.STREAMED
BUFFERED = protocol.BodySendMode.BUFFERED

_REMOVE_FROM_RESPONSE = (headers.RESPONSE_FLAGS,)
# The response-headers answers never vary: built once.
_UNPLACED_RESPONSE = protocol.response_headers(NONE, ())
_READ_NO_BODY = protocol.response_headers(NONE, _REMOVE_FROM_RESPONSE)
_READ_STREAMED_BODY = protocol.response_headers(STREAMED, _REMOVE_FROM_RESPONSE)
_READ_BUFFERED_BODY = protocol.response_headers(BUFFERED, _REMOVE_FROM_RESPONSE)


class PlacementCore(Protocol):
    """What the adapter needs from the decision core (``cognitora.router.Router`` implements it)."""

    async def place(self, request: RouteRequest) -> Decision: ...

    def note_dispatch(self, decision: Decision) -> None: ...

    async def share_dispatch(self, decision: Decision) -> None: ...

    async def first_token(self, decision: Decision) -> None: ...

    async def finished(self, decision: Decision, outcome: Outcome) -> None: ...

    async def mark_unhealthy(self, endpoint: str, reason: str) -> None: ...


class AddressBook:
    """Endpoint ids (the store's names) <-> the literal ``IP:port`` Envoy needs (it resolves no names here).

    Ids without an entry are already literal addresses (the default id of an endpoint is its ``host:port``).
    """

    def __init__(self, addresses: Mapping[str, str]) -> None:
        self.addresses = dict(addresses)
        self._endpoints = {address: endpoint for endpoint, address in self.addresses.items()}

    def address(self, endpoint: str) -> str:
        return self.addresses.get(endpoint, endpoint)

    def endpoint(self, address: str) -> str:
        return self._endpoints.get(address, address)


def fallback_order(decision: Decision, count: int) -> list[str]:
    """The pick, then up to ``count`` runner-ups by predicted TTFT (excluded candidates never)."""
    assert decision.endpoint is not None
    ranked = sorted(
        (c for c in decision.candidates if c.excluded is None and c.endpoint != decision.endpoint),
        key=lambda c: c.predicted_ttft_s,
    )
    return [decision.endpoint, *(c.endpoint for c in ranked[:count])]


class Exchange:
    """The ext_proc side of one HTTP request. Created per gRPC stream; never shared between streams."""

    def __init__(self, core: PlacementCore, settings: ExtprocSettings, addresses: AddressBook) -> None:
        self._core = core
        self._settings = settings
        self._addresses = addresses
        self._path = ""
        self._placeable = False
        self._identity: dict[str, str] = {}
        self._reports: deque[Callable[[], Awaitable[None]]] = deque()
        self._reporter: asyncio.Task[None] | None = None
        self.placed: PlacedRequest | None = None
        self.closed = False
        """An immediate response was sent: Envoy expects nothing more on this stream."""

    # -- phase 1 ----------------------------------------------------------------------------------------------
    async def on_request_headers(self, message: protocol.HttpHeaders) -> protocol.ProcessingResponse:
        wanted = self._settings.trusted.names
        method = ""
        for h in message.headers.headers:
            key = h.key
            if key == headers.PATH:
                self._path = h.raw_value.decode("latin-1").split("?", 1)[0]
            elif key == headers.METHOD:
                method = h.raw_value.decode("latin-1")
            elif key in wanted:
                self._identity[key] = h.raw_value.decode("latin-1")
        self._placeable = method == "POST" and self._path in headers.PLACED_PATHS and not message.end_of_stream
        return protocol.CONTINUE_REQUEST_HEADERS

    # -- phase 2 ----------------------------------------------------------------------------------------------
    async def on_request_body(self, message: protocol.HttpBody) -> protocol.ProcessingResponse:
        if not self._placeable:
            return protocol.CONTINUE_REQUEST_BODY
        raw = message.body
        try:
            parsed = parse_body(raw, self._path)
        except BadRequest as exc:
            self.closed = True
            return protocol.openai_error(
                400, exc.message, error_type="invalid_request_error", param=exc.param, details="cognitora_bad_body"
            )
        trusted, identity = self._settings.trusted, self._identity
        request = RouteRequest(
            model=parsed.model,
            messages=parsed.messages,
            prompt=parsed.prompt,
            tools=parsed.tools,
            add_special_tokens=parsed.add_special_tokens,
            add_generation_prompt=parsed.add_generation_prompt,
            continue_final_message=parsed.continue_final_message,
            chat_template_kwargs=parsed.chat_template_kwargs,
            team=identity.get(trusted.team) or None,
            api_key_id=identity.get(trusted.key) or None,
            user=identity.get(trusted.user) or None,
            priority=identity.get(trusted.priority) or DEFAULT_PRIORITY,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
        )
        try:
            decision = await self._core.place(request)
        except Exception:
            # The core degrades on its own when the store is down; anything else is a bug to log, and the request
            # still flows: Envoy's own load balancer (the fallback policy) picks a host.
            log.exception("placement failed; the request goes on without a pick")
            return protocol.CONTINUE_REQUEST_BODY
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request %s (team %s):\n%s", request.request_id, request.team, decision.explain())
        if decision.rejection is not None:
            self.closed = True
            r = decision.rejection
            return protocol.openai_error(
                r.status,
                r.message,
                error_type="rate_limit_exceeded" if r.status == 429 else "invalid_request_error",
                code=str(r.status),
                retry_after_s=r.retry_after_s,
                details="cognitora_rejected",
            )
        if decision.endpoint is None:
            return protocol.CONTINUE_REQUEST_BODY
        read_stream = parsed.stream and self._settings.usage != "none"
        include_usage = read_stream and not parsed.client_wants_usage
        new_body = rewrite_body(parsed, raw, model=decision.model, include_usage=include_usage)
        placed = PlacedRequest(decision=decision, endpoint=decision.endpoint, stream=parsed.stream)
        if read_stream:
            placed.sse = SseUsageScanner(strip_usage_chunk=include_usage)
        self.placed = placed
        # Counted here at once, so the next request placed sees it; the store write waits for the background.
        self._core.note_dispatch(decision)
        self._defer(lambda: self._core.share_dispatch(decision))
        order = fallback_order(decision, self._settings.fallbacks)
        return protocol.route_to([self._addresses.address(e) for e in order], new_body)

    # -- phase 3 ----------------------------------------------------------------------------------------------
    async def on_response_headers(self, message: protocol.HttpHeaders) -> protocol.ProcessingResponse:
        placed = self.placed
        if placed is None:
            return _UNPLACED_RESPONSE
        status = 0
        content_type = upstream = flags = ""
        attempts = 1
        for h in message.headers.headers:
            key = h.key
            if key == headers.STATUS:
                status = int(h.raw_value or b"0")
            elif key == headers.CONTENT_TYPE:
                content_type = h.raw_value.decode("latin-1")
            elif key == headers.UPSTREAM_HOST:
                upstream = h.raw_value.decode("latin-1")
            elif key == headers.RESPONSE_FLAGS:
                flags = h.raw_value.decode("latin-1")
            elif key == headers.ATTEMPT_COUNT:
                attempts = int(h.raw_value or b"1")
        placed.status = status
        self._note_upstream(placed, upstream, flags, attempts)

        ok = 200 <= status < 300
        if ok and placed.sse is not None and content_type.startswith(headers.SSE_CONTENT_TYPE):
            placed.awaiting_body = True
            return _READ_STREAMED_BODY
        placed.sse = None
        # A non-streamed answer is whole when its headers arrive (the engine sends them last): its first token is
        # not observable, and "finished" (now, or with the body just behind) releases its prefill too, so no
        # separate first-token report (one store write less per request).
        if ok and not placed.stream and self._settings.usage == "all" and headers.JSON_CONTENT_TYPE in content_type:
            placed.awaiting_body = True
            return _READ_BUFFERED_BODY
        placed.complete = True
        if placed.stream:
            self._first_token(placed)  # the body is not read: its headers are the best first-token estimate left
        else:
            self._finish(placed)
        return _READ_NO_BODY

    def _note_upstream(self, placed: PlacedRequest, upstream: str, flags: str, attempts: int) -> None:
        """Tell the core when the pick could not be reached, so it stops picking it at once."""
        picked = placed.endpoint
        if any(flag in headers.UPSTREAM_FAILURE_FLAGS for flag in flags.split(",")):
            placed.error = f"upstream unreachable ({flags})"
            self._defer(lambda: self._core.mark_unhealthy(picked, f"Envoy could not reach it ({flags})"))
            return
        if upstream and upstream != "-":
            served = self._addresses.endpoint(upstream)
            if served != picked:
                placed.endpoint = served
                if attempts > 1:
                    reason = f"unreachable: Envoy retried the request on {served}"
                    self._defer(lambda: self._core.mark_unhealthy(picked, reason))

    # -- phase 4 ----------------------------------------------------------------------------------------------
    async def on_response_body(self, message: protocol.HttpBody) -> protocol.ProcessingResponse:
        placed = self.placed
        if placed is None:
            return protocol.CONTINUE_RESPONSE_BODY
        end = message.end_of_stream
        sse = placed.sse
        if sse is None:  # BUFFERED JSON: the whole body in this one message
            placed.usage = usage_from_json(message.body)
            if end:
                placed.complete = True
                self._finish(placed)
            return protocol.CONTINUE_RESPONSE_BODY
        if message.body:
            self._first_token(placed)
        forward = sse.feed(message.body, end)
        if end:
            placed.usage = sse.usage
            placed.complete = True
            self._finish(placed)
        return protocol.CONTINUE_RESPONSE_BODY if forward is None else protocol.replace_response_chunk(forward)

    # -- lifecycle reporting --------------------------------------------------------------------------------------
    def _first_token(self, placed: PlacedRequest) -> None:
        if placed.first_token_at is None:
            placed.first_token_at = time.monotonic()
            self._defer(lambda: self._core.first_token(placed.decision))

    def _finish(self, placed: PlacedRequest) -> None:
        if not placed.reported:
            placed.reported = True
            outcome = placed.outcome()
            self._defer(lambda: self._core.finished(placed.decision, outcome))

    def _defer(self, call: Callable[[], Awaitable[None]]) -> None:
        """Queue a report to the core. Reports run in order, in the background: the answer to Envoy never waits
        for the store, and "finished" never overtakes "dispatched"."""
        self._reports.append(call)
        if self._reporter is None or self._reporter.done():
            self._reporter = asyncio.create_task(self._report())

    async def _report(self) -> None:
        while self._reports:
            call = self._reports.popleft()
            try:
                await call()
            except Exception:
                log.exception("reporting to the core failed (the request itself is unaffected)")

    async def close(self) -> None:
        """The stream ended: report an unreported request (a client that went away, or an unread body)."""
        placed = self.placed
        if placed is not None and not placed.reported:
            if placed.status is not None and not placed.awaiting_body and placed.error is None:
                placed.complete = True  # the body was deliberately not read (--usage); the stream ended normally
            self._finish(placed)
        if self._reporter is not None:
            await self._reporter
