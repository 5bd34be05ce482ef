"""Request bodies of every surface: parse and validate once, rewrite only when needed, with the exact new bytes.

Chat and completions bodies are read here by the core's rules (``cognitora.request``); Anthropic Messages, OpenAI
Responses and embeddings by the core's surface reader (``cognitora.surface_entry``): the path decides which.

A malformed body is the client's mistake: ``BadRequest`` carries an OpenAI-style message that says what was wrong,
and the ext_proc answers 400 itself (the request never reaches an engine).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cognitora.identity import Identity
from cognitora.request import InvalidRequest, RouteRequest, Surface, check_body, read_choices, read_max_tokens
from cognitora.surface_entry import SurfaceReader, route_request, surface_under_prefix
from envoy_extproc import headers
from kvstate.surfaces import SurfaceRequest

__all__ = ["BadRequest", "ParsedBody", "parse_body", "rewrite_body"]


class BadRequest(ValueError):
    """The request body cannot be placed. ``param`` names the offending field (OpenAI error shape)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class ParsedBody:
    """The fields placement needs, and the parsed object (kept so a rewrite does not parse again)."""

    data: dict[str, Any]
    model: str
    messages: Sequence[Mapping[str, Any]] | None
    prompt: str | list[Any] | None
    """The completions ``prompt`` as sent (text, texts, token ids or token-id lists): the core reads it."""
    tools: Sequence[Mapping[str, Any]] | None
    add_special_tokens: bool | None
    add_generation_prompt: bool
    continue_final_message: bool
    chat_template_kwargs: Mapping[str, Any] | None
    stream: bool
    max_tokens: int | None
    n: int
    best_of: int | None
    surface: Surface
    client_wants_usage: bool
    """The client asked for ``stream_options.include_usage`` itself (so its usage chunk must reach it)."""
    read: SurfaceRequest | None = None
    """A Messages, Responses or embeddings body as the core's surface reader read it (None: chat, completions)."""

    def route_request(self, identity: Identity | None = None) -> RouteRequest:
        """The core's request for this body; identity comes from the caller (trusted metadata and headers, resolved
        by ``cognitora.identity.resolve_identity``), never the body. None: anonymous."""
        if self.read is not None:
            return route_request(self.read, model=self.model, identity=Identity() if identity is None else identity)
        return RouteRequest(
            model=self.model,
            messages=self.messages,
            prompt=self.prompt,
            tools=self.tools,
            add_special_tokens=self.add_special_tokens,
            add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            chat_template_kwargs=self.chat_template_kwargs,
            max_tokens=self.max_tokens,
            n=self.n,
            best_of=self.best_of,
            surface=self.surface,
            stream=self.stream,
            identity=Identity() if identity is None else identity,
        )


