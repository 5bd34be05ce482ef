"""How an attempt ended (``Outcome``) and what the core learned from it (``AttemptRecord``): a leaf, so that budgets,
burst and telemetry read an attempt's end without importing the lifecycle that produces it
(``cognitora.core.lifecycle``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["UNHEALTHY_STATUSES", "AttemptRecord", "Outcome", "OutcomeKind", "cancelled_stream"]

UNHEALTHY_STATUSES = frozenset({502, 503})
"""An engine (or the proxy in front of it) answering these is not serving: the core stops picking it for a while.
Other 5xx are one request's failure on a live engine."""


class OutcomeKind(StrEnum):
    """How an attempt ended. Adapters map their gateway's signals onto these; the core decides what each means."""

    COMPLETED = "completed"
    """The whole response reached the gateway."""
    CLIENT_CANCELLED = "client_cancelled"
    """The client went away (or the gateway reset the stream) before the response was whole."""
    CONNECT_FAILED = "connect_failed"
    """The endpoint could not be reached: connection refused or reset before a response, no route."""
    TIMEOUT = "timeout"
    """No (complete) answer in time. A slow engine is alive: placement already prices its queue."""
    UPSTREAM_ERROR = "upstream_error"
    """The endpoint answered with a 5xx status."""
    REJECTED = "rejected"
    """The endpoint answered with a 4xx status (a bad request, a context too long): its fault is the request's."""
    REROUTED = "rerouted"
    """The gateway served the request on another endpoint than the pick; a new attempt there carries on."""
    ABANDONED = "abandoned"
    """The gateway never reported this attempt's end (a retry started, or the attempt outlived its lease)."""
    FAILED = "failed"
    """Any other failure the gateway reported."""

    def marks_unhealthy(self, status: int | None) -> bool:
        """Whether an attempt that ended so means its endpoint is gone (the core stops picking it)."""
        if self is OutcomeKind.CONNECT_FAILED:
            return True
        return self is OutcomeKind.UPSTREAM_ERROR and status in UNHEALTHY_STATUSES


@dataclass(frozen=True)
class Outcome:
    """What the gateway saw at an attempt's end. Token counts come from the response's ``usage`` when it had one."""

    kind: OutcomeKind
    status: int | None = None
    """The HTTP status the endpoint answered with, when one came."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Achieved prefix-cache hit, from ``usage.prompt_tokens_details.cached_tokens``."""
    ttft_s: float | None = None
    """Time to first token as the gateway measured it; the attempt's own ``first_token`` timing wins when it has one."""
    detail: str = ""
    """What went wrong, for logs and the health mark's reason (empty when completed)."""
    retry_after_s: float | None = None
    """The answer's ``Retry-After`` (seconds) when it had one (a cloud target's 429: ``cognitora.burst``)."""

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.COMPLETED


@dataclass(frozen=True)
class AttemptRecord:
    """What the router learned from one finished attempt: the prediction beside what was achieved."""

    request_id: str
    model: str
    endpoint: str
    kind: OutcomeKind
    status: int | None
    prompt_tokens: int
    """The response's count when it had one, else the placement's."""
    completion_tokens: int | None
    predicted_cached_tokens: float
    achieved_cached_tokens: int | None
    predicted_ttft_s: float
    achieved_ttft_s: float | None
    runner_up: str | None
    runner_up_predicted_ttft_s: float | None
    finished_at: float
    """Unix time."""


def cancelled_stream(
    *,
    streamed_chunks: int | None,
    usage_completion_tokens: int | None = None,
    prompt_tokens: int | None = None,
    status: int | None = None,
    detail: str,
) -> Outcome:
    """A stream that ended before its end (the client went away, or the stream was reset), counted one way in both
    gateways: the completion tokens the response's ``usage`` reported when it came, else one token per streamed chunk
    (SSE data event): vLLM's default ``stream_interval`` is one token a chunk, and a role-only first chunk makes the
    count one more, never fewer than were sent. The budget settles on this (``cognitora.budgets.gate``); None: the
    gateway could not count (the estimate is settled, never counted short)."""
    completion = usage_completion_tokens if usage_completion_tokens is not None else streamed_chunks
    return Outcome(
        OutcomeKind.CLIENT_CANCELLED,
        status=status,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        detail=detail,
    )
