"""What the adapters hand the core: a ``RouteRequest`` in, an ``Outcome`` back when the response is done."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class RouteRequest:
    """One inference request, as the gateway saw it, after authentication.

    ``team``/``api_key_id``/``user`` come only from a trusted source (LiteLLM's authenticated key, or a header the
    Envoy config sets after authentication), never from the client's body.
    ``candidates``: endpoint ids the gateway allows for this request (LiteLLM's healthy deployments); None means
    every configured endpoint of the model.
    """

    model: str
    messages: Sequence[Mapping[str, Any]] | None = None
    prompt: str | None = None
    request_id: str = field(default_factory=new_request_id)
    team: str | None = None
    api_key_id: str | None = None
    user: str | None = None
    priority: str = "default"
    max_tokens: int | None = None
    stream: bool = False
    candidates: Sequence[str] | None = None


@dataclass(frozen=True)
class Outcome:
    """What came back for a placed request: the adapter reports it once, at the end (success or failure)."""

    request_id: str
    endpoint: str
    ok: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """Achieved prefix-cache hit, from ``usage.prompt_tokens_details.cached_tokens``."""
    ttft_s: float | None = None
    error: str | None = None
