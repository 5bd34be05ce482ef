"""OpenAI request bodies: parse and validate once, rewrite only when needed, with the exact new bytes.

A malformed body is the client's mistake: ``BadRequest`` carries an OpenAI-style message that says what was wrong,
and the ext_proc answers 400 itself (the request never reaches an engine).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cognitora.config import DEFAULT_PRIORITY
from cognitora.request import InvalidRequest, RouteRequest, Surface, read_choices, read_max_tokens
from envoy_extproc import headers
from kvstate.prompt import PromptError, completion_prompts


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

    def route_request(
        self,
        *,
        team: str | None = None,
        api_key_id: str | None = None,
        user: str | None = None,
        priority: str = DEFAULT_PRIORITY,
        intent_hint: str | None = None,
    ) -> RouteRequest:
        """The core's request for this body; identity comes from the caller (trusted headers), never the body."""
        return RouteRequest(
            model=self.model,
            messages=self.messages,
            prompt=self.prompt,
            tools=self.tools,
            add_special_tokens=self.add_special_tokens,
            add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            chat_template_kwargs=self.chat_template_kwargs,
            team=team,
            api_key_id=api_key_id,
            user=user,
            priority=priority,
            max_tokens=self.max_tokens,
            n=self.n,
            best_of=self.best_of,
            surface=self.surface,
            stream=self.stream,
            intent_hint=intent_hint,
        )


def parse_body(raw: bytes, path: str) -> ParsedBody:
    """Parse an OpenAI chat/completions body. Raises ``BadRequest`` with a message meant for the client."""
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

    messages: Sequence[Mapping[str, Any]] | None = None
    prompt: str | list[Any] | None = None
    if path.endswith(headers.CHAT_SUFFIX):  # also under a route prefix (/api/v1/chat/completions)
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {role, content} objects", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
    else:
        prompt = data.get("prompt")
        try:
            completion_prompts(prompt)  # the core's own rule, so the client gets its 400 with the field named
        except PromptError as exc:
            raise BadRequest(str(exc), param="prompt") from None
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of {type, function} objects", param="tools")
    template_kwargs = data.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object", param="chat_template_kwargs")

    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", param="stream")
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
