"""Which surface a request path is, and its body read by that surface's rules (one call for every surface)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstate.surfaces.anthropic import read_messages
from kvstate.surfaces.history import ResponseHistory
from kvstate.surfaces.openai import read_chat, read_completions, read_embeddings
from kvstate.surfaces.request import SurfaceError, SurfaceName, SurfaceRequest
from kvstate.surfaces.responses import read_responses
from kvstate.surfaces.template_traits import DEFAULT_TRAITS, TemplateTraits

__all__ = ["COUNT_TOKENS_PATH", "SURFACE_PATHS", "read_surface", "surface_of_path"]

SURFACE_PATHS: dict[str, SurfaceName] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
}
"""The inference paths, by surface (the engines serve each under this path)."""

COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
"""Anthropic's token count: a Messages body without ``max_tokens``, answered by an engine, nothing generated."""


def surface_of_path(path: str) -> SurfaceName | None:
    """The surface of a request path (query string and one trailing slash ignored), None for another path."""
    bare = path.split("?", 1)[0]
    if bare.endswith("/") and len(bare) > 1:
        bare = bare[:-1]
    if bare == COUNT_TOKENS_PATH:
        return "messages"
    return SURFACE_PATHS.get(bare)


def read_surface(
    surface: SurfaceName,
    body: Mapping[str, Any],
    *,
    traits: TemplateTraits = DEFAULT_TRAITS,
    history: ResponseHistory | None = None,
    count_tokens: bool = False,
) -> SurfaceRequest:
    """``body`` read by ``surface``'s rules. ``traits``: the model template's (``template_traits``), which Messages
    requests depend on; ``history``: where Responses find ``previous_response_id``; ``count_tokens``: a Messages
    body of ``/v1/messages/count_tokens``. Raises ``SurfaceError`` naming the field."""
    if not isinstance(body, Mapping):
        raise SurfaceError("the request body must be a JSON object", "body")
    if surface == "chat":
        return read_chat(body)
    if surface == "completions":
        return read_completions(body)
    if surface == "messages":
        return read_messages(body, traits, count_tokens=count_tokens)
    if surface == "responses":
        return read_responses(body, history)
    return read_embeddings(body)
