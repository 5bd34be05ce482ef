"""LiteLLM's responses and errors -> the core's ``Outcome``, and the core's ``Rejection`` -> LiteLLM's error.

Pure functions, no LiteLLM state: each reads what LiteLLM hands a callback (or the core's refusal) and returns the
other side's type. What an outcome means for the engine is the core's call (``OutcomeKind.marks_unhealthy``).
"""

from __future__ import annotations

import asyncio
import datetime
import math
from collections.abc import Mapping
from typing import Any

import litellm

from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.decision import Rejection
from cognitora.stream_usage import usage_from_object
from kvstate.surfaces import SurfaceName

__all__ = ["CONNECTION_ERROR_TEXT", "failure_outcome", "rejection_error", "success_outcome"]

CONNECTION_ERROR_TEXT = "Connection error"
"""What the OpenAI client says when it cannot reach a server (refused, reset); LiteLLM keeps it in the message."""


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    return None


def _ttft_s(kwargs: Mapping[str, Any]) -> float | None:
    start = kwargs.get("api_call_start_time")
    first = kwargs.get("completion_start_time")
    if isinstance(start, datetime.datetime) and isinstance(first, datetime.datetime):
        try:
            seconds = (first - start).total_seconds()
        except TypeError:  # one naive, one aware: no TTFT rather than a failed callback
            return None
        return seconds if seconds >= 0 else None
    return None


def success_outcome(kwargs: Mapping[str, Any], response: Any) -> Outcome:
    """A finished request: usage from the response (streamed: the assembled one), achieved cache hit included."""
    usage = _get(response, "usage")
    logged = kwargs.get("standard_logging_object")
    prompt_tokens = _int_or_none(_get(usage, "prompt_tokens"))
    completion_tokens = _int_or_none(_get(usage, "completion_tokens"))
    details = _get(usage, "prompt_tokens_details")
    cached = _int_or_none(_get(details, "cached_tokens")) if details is not None else None
    if prompt_tokens is None and _get(usage, "input_tokens") is not None:
        # An Anthropic Messages or Responses answer: the core's reading of each surface's usage fields
        surface: SurfaceName = "messages" if _get(response, "type") == "message" else "responses"
        dumped = usage.model_dump() if hasattr(usage, "model_dump") else usage
        read = usage_from_object(surface, dumped)
        if read is not None:
            prompt_tokens, completion_tokens, cached = read.prompt_tokens, read.completion_tokens, read.cached_tokens
    if prompt_tokens is None and isinstance(logged, Mapping):
        prompt_tokens = _int_or_none(logged.get("prompt_tokens"))
        completion_tokens = _int_or_none(logged.get("completion_tokens"))
    return Outcome(
        OutcomeKind.COMPLETED,
        status=200,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached,
        ttft_s=_ttft_s(kwargs),
    )


def failure_outcome(error: BaseException | str | None) -> Outcome:
    """How an attempt that raised ``error`` ended, in the core's terms (what that means for the engine is the
    core's call: ``OutcomeKind.marks_unhealthy``)."""
    if error is None or isinstance(error, str):
        return Outcome(OutcomeKind.FAILED, detail=(error or "request failed")[:500])
    detail = f"{type(error).__name__}: {str(error)[:400]}"
    status = _int_or_none(getattr(error, "status_code", None))
    kind = OutcomeKind.FAILED
    if isinstance(error, asyncio.CancelledError):
        kind = OutcomeKind.CLIENT_CANCELLED
    elif isinstance(error, litellm.Timeout):
        kind = OutcomeKind.TIMEOUT
    elif isinstance(error, litellm.APIConnectionError) or (
        # LiteLLM 1.108 wraps the OpenAI client's APIConnectionError (refused, reset, DNS) for OpenAI-compatible
        # engines as InternalServerError; the client's own message is the only mark left of it.
        isinstance(error, litellm.InternalServerError) and CONNECTION_ERROR_TEXT in str(error)
    ):
        kind, status = OutcomeKind.CONNECT_FAILED, None
    elif isinstance(error, litellm.ServiceUnavailableError):
        kind, status = OutcomeKind.UPSTREAM_ERROR, 503
    elif isinstance(error, litellm.BadGatewayError):
        kind, status = OutcomeKind.UPSTREAM_ERROR, 502
    elif status is not None and status >= 500:
        kind = OutcomeKind.UPSTREAM_ERROR
    elif status is not None and status >= 400:
        kind = OutcomeKind.REJECTED
    return Outcome(kind, status=status, detail=detail, retry_after_s=_retry_after(error))


def _retry_after(error: BaseException) -> float | None:
    """The ``Retry-After`` (seconds) of the answer behind ``error`` (a provider's 429), when it had one."""
    response = getattr(error, "response", None)
    for headers in (getattr(error, "litellm_response_headers", None), getattr(response, "headers", None)):
        value = headers.get("retry-after") if headers is not None and hasattr(headers, "get") else None
        if value is not None:
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                continue  # an HTTP date: the target's default hold-off applies
            if math.isfinite(seconds) and seconds >= 0:
                return seconds
    return None


# -- Rejection -> LiteLLM's error ------------------------------------------------------------------------------


def rejection_error(rejection: Rejection, model: str) -> Exception:
    """The LiteLLM exception whose HTTP status is the rejection's, so the proxy answers with that status.

    ``num_retries=0``: a refusal is the core's answer for this request, not a flaky deployment to retry.
    """
    message = f"cognitora: {rejection.message}"
    status = rejection.status
    error: Exception
    if status == 429:
        headers = {"retry-after": str(rejection.retry_after_s)} if rejection.retry_after_s is not None else None
        error = litellm.RateLimitError(
            message=message,
            llm_provider="cognitora",
            model=model,
            num_retries=0,
            category="litellm_rate_limit",
            headers=headers,
        )
    elif status == 404:
        error = litellm.NotFoundError(message=message, model=model, llm_provider="cognitora")
    elif status == 400:
        error = litellm.BadRequestError(message=message, model=model, llm_provider="cognitora")
    elif status == 503:
        error = litellm.ServiceUnavailableError(message=message, model=model, llm_provider="cognitora")
    else:
        error = litellm.APIError(status_code=status, message=message, llm_provider="cognitora", model=model)
    error.num_retries = 0
    return error
