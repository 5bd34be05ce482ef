"""What the core does when its own placement fails (a bug, not a bad request, not the store being down).

``placement.on_error`` is the operator's choice:

- ``fallback`` (default): the request is still served and still counted, on the eligible endpoint with the least
  work this router knows of (no store read, no prompt keys): a pick as good as least-request, never a silent bypass
  of counting. Shedding needs the predicted TTFT, so a fallback pick is never shed.
- ``reject``: 503 with ``Retry-After``, so nothing reaches an engine the core did not place.

Either way the error is counted (``RouterStats.internal_errors``) and logged with its traceback at most once per
``LOG_INTERVAL_S``, with a count of what was suppressed: a client cannot flood the log with one bad request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cognitora.config import CognitoraConfig
from cognitora.decision import Decision
from cognitora.placement import reject
from cognitora.placement.state import HealthMark
from cognitora.request import RouteRequest
from kvstate.store import InFlight

__all__ = ["RateLimitedLog", "fallback_decision"]

LOG_INTERVAL_S = 60.0
"""At most one traceback per this many seconds per kind of error."""

ERROR_RETRY_AFTER_S = 1


@dataclass
class RateLimitedLog:
    """Logs an error with its traceback (or a warning) once per interval; counts what it kept quiet about in
    between."""

    logger: logging.Logger
    interval_s: float = LOG_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    _next: float = 0.0
    _suppressed: int = 0

    def error(self, message: str, exc: BaseException) -> None:
        self._log(logging.ERROR, message, exc)

    def warning(self, message: str) -> None:
        """A warning without a traceback (a condition, not an exception), on the same schedule."""
        self._log(logging.WARNING, message, None)

    def _log(self, level: int, message: str, exc: BaseException | None) -> None:
        now = self.clock()
        if now < self._next:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more since the last report)" if self._suppressed else ""
        self.logger.log(level, "%s%s", message, more, exc_info=exc)
        self._suppressed = 0
        self._next = now + self.interval_s

    def reset(self) -> None:
        """The condition is over: the next report is logged at once."""
        self._next = 0.0
        self._suppressed = 0


def fallback_decision(
    req: RouteRequest,
    config: CognitoraConfig,
    error: BaseException,
    local: Mapping[str, InFlight],
    marks: Mapping[str, HealthMark],
) -> Decision:
    """The decision ``placement.on_error`` asks for after ``error`` broke the real placement of ``req``."""
    why = f"placement failed ({type(error).__name__}); the error is logged"
    if config.placement.on_error == "reject":
        message = f"{why}: retry shortly, or tell the operator if it persists"
        return _rejected(req, message)
    model = config.model(req.model)
    if model is None:
        return _rejected(req, f"{why}, and model {req.model!r} is not configured")
    allowed: Sequence[str] | None = req.candidates
    eligible = [e.id for e in model.endpoints if (allowed is None or e.id in allowed) and e.id not in marks]
    if not eligible:
        return _rejected(req, f"{why}, and no endpoint is eligible for a fallback pick")
    # Least work first; sorted() is stable, so equal loads keep the configured order.
    chosen, *others = sorted(eligible, key=lambda e: local.get(e, InFlight()).requests)
    endpoint = config.endpoint(chosen)
    return Decision(
        request_id=req.request_id,
        model=req.model,
        endpoint=chosen,
        url=None if endpoint is None else endpoint.url,
        prompt_tokens=0,
        reason=f"{why}: fallback pick, the eligible endpoint with the least work in flight here",
        degraded=True,
        exact_keys=False,
        expected_decode_tokens=req.max_tokens or 0,
        fallbacks=tuple(others),
    )


def _rejected(req: RouteRequest, message: str) -> Decision:
    return reject(req, 503, message, ERROR_RETRY_AFTER_S)
