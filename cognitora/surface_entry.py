"""The one entry point from a request's path and body to the core's request, whatever API it came through.

    reader = router.surfaces                       # one per core: template traits per model, Responses history
    read = reader.read(path, body)                 # SurfaceRequest, None for a path no surface serves
    request = route_request(read, identity=...)    # RouteRequest: placed, budgeted, rewritten like chat

Adapters never decide a surface: the path does (``kvstate.surfaces.surface_of_path``), and the body is read with
that surface's rules (``kvstate.surfaces.read_surface``, vLLM's own conversion, docs/surfaces.md). A body those rules
cannot read raises ``InvalidRequest`` naming the field (the client's 400), never anything else: a request is never
placed blind.

A Responses answer is remembered (``remember_response``) with the endpoint that served it: a follow-up naming it as
``previous_response_id`` is keyed with the whole conversation and pinned to that engine, the only one holding it
(vLLM keeps stored responses in the memory of the server that answered).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cognitora.request import MAX_TOKENS_LIMIT, InvalidRequest, RouteRequest, Surface
from kvstate.prompt import ChatPrompt, PromptKeyer
from kvstate.surfaces import (
    COUNT_TOKENS_PATH,
    DEFAULT_TRAITS,
    ResponseHistory,
    SurfaceError,
    SurfaceName,
    SurfaceRequest,
    TemplateTraits,
    read_surface,
    surface_of_path,
    template_traits,
)
from kvstate.surfaces.history import DEFAULT_HISTORY_BYTES

__all__ = ["SurfaceReader", "is_count_tokens", "route_request", "surface_under_prefix"]


def is_count_tokens(path: str) -> bool:
    """``/v1/messages/count_tokens`` (query string and a trailing slash ignored): answered by an engine, unplaced."""
    bare = path.split("?", 1)[0].rstrip("/")
    return bare.endswith(COUNT_TOKENS_PATH)


class SurfaceReader:
    """Reads request bodies by their path's surface, with each model's template traits and the Responses history."""

    def __init__(self, keyers: Mapping[str, PromptKeyer], history_bytes: int = DEFAULT_HISTORY_BYTES) -> None:
        self._keyers = keyers
        self._traits: dict[str, TemplateTraits] = {}
        self.history = ResponseHistory(history_bytes)
        """Responses answers seen by this gateway process (``kvstate.surfaces.history``)."""

    def traits(self, model: str) -> TemplateTraits:
        """The chat template traits Messages requests depend on, for ``model`` (the defaults for a model without a
        tokenizer, or one the config does not name: placement then refuses it as unknown)."""
        found = self._traits.get(model)
        if found is None:
            keyer = self._keyers.get(model)
            tokenizer = getattr(keyer, "tokenizer", None) if keyer is not None else None
            found = DEFAULT_TRAITS if tokenizer is None else template_traits(getattr(tokenizer, "template", None))
            self._traits[model] = found
        return found

    def read(self, path: str, body: Any, *, model: str | None = None) -> SurfaceRequest | None:
        """``body`` read by the rules of ``path``'s surface (a route prefix before ``/v1/...`` allowed); None when
        ``path`` is no surface's. ``model``: the model whose template renders it when the gateway chose it (LiteLLM's
        model group), else the body's. Raises ``InvalidRequest`` naming the field."""
        surface = surface_under_prefix(path)
        if surface is None:
            return None
        if not isinstance(body, Mapping):
            raise InvalidRequest("the request body must be a JSON object", "body")
        if model is None:
            named = body.get("model")
            if not isinstance(named, str) or not named:
                raise InvalidRequest('missing \'model\': name the model to use, e.g. "model": "my-model"', "model")
            model = named
        try:
            read = read_surface(
                surface,
                body,
                traits=self.traits(model),
                history=self.history,
                count_tokens=is_count_tokens(path),
            )
        except SurfaceError as exc:
            raise InvalidRequest(exc.message, exc.param) from None
        except RecursionError:
            raise InvalidRequest("the request body is nested too deeply to read", "body") from None
        if read.max_tokens is not None and read.max_tokens > MAX_TOKENS_LIMIT:
            name = read.max_tokens_field or "max_tokens"
            raise InvalidRequest(
                f"'{name}' is {read.max_tokens}: more than any model's context window (at most "
                f"{MAX_TOKENS_LIMIT:,} tokens here); ask for fewer",
                name,
            )
        return read

    def remember_response(
        self, read: SurfaceRequest, response_id: str | None, output_texts: Sequence[str], endpoint: str | None
    ) -> None:
        """A Responses answer as it passed: a later ``previous_response_id`` naming it continues on ``endpoint``."""
        if read.surface != "responses" or not response_id or not isinstance(read.prompt, ChatPrompt):
            return
        self.history.remember(response_id, read.prompt.messages, output_texts, endpoint)


_SUFFIXES: tuple[tuple[str, SurfaceName], ...] = (
    ("/chat/completions", "chat"),
    ("/completions", "completions"),
    (COUNT_TOKENS_PATH.removeprefix("/v1"), "messages"),
    ("/messages", "messages"),
    ("/responses", "responses"),
    ("/embeddings", "embeddings"),
)
"""A path's surface by its ending, so a route prefix (``/api/v1/messages``) or an operator's own placed path
(``--placed-path /llm/responses``) reads as the engines' path does."""


def surface_under_prefix(path: str) -> SurfaceName | None:
    """``path``'s surface (query string and a trailing slash ignored), also under a route prefix; None: none."""
    bare = path.split("?", 1)[0]
    if bare.endswith("/") and len(bare) > 1:
        bare = bare[:-1]
    found = surface_of_path(bare)
    if found is not None:
        return found
    for suffix, surface in _SUFFIXES:
        if bare.endswith(suffix):
            return surface
    return None


def route_request(read: SurfaceRequest, **fields: Any) -> RouteRequest:
    """The core's request for ``read``: its prompt fields, surface, output cap and stream flag, plus ``fields``
    (identity, candidates, ... as each adapter knows them; ``model`` defaults to the body's). A Responses
    continuation whose earlier answer this gateway saw is pinned to the engine that holds it."""
    chat = read.chat
    completion = read.completion
    prompts: list[Any] | None = None if completion is None else list(completion.prompts)
    fields.setdefault("model", read.model)
    if read.previous_endpoint is not None:
        fields.setdefault("pinned_endpoint", read.previous_endpoint)
        fields.setdefault("may_pin", True)  # our own record of who answered, not the client's word
    return RouteRequest(
        messages=None if chat is None else chat.messages,
        prompt=prompts,
        tools=None if chat is None else chat.tools,
        add_special_tokens=read.prompt.add_special_tokens,
        add_generation_prompt=True if chat is None else chat.add_generation_prompt,
        continue_final_message=False if chat is None else chat.continue_final_message,
        chat_template_kwargs=None if chat is None else chat.chat_template_kwargs,
        max_tokens=read.max_tokens,
        surface=Surface(read.surface),
        stream=read.stream,
        surface_request=read,
        **fields,
    )
