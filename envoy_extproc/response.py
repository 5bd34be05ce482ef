"""What the adapter reads of one response (status, Envoy's flags, usage, whether it ended) and the ``Outcome`` it
makes of it. Translation only: what an outcome means for the endpoint is the core's call
(``cognitora.core.outcome``)."""

from __future__ import annotations

from dataclasses import dataclass

from cognitora.core.outcome import Outcome, OutcomeKind, cancelled_stream
from cognitora.stream_usage import StreamUsageReader
from cognitora.stream_usage import Usage as SurfaceUsage
from envoy_extproc import headers
from envoy_extproc.usage import SseUsageScanner, Usage

__all__ = ["ResponseRead"]

TIMEOUT_FLAGS = frozenset({"UT"})
"""``%RESPONSE_FLAGS%`` for an upstream request timeout: the engine is alive, only slow."""


@dataclass
class ResponseRead:
    """The response as the adapter has seen it so far."""

    stream: bool
    """The client asked for a stream."""
    sse: SseUsageScanner | StreamUsageReader | None = None
    """Reads usage out of the SSE stream (set when the stream's body is read): the chat scanner, or the core's
    reader of an Anthropic Messages or Responses stream (``cognitora.stream_usage``)."""
    status: int | None = None
    flags: frozenset[str] = frozenset()
    usage: Usage | SurfaceUsage | None = None
    awaiting_body: bool = False
    """Envoy was asked for the response body (STREAMED or BUFFERED): its end, not the headers, completes it."""
    complete: bool = False
    """The whole response went through (end of stream seen), as opposed to a client that went away."""

    def unreachable(self) -> bool:
        """Envoy's flags say the engine could not be reached (as opposed to an answer from it)."""
        return bool(self.flags & headers.UPSTREAM_FAILURE_FLAGS)

    def outcome(self) -> Outcome:
        usage: Usage | SurfaceUsage = self.usage or Usage()
        status = self.status
        flags = ",".join(sorted(self.flags))
        if self.unreachable():
            return Outcome(OutcomeKind.CONNECT_FAILED, status=status, detail=f"Envoy could not reach it ({flags})")
        if self.flags & TIMEOUT_FLAGS:
            return Outcome(OutcomeKind.TIMEOUT, status=status, detail=f"upstream timeout ({flags})")
        if status is None:
            return Outcome(OutcomeKind.CLIENT_CANCELLED, detail="the stream ended before any response")
        if status >= 500:
            return Outcome(OutcomeKind.UPSTREAM_ERROR, status=status, detail=f"HTTP {status}")
        if status >= 300:
            return Outcome(OutcomeKind.REJECTED, status=status, detail=f"HTTP {status}")
        if not self.complete:
            return cancelled_stream(  # what reached the client, counted by the core's rule
                streamed_chunks=self.sse.data_events if self.sse else None,
                usage_completion_tokens=self.usage.completion_tokens if self.usage else None,
                prompt_tokens=self.usage.prompt_tokens if self.usage else None,
                status=status,
                detail="the response ended before its end of stream (client gone or stream reset)",
            )
        return Outcome(
            OutcomeKind.COMPLETED,
            status=status,
            prompt_tokens=usage.prompt_tokens if self.usage else None,
            completion_tokens=usage.completion_tokens if self.usage else None,
            cached_tokens=usage.cached_tokens,
        )
