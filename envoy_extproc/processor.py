"""One HTTP request's ext_proc exchange: one method per phase, and one seam into the core (``PlacementCore``).

The phases, in the order Envoy sends them (BUFFERED request body, see examples/envoy.yaml):

1. request headers: note the path and the trusted identity headers; answer "continue" (routing waits for the body).
2. request body: parse, place and dispatch (``admit``), answer with the pick and its fallbacks (metadata + header)
   and, when needed, the rewritten body; or answer the client directly (400 for a bad body, the core's rejection
   such as 429).
3. response headers: see who answered and how (a retry on a fallback becomes ``Attempt.rerouted``); choose how
   much of the response body to read (``mode_override``: STREAMED for SSE, BUFFERED for JSON, NONE when usage is
   not wanted).
4. response body: usage, first token, end of stream -> the attempt's ``Outcome``.

The request's lifecycle (the dispatch count, first token, finish, health marks, store writes in the background)
is the core's ``Attempt``; this module only translates Envoy's messages onto it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.decision import Decision
from cognitora.identity import Claims, IdentitySource, resolve_identity
from cognitora.request import RouteRequest
from cognitora.stream_usage import StreamUsageReader, stream_usage_reader, usage_from_body
from cognitora.surface_entry import SurfaceReader
from cognitora.tracing import TRACEPARENT, TRACESTATE, UNTRACED, Tracing
from envoy_extproc import headers, protocol
from envoy_extproc.addresses import AddressBook, fallback_order
from envoy_extproc.answers import remember_body, remember_stream
from envoy_extproc.identity_metadata import identity_from_metadata
from envoy_extproc.openai_body import BadRequest, ParsedBody, parse_body, rewrite_body
from envoy_extproc.response import ResponseRead
from envoy_extproc.settings import ExtprocSettings
from envoy_extproc.usage import SseUsageScanner, usage_from_json

__all__ = ["WAIT_MARGIN_S", "Exchange", "PlacedAttempt", "PlacementCore"]

WAIT_MARGIN_S = 2.0
"""Beyond a queued request's ``max_wait_s``, the time its placement and answer may take (the example's
``message_timeout``)."""

log = logging.getLogger("cognitora.extproc")

_TRACE_HEADERS = frozenset({TRACEPARENT, TRACESTATE})

NONE = protocol.BodySendMode.NONE
STREAMED = protocol.BodySendMode.STREAMED
BUFFERED = protocol.BodySendMode.BUFFERED

_REMOVE_FROM_RESPONSE = (headers.RESPONSE_FLAGS,)
# The response-headers answers never vary: built once.
_UNPLACED_RESPONSE = protocol.response_headers(NONE, ())
_READ_NO_BODY = protocol.response_headers(NONE, _REMOVE_FROM_RESPONSE)
_READ_STREAMED_BODY = protocol.response_headers(STREAMED, _REMOVE_FROM_RESPONSE)
_READ_BUFFERED_BODY = protocol.response_headers(BUFFERED, _REMOVE_FROM_RESPONSE)


class PlacedAttempt(Protocol):
    """What the adapter needs of one dispatched request (``cognitora.core.attempt.Attempt`` implements it)."""

    @property
    def endpoint(self) -> str: ...

    def first_token(self) -> None: ...

    def finish(self, outcome: Outcome) -> None: ...

    def rerouted(self, endpoint: str, outcome: Outcome) -> PlacedAttempt: ...

    async def settled(self) -> None: ...


class PlacementCore(Protocol):
    """What the adapter needs from the decision core (``cognitora.core.router.Router`` implements it)."""

    async def admit(
        self, request: RouteRequest, *, on_wait: Callable[[float], Awaitable[None]] | None = None
    ) -> tuple[Decision, PlacedAttempt | None]:
        """``on_wait(max_wait_s)``: awaited when the request starts waiting in the gateway queue."""
        ...


def surface_reader(core: PlacementCore) -> SurfaceReader | None:
    """The core's surface reader (``Router.surfaces``); None for a core without one (a test's stand-in placing
    chat and completions only: other surfaces are then refused with a 400, never placed blind)."""
    reader = getattr(core, "surfaces", None)
    return reader if isinstance(reader, SurfaceReader) else None


class Exchange:
    """The ext_proc side of one HTTP request. Created per gRPC stream; never shared between streams."""

    def __init__(
        self,
        core: PlacementCore,
        settings: ExtprocSettings,
        addresses: AddressBook,
        tracing: Tracing | None = None,
        send: Callable[[protocol.ProcessingResponse], Awaitable[None]] | None = None,
    ) -> None:
        """``send``: writes a message on the stream ahead of the phase's answer (the message-timeout extension)."""
        self._core = core
        self._send = send
        self._settings = settings
        self._addresses = addresses
        self._tracing = tracing or UNTRACED
        self._trace: dict[str, str] = {}
        """The request's W3C ``traceparent``/``tracestate`` (the gateway's span, or the client's)."""
        self._path = ""
        self._placeable = False
        self._identity: dict[str, str] = {}
        self._verified: dict[str, str] = {}
        """Identity from Envoy's dynamic metadata (jwt_authn, ext_authz): read before the headers."""
        self.attempt: PlacedAttempt | None = None
        self.response: ResponseRead | None = None
        self._parsed: ParsedBody | None = None
        """The placed request's body as read (its surface decides how the answer is read)."""
        self._served_model: str | None = None
        """The model that serves the request, when the core's ``intent`` policy decided it (a response header)."""
        self._cloud_fallbacks: frozenset[str] = frozenset()
        """On a burst: the local engines Envoy may retry a failed cloud request on."""
        self._local_model: str | None = None
        """On a burst of a rewritten request: the local model, which serves it if the cloud fails."""
        self.closed = False
        """An immediate response was sent: Envoy expects nothing more on this stream."""
        self._forwardable = False
        """Envoy has received our answer to the request body (where to send it): before that it cannot have sent
        the request anywhere (its ext_proc ``message_timeout`` answers the client 503 itself)."""

    # -- phase 1 ----------------------------------------------------------------------------------------------
    def note_metadata(self, metadata_context: object) -> None:
        """The dynamic metadata Envoy forwarded with the request headers (``identity_metadata``)."""
        self._verified = identity_from_metadata(metadata_context)

    async def on_request_headers(self, message: protocol.HttpHeaders) -> protocol.ProcessingResponse:
        wanted = self._settings.trusted.names
        method = ""
        forged: list[str] = []
        for h in message.headers.headers:
            key = h.key
            if key in headers.CLIENT_FORBIDDEN:
                forged.append(key)
            elif key == headers.PATH:
                self._path = h.raw_value.decode("latin-1").split("?", 1)[0]
            elif key == headers.METHOD:
                method = h.raw_value.decode("latin-1")
            elif key in wanted:
                self._identity[key] = h.raw_value.decode("latin-1")
            elif key in _TRACE_HEADERS:
                self._trace[key] = h.raw_value.decode("latin-1")
        placed = method == "POST" and self._settings.placed(self._path)
        if placed and message.end_of_stream:
            # A POST without a body would reach an engine unplaced (nothing to place it on): refused here.
            self.closed = True
            return protocol.openai_error(
                400,
                "the request has no body: send the JSON body of the request (model, messages or prompt)",
                error_type="invalid_request_error",
                code="400",
                details="cognitora_bad_body",
            )
        self._placeable = placed
        if forged:  # a client naming the prefill engine would make a decode sidecar fetch from anywhere
            return protocol.remove_request_headers(forged)
        return protocol.CONTINUE_REQUEST_HEADERS

    # -- phase 2 ----------------------------------------------------------------------------------------------
    async def on_request_body(self, message: protocol.HttpBody) -> protocol.ProcessingResponse:
        if not self._placeable:
            return protocol.CONTINUE_REQUEST_BODY
        raw = message.body
        try:
            parsed = parse_body(raw, self._path, surface_reader(self._core))
        except BadRequest as exc:
            self.closed = True
            return protocol.openai_error(
                400, exc.message, error_type="invalid_request_error", param=exc.param, details="cognitora_bad_body"
            )
        trusted, headed, verified = self._settings.trusted, self._identity, self._verified
        # The two trusted sources as they are; which wins is the core's rule (cognitora.identity).
        identity = resolve_identity(
            Claims(
                IdentitySource.ENVOY_METADATA,
                team=verified.get("team"),
                key=verified.get("key"),
                user=verified.get("user"),
                priority=verified.get("priority"),
            ),
            Claims(
                IdentitySource.ENVOY_HEADER,
                team=headed.get(trusted.team),
                key=headed.get(trusted.key),
                user=headed.get(trusted.user),
                priority=headed.get(trusted.priority),
                intent_hint=headed.get(trusted.intent),
            ),
        )
        request = parsed.route_request(identity)
        # The core answers every failure of its own (store down: degraded; a placement bug: placement.on_error), so
        # an exception here is not caught: the service answers this phase with a 503 (server.py), never unplaced.
        with self._tracing.decision(request, self._trace.get(TRACEPARENT), self._trace.get(TRACESTATE)) as span:
            decision, attempt = await self._core.admit(request, on_wait=self._waiting)
            span.record(decision)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request %s (team %s):\n%s", request.request_id, request.identity.team, decision.explain())
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
        if attempt is None or decision.endpoint is None:
            raise RuntimeError(f"the core placed request {request.request_id} nowhere and rejected nothing")
        read_stream = parsed.stream and self._settings.usage != "none"
        include_usage = read_stream and not parsed.client_wants_usage
        response = ResponseRead(stream=parsed.stream)
        if read_stream:
            response.sse = (
                SseUsageScanner(strip_usage_chunk=include_usage)
                if parsed.read is None
                else stream_usage_reader(parsed.read.surface)  # Messages, Responses: the core's stream readers
            )
        self.attempt, self.response, self._parsed = attempt, response, parsed
        if decision.rewrite is not None:
            self._served_model = decision.model
        cloud = decision.cloud
        if cloud is not None:
            if self._served_model is not None:
                # The cloud answers under its own name; a local retry of a failed cloud request under the local one.
                self._served_model, self._local_model = cloud.model, decision.model
            body = rewrite_body(parsed, raw, model=cloud.model, include_usage=include_usage)
            local = [self._addresses.address(e) for e in cloud.local_fallbacks[: self._settings.fallbacks + 1]]
            self._cloud_fallbacks = frozenset(cloud.local_fallbacks)
            api_key = self._addresses.cloud_keys.get(cloud.target)
            return protocol.route_to_cloud(cloud.target, api_key, local, body or raw)
        new_body = rewrite_body(parsed, raw, model=decision.model, include_usage=include_usage)
        order = fallback_order(decision, self._settings.fallbacks)
        leg = decision.prefill
        split = () if leg is None else ((headers.PREFILL_ENDPOINT, leg.url),)
        # The engine continues the trace from the decision's span (cognitora.tracing); untraced: nothing set.
        traced = tuple(span.engine_headers().items())
        return protocol.route_to([self._addresses.address(e) for e in order], new_body, split + traced)

    async def _waiting(self, max_wait_s: float) -> None:
        """The request waits in the gateway queue up to ``max_wait_s``: Envoy's per-message timeout (2 s in the
        example) is extended to cover it, up to the filter's ``max_message_timeout`` (docs/flow_control.md)."""
        if self._send is not None:
            await self._send(protocol.extend_message_timeout(max_wait_s + WAIT_MARGIN_S))

    # -- phase 3 ----------------------------------------------------------------------------------------------
    async def on_response_headers(self, message: protocol.HttpHeaders) -> protocol.ProcessingResponse:
        answer = await self._on_response_headers(message)
        if self._served_model is not None and answer.HasField("response_headers"):
            answer = protocol.with_response_header(answer, headers.SERVED_MODEL, self._served_model)
        return answer

    async def _on_response_headers(self, message: protocol.HttpHeaders) -> protocol.ProcessingResponse:
        attempt, response = self.attempt, self.response
        if attempt is None or response is None:
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
        response.status = status
        response.flags = frozenset(f for f in flags.split(",") if f and f != "-")
        if response.unreachable():
            # Envoy answers the client itself (503): the attempt is over, and the core marks the pick.
            response.complete = True
            self._finish()
            return _READ_NO_BODY
        self._note_reroute(upstream, attempts)

        ok = 200 <= status < 300
        if ok and response.sse is not None and content_type.startswith(headers.SSE_CONTENT_TYPE):
            response.awaiting_body = True
            return _READ_STREAMED_BODY
        response.sse = None
        # A non-streamed answer is whole when its headers arrive (the engine sends them last): its first token is
        # not observable, and the finish (now, or with the body just behind) releases its prefill too.
        if ok and not response.stream and self._settings.usage == "all" and headers.JSON_CONTENT_TYPE in content_type:
            response.awaiting_body = True
            return _READ_BUFFERED_BODY
        response.complete = True
        if response.stream and ok:
            self._first_token()  # the body is not read: its headers are the best first-token estimate left
        else:
            self._finish()
        return _READ_NO_BODY

    def _note_reroute(self, upstream: str, attempts: int) -> None:
        """Envoy served the request on another address than the pick (it retried on a fallback)."""
        attempt = self.attempt
        if attempt is None or not upstream or upstream == "-":
            return
        served = self._addresses.endpoint(upstream)
        if served == attempt.endpoint:
            return
        if self._cloud_fallbacks:
            if served in self._cloud_fallbacks:  # the cloud failed before answering; Envoy retried locally
                self._cloud_fallbacks = frozenset()
                if self._local_model is not None:
                    self._served_model = self._local_model
                failed = Outcome(OutcomeKind.UPSTREAM_ERROR, status=503, detail=f"Envoy retried on {served}")
                self.attempt = attempt.rerouted(served, failed)
            return  # the cloud's own address (resolved by Envoy): not a reroute
        if attempts > 1:
            failed = Outcome(OutcomeKind.CONNECT_FAILED, detail=f"unreachable: Envoy retried the request on {served}")
        else:
            failed = Outcome(OutcomeKind.REROUTED, detail=f"Envoy sent the request to {served}")
        self.attempt = attempt.rerouted(served, failed)

    # -- phase 4 ----------------------------------------------------------------------------------------------
    async def on_response_body(self, message: protocol.HttpBody) -> protocol.ProcessingResponse:
        response = self.response
        if self.attempt is None or response is None:
            return protocol.CONTINUE_RESPONSE_BODY
        end = message.end_of_stream
        sse = response.sse
        read = self._parsed.read if self._parsed is not None else None
        if sse is None:  # BUFFERED JSON: the whole body in this one message
            if read is None:
                response.usage = usage_from_json(message.body)
            else:
                response.usage = usage_from_body(read.surface, message.body)
                self._remember(message.body, None)
            if end:
                response.complete = True
                self._finish()
            return protocol.CONTINUE_RESPONSE_BODY
        if isinstance(sse, StreamUsageReader):
            # The surface's own first-token event: a Responses stream's first bytes come before the prefill.
            forward = sse.feed(message.body, end)
            if sse.first_token:
                self._first_token()
        else:
            if message.body:
                self._first_token()
            forward = sse.feed(message.body, end)
        if end:
            response.usage = sse.usage
            response.complete = True
            self._remember(None, sse)
            self._finish()
        return protocol.CONTINUE_RESPONSE_BODY if forward is None else protocol.replace_response_chunk(forward)

    def _remember(self, body: bytes | None, sse: SseUsageScanner | StreamUsageReader | None) -> None:
        """A Responses answer, for a follow-up's ``previous_response_id`` (``envoy_extproc.answers``)."""
        reader = surface_reader(self._core)
        parsed, attempt = self._parsed, self.attempt
        if reader is None or parsed is None or parsed.read is None or attempt is None:
            return
        if parsed.read.surface != "responses":
            return
        if body is not None:
            remember_body(reader, parsed.read, attempt.endpoint, body)
        elif sse is not None:
            remember_stream(reader, parsed.read, attempt.endpoint, sse)

    # -- onto the attempt -------------------------------------------------------------------------------------
    def _first_token(self) -> None:
        if self.attempt is not None:
            self.attempt.first_token()

    def _finish(self) -> None:
        if self.attempt is not None and self.response is not None:
            self.attempt.finish(self.response.outcome())

    def delivered(self) -> None:
        """The answer to the latest message reached the stream (``server.py`` calls this after each write)."""
        if self.attempt is not None:
            self._forwardable = True

    async def close(self) -> None:
        """The stream ended: finish an unfinished attempt (a client that went away, or an unread body), and let
        its store writes land. A decision that never reached Envoy (it gave up first: its message timeout under
        load, or the client left) sent nothing to an engine: finished as not served, so its budget reservation
        is given back, not charged at its estimate."""
        attempt, response = self.attempt, self.response
        if attempt is None or response is None:
            return
        if response.status is None and not self._forwardable:
            attempt.finish(Outcome(OutcomeKind.FAILED, detail="Envoy never received the decision: never forwarded"))
            await attempt.settled()
            return
        if response.status is not None and not response.awaiting_body:
            response.complete = True  # the body was deliberately not read (--usage); the stream ended normally
        self._finish()
        await attempt.settled()
