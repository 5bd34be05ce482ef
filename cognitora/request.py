"""What the adapters hand the core: a ``RouteRequest`` (its end comes back as a ``cognitora.attempt.Outcome``)."""

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

    The prompt fields are the client's, untouched: the core reads them once, with the engine's rules
    (``kvstate.prompt``), whichever gateway they came through. ``model`` may name a LoRA adapter (the config's
    ``models[].loras``), as it does for vLLM.
    """

    model: str
    messages: Sequence[Mapping[str, Any]] | None = None
    """A chat's ``messages``; None for a completions request."""
    prompt: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | None = None
    """A completions ``prompt``: text, a batch of texts, token ids, or a batch of token-id lists."""
    tools: Sequence[Mapping[str, Any]] | None = None
    """A chat's ``tools``: the chat template renders them into the prompt."""
    add_special_tokens: bool | None = None
    """vLLM's field; None: the endpoint's default (chat: no, the template adds BOS; completions: yes)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Mapping[str, Any] | None = None
    """Extra variables for the chat template (vLLM's field, e.g. ``{"enable_thinking": false}``)."""
    request_id: str = field(default_factory=new_request_id)
    team: str | None = None
    api_key_id: str | None = None
    user: str | None = None
    priority: str = "default"
    max_tokens: int | None = None
    stream: bool = False
    candidates: Sequence[str] | None = None
    pinned_endpoint: str | None = None
    """The endpoint the client named (LiteLLM: a deployment id as ``model``). Honoured only with ``may_pin``;
    otherwise the request is placed like any other of its model (a client never skips placement or shedding)."""
    may_pin: bool = False
    """A trusted source (an admin-set key flag) lets this request's ``pinned_endpoint`` decide."""
