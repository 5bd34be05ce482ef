"""Request-lifecycle state: what happened to one placed request, from dispatch to its outcome.

Kept apart from the ext_proc protocol (which message comes next, what mode Envoy is in): this is what the core
is told, and it reads the same whatever gateway carried the request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cognitora.decision import Decision
from cognitora.request import Outcome
from envoy_extproc.usage import SseUsageScanner, Usage


@dataclass
class PlacedRequest:
    decision: Decision
    endpoint: str
    """The picked endpoint id (``decision.endpoint``), until Envoy says another one answered."""
    stream: bool
    dispatched_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    status: int | None = None
    usage: Usage | None = None
    sse: SseUsageScanner | None = None
    error: str | None = None
    awaiting_body: bool = False
    """Envoy was asked for the response body (STREAMED or BUFFERED): its end, not the headers, completes the request."""
    complete: bool = False
    """The whole response went through (end of stream seen), as opposed to a client that went away."""
    reported: bool = False

    def outcome(self) -> Outcome:
        ok = self.complete and self.error is None and self.status is not None and 200 <= self.status < 300
        usage = self.usage or Usage()
        error = self.error
        if not ok and error is None:
            error = f"HTTP {self.status}" if self.status is not None and self.status >= 300 else "response incomplete"
        return Outcome(
            request_id=self.decision.request_id,
            endpoint=self.endpoint,
            ok=ok,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.dispatched_at,
            error=None if ok else error,
        )
