"""An Anthropic Messages request -> the chat vLLM renders for it, rule for rule.

vLLM serves ``/v1/messages`` by converting the request into a chat completions request
(``AnthropicServingMessages.to_chat_completion_request``, ``vllm/entrypoints/anthropic/serving.py``) and rendering
that like any chat. This module is that conversion:

- **system**: a string, or the text of its text blocks joined with no separator (blocks whose text starts with
  ``x-anthropic-billing-header`` are dropped: Claude Code's per-request hash would defeat prefix caching), becomes
  one leading ``system`` message. System messages inside ``messages`` stay where they are, unless the template
  needs system-first ordering (``TemplateTraits.merge_inline_system``): then their text joins the leading one.
- **content blocks**: ``text`` (non-empty) -> a text part; one text part alone becomes the string content;
  ``image`` -> an ``image_url`` part (``data:{media_type};base64,{data}``, media type ``image/jpeg`` by default, or
  the URL); ``thinking`` -> the assistant's ``reasoning`` (all thinking text joined); ``redacted_thinking`` and
  ``tool_reference`` -> nothing; ``tool_use`` -> a tool call ``{id, type: function, function: {name, arguments:
  json.dumps(input)}}``; ``tool_result`` in a user turn -> a ``tool`` message (its text parts joined with ``"\\n"``)
  *before* the user message, then a user message with its images, then a ``tool`` message of its
  ``tool_reference`` names; in an assistant turn -> a text part ``Tool result: {content}``. A user turn left
  without content is dropped; an assistant turn is kept even when empty.
- **tools**: ``{type: function, function: {name, description, parameters: input_schema, strict, defer_loading}}``,
  after applying the ``tool_addition``/``tool_removal`` blocks of system messages.
- **template variables**: ``output_config.effort`` and ``thinking`` set ``reasoning_effort`` (``disabled`` ->
  ``TemplateTraits.disabled_thinking_effort``) and, unless the request's ``chat_template_kwargs`` set it,
  ``enable_thinking`` (effort other than ``none``), over the request's ``chat_template_kwargs``.

The resulting messages then go through the chat request's validation (``kvstate.prompt.read_prompt``), as vLLM's
do through ``ChatCompletionRequest``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from kvstate.prompt import ChatPrompt, read_prompt
from kvstate.surfaces.anthropic_protocol import (
    ContentBlock,
    CountTokensRequest,
    Message,
    MessagesRequest,
    Tool,
    ToolChangeDefinition,
    validate_messages_body,
)
from kvstate.surfaces.media import media_in_messages
from kvstate.surfaces.request import SurfaceError, SurfaceRequest, read_output_cap
from kvstate.surfaces.template_traits import DEFAULT_TRAITS, TemplateTraits

__all__ = ["messages_to_chat", "read_messages"]

BILLING_HEADER = "x-anthropic-billing-header"


def read_messages(
    body: Mapping[str, Any], traits: TemplateTraits = DEFAULT_TRAITS, *, count_tokens: bool = False
) -> SurfaceRequest:
    """A ``/v1/messages`` body (``count_tokens``: a ``/v1/messages/count_tokens`` body), read; ``SurfaceError``
    naming the field when it cannot be."""
    max_tokens, field = (None, None) if count_tokens else read_output_cap("messages", body, required=True)
    request = validate_messages_body(body, count_tokens=count_tokens)
    prompt = messages_to_chat(request, traits)
    stream = bool(request.stream) if isinstance(request, MessagesRequest) else False
    return SurfaceRequest(
        surface="messages",
        prompt=prompt,
        model=request.model,
        media=media_in_messages(prompt.messages),
        max_tokens=max_tokens,
        max_tokens_field=field,
        stream=stream,
    )


def messages_to_chat(request: CountTokensRequest, traits: TemplateTraits = DEFAULT_TRAITS) -> ChatPrompt:
    """The chat vLLM renders for ``request`` (see the module docstring)."""
    merge = traits.merge_inline_system
    out: list[dict[str, Any]] = []
    _system(request, out, merge)
    for message in request.messages:
        _message(message, out, merge)
    prompt = read_prompt(messages=out, tools=_tools(request), chat_template_kwargs=_template_kwargs(request, traits))
    assert isinstance(prompt, ChatPrompt)
    return prompt


# -- system ---------------------------------------------------------------------------------------------------


def _system(request: CountTokensRequest, out: list[dict[str, Any]], merge: bool) -> None:
    parts: list[str] = []
    if isinstance(request.system, str) and request.system:
        parts.append(request.system)
    elif isinstance(request.system, list):
        parts.extend(b.text for b in request.system if b.type == "text" and b.text and not _billing(b.text))
    if merge:
        parts.extend(t for m in request.messages if m.role == "system" and (t := _system_text(m)))
    if parts:
        out.append({"role": "system", "content": "".join(parts)})


def _billing(text: str) -> bool:
    return text.startswith(BILLING_HEADER)


def _system_text(message: Message) -> str | None:
    if isinstance(message.content, str):
        return None if _billing(message.content) else message.content
    parts = [b.text for b in message.content if b.type == "text" and b.text and not _billing(b.text)]
    return "".join(parts) if parts else None


# -- messages -------------------------------------------------------------------------------------------------


def _message(message: Message, out: list[dict[str, Any]], merge: bool) -> None:
    if message.role == "system":
        if not merge and (text := _system_text(message)):
            out.append({"role": "system", "content": text})
        return
    converted: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, str):
        converted["content"] = message.content
    else:
        _blocks(message, converted, out)
    if not (message.role == "user" and "content" not in converted):
        out.append(converted)


def _blocks(message: Message, converted: dict[str, Any], out: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    assert not isinstance(message.content, str)
    for block in message.content:
        if block.type == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif block.type == "image" and block.source:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.source)}})
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            calls.append(_tool_call(block))
        elif block.type == "tool_result":
            if message.role == "user":
                _user_tool_result(block, out)
            else:
                parts.append({"type": "text", "text": f"Tool result: {str(block.content) if block.content else ''}"})
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if calls:
        converted["tool_calls"] = calls
    if parts:
        converted["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_call(block: ContentBlock) -> dict[str, Any]:
    return {
        # vLLM names an id-less call after the clock's second: keys after it match the engine's only within it.
        "id": block.id or f"call_{int(time.time())}",
        "type": "function",
        "function": {"name": block.name or "", "arguments": json.dumps(block.input or {})},
    }


def _user_tool_result(block: ContentBlock, out: list[dict[str, Any]]) -> None:
    text = ""
    images: list[str] = []
    references: list[dict[str, Any]] = []
    if isinstance(block.content, str):
        text = block.content
    elif isinstance(block.content, list):
        texts: list[str] = []
        for item in block.content:
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    out.append({"role": "tool", "tool_call_id": block.tool_use_id or "", "content": text or ""})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if references:
        out.append({"role": "tool", "tool_call_id": block.tool_use_id or "", "content": references})


# -- tools and template variables -----------------------------------------------------------------------------


def _tools(request: CountTokensRequest) -> list[dict[str, Any]] | None:
    tools = _resolve_tools(request)
    if tools is None:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
                "strict": t.strict,
                "defer_loading": t.defer_loading,
            },
        }
        for t in tools
    ]


def _resolve_tools(request: CountTokensRequest) -> list[Tool] | None:
    """``tools`` after the ``tool_addition``/``tool_removal`` blocks of system messages (vLLM's ``_resolve_tools``):
    the template sees the tools in effect at the end of the conversation."""
    changes = [
        block
        for m in request.messages
        if not isinstance(m.content, str)
        for block in m.content
        if block.type in ("tool_addition", "tool_removal")
    ]
    if not changes:
        return request.tools
    tools = {t.name: t for t in request.tools or []}
    removed: set[str] = set()
    for block in changes:
        change = block.tool
        assert change is not None
        if isinstance(change, ToolChangeDefinition):
            name = change.definition.name
            tools[name] = change.definition
        else:
            name = change.name
            if name not in tools:
                raise SurfaceError(
                    f"{block.type} references tool {name!r}, which is not declared in tools", "messages.content.tool"
                )
            if block.type == "tool_addition":
                tools[name] = tools[name].model_copy(update={"defer_loading": None})
        if block.type == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [t for name, t in tools.items() if name not in removed]


def _template_kwargs(request: CountTokensRequest, traits: TemplateTraits) -> dict[str, Any] | None:
    effort: str | None = None
    if request.output_config is not None and request.output_config.effort is not None:
        effort = request.output_config.effort
    if request.thinking is not None and request.thinking.type == "disabled":
        effort = traits.disabled_thinking_effort
    user = dict(request.chat_template_kwargs or {})
    if effort is None:
        return user or None
    extra: dict[str, Any] = {"reasoning_effort": effort}
    if "enable_thinking" not in user:
        extra["enable_thinking"] = effort != "none"
    return {**user, **extra}