def parse_body(raw: bytes, path: str, reader: SurfaceReader | None = None) -> ParsedBody:
    """Parse a request body of ``path``'s surface. Raises ``BadRequest`` with a message meant for the client.
    ``reader``: the core's surface reader, for Messages, Responses and embeddings (without one they are refused)."""
    if not raw.strip():
        raise BadRequest("the request body is empty: send a JSON object with 'model' and 'messages'")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON ({exc}); send a JSON object") from None
    except RecursionError:
        raise BadRequest("the request body is nested too deeply to parse; send a plain OpenAI request") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, got a JSON {type(data).__name__}")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest('missing \'model\': name the model to use, e.g. "model": "my-model"', param="model")

    surface = surface_under_prefix(path)
    if surface not in ("chat", "completions", None):
        return _parse_surface(data, model, path, reader)
    chat = path.endswith(headers.CHAT_SUFFIX)  # also under a route prefix (/api/v1/chat/completions)
    try:
        check_body(data, chat=chat)  # the core's rules, the same in both gateways
    except InvalidRequest as exc:
        raise BadRequest(exc.message, param=exc.param) from None
    messages: Sequence[Mapping[str, Any]] | None = data["messages"] if chat else None
    prompt: str | list[Any] | None = None if chat else data.get("prompt")
    tools = data.get("tools")
    template_kwargs = data.get("chat_template_kwargs")
    stream = bool(data.get("stream", False))
    try:
        max_tokens = read_max_tokens(data)  # the core's rule (absurd or non-integer values are refused)
        n, best_of = read_choices(data)  # budgets reserve for every sequence generated
    except InvalidRequest as exc:
        raise BadRequest(exc.message, param=exc.param) from None
    options = data.get("stream_options")
    client_wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    return ParsedBody(
        data=data,
        model=model,
        messages=messages,
        prompt=prompt,
        tools=tools,
        add_special_tokens=_flag(data, "add_special_tokens", None),
        add_generation_prompt=bool(_flag(data, "add_generation_prompt", True)),
        continue_final_message=bool(_flag(data, "continue_final_message", False)),
        chat_template_kwargs=template_kwargs,
        stream=stream,
        max_tokens=max_tokens,
        n=n,
        best_of=best_of,
        surface=Surface.CHAT if messages is not None else Surface.COMPLETIONS,
        client_wants_usage=client_wants_usage,
    )


def _parse_surface(data: dict[str, Any], model: str, path: str, reader: SurfaceReader | None) -> ParsedBody:
    """A Messages, Responses or embeddings body, read by the core (``cognitora.surface_entry``)."""
    if reader is None:
        raise BadRequest(f"{path} is not served by this gateway", param=None)
    try:
        read = reader.read(path, data)
    except InvalidRequest as exc:
        raise BadRequest(exc.message, param=exc.param) from None
    assert read is not None  # the path is a surface's (the caller checked)
    chat, completion = read.chat, read.completion
    return ParsedBody(
        data=data,
        model=model,
        messages=None if chat is None else chat.messages,
        prompt=None if completion is None else list(completion.prompts),
        tools=None if chat is None else chat.tools,
        add_special_tokens=read.prompt.add_special_tokens,
        add_generation_prompt=True if chat is None else chat.add_generation_prompt,
        continue_final_message=False if chat is None else chat.continue_final_message,
        chat_template_kwargs=None if chat is None else chat.chat_template_kwargs,
        stream=read.stream,
        max_tokens=read.max_tokens,
        n=1,
        best_of=None,
        surface=Surface(read.surface),
        client_wants_usage=True,  # these surfaces' streams always carry their usage: nothing to ask for or strip
        read=read,
    )


def _flag(data: Mapping[str, Any], name: str, default: bool | None) -> bool | None:
    """One of vLLM's boolean prompt fields (``add_special_tokens``, ...), or ``default`` when absent."""
    value = data.get(name, default)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", param=name)
    return value


_INCLUDE_USAGE_SPLICE = b',"stream_options":{"include_usage":true}}'


def rewrite_body(parsed: ParsedBody, raw: bytes, *, model: str | None, include_usage: bool) -> bytes | None:
    """The body to send upstream, or None when ``raw`` can go unchanged.

    ``model``: a new model name (None keeps it). ``include_usage``: ask the engine for the final usage chunk.
    Adding only ``stream_options`` to a body that has none is a byte splice, not a re-serialisation: long prompts
    are not encoded again on the hot path.
    """
    new_model = model is not None and model != parsed.model
    if not new_model and not include_usage:
        return None
    if not new_model and "stream_options" not in parsed.data:
        body = raw.rstrip()
        if body.endswith(b"}"):  # parse_body proved it is a non-empty object, so a member precedes the brace
            return body[:-1] + _INCLUDE_USAGE_SPLICE
    data = dict(parsed.data)
    if new_model:
        data["model"] = model
    if include_usage:
        options = data.get("stream_options")
        data["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate the client sent escaped ("\\ud800"): send it escaped again
        return json.dumps(data, separators=(",", ":")).encode()
