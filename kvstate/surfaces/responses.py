"""An OpenAI Responses request -> the chat vLLM renders for it, rule for rule.

vLLM (``OnlineRenderer.render_responses``, ``vllm/entrypoints/openai/responses/utils.py``:
``construct_input_messages``, ``construct_tool_dicts``; ``ResponsesRequest.build_chat_params``) builds chat messages
from the request and renders them with the model's chat template, *without* the chat request's validation:

- ``instructions`` (non-empty) -> the leading ``system`` message; then the earlier conversation of
  ``previous_response_id`` (``kvstate.surfaces.history``); then ``input``: a string is one user message;
- ``input`` items, in order: a message (``{"role", "content"}``, with or without ``"type": "message"``) is kept as
  it is (content parts ``input_text``/``output_text`` are text, ``input_image`` an image), except an *assistant*
  message, which becomes ``{"role": "assistant", "content": <its first part's text>}``; ``reasoning`` -> the
  assistant's ``reasoning`` (its first ``content`` text, else its first ``summary`` text; ``encrypted_content`` is
  refused); ``function_call`` -> a tool call ``{"id": call_id, "function": {"name", "arguments"}, "type":
  "function"}`` (a ``namespace`` prefixes the name, ``ns__name``); ``custom_tool_call`` -> a tool call whose
  arguments are ``{"input": <its input>}`` as JSON; ``function_call_output``/``custom_tool_call_output`` -> a
  ``tool`` message. Reasoning, a tool call and an assistant text *merge* into the assistant message just before
  them when it lacks that field, so ``reasoning, function_call, message`` is one assistant turn. Any other item
  type is refused (vLLM: 400 "Unsupported input item type").
- ``tools`` (Responses' flat shape): function tools -> ``{"type": "function", "function": {"name", "description",
  "parameters", "strict"}}``; a ``namespace`` tool's functions flattened as ``ns__name``; a ``custom`` tool -> a
  function taking one string ``input``; built-in tools (web search, file search, MCP, ...) are not rendered.
- ``reasoning.effort`` -> template variables ``reasoning_effort`` and (unless ``chat_template_kwargs`` set it)
  ``enable_thinking``; a last input item that is a message or reasoning with status ``in_progress``/``incomplete``
  is continued (``continue_final_message``) instead of answered.

Where this differs from the same conversation sent as a chat (and vLLM renders it differently too): a tool call's
``function`` is ``{"name", "arguments"}`` here but ``{"arguments", "name"}`` after the chat request's validation,
which shows only in templates that print a whole call as JSON; an assistant message keeps only its first text part.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kvstate.prompt import ChatPrompt
from kvstate.surfaces.history import ResponseHistory
from kvstate.surfaces.media import media_in_messages
from kvstate.surfaces.request import SurfaceError, SurfaceRequest, field_path, read_output_cap

__all__ = ["CUSTOM_TOOL_INPUT_KEY", "read_responses", "responses_tools"]

CUSTOM_TOOL_INPUT_KEY = "input"
"""vLLM's one-argument shim for a ``custom`` tool (``vllm/tool_parsers/utils.py``)."""

NAMESPACE_SEPARATOR = "__"


class _ResponsesBody(BaseModel):
    """The top-level fields of ``vllm/entrypoints/openai/responses/protocol.py::ResponsesRequest`` that shape the
    prompt; items are read one by one below, naming ``input[i]`` when one cannot be."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] = []
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    stream: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None


def read_responses(body: Mapping[str, Any], history: ResponseHistory | None = None) -> SurfaceRequest:
    """A ``/v1/responses`` body, read; ``SurfaceError`` naming the field when it cannot be."""
    max_tokens, field = read_output_cap("responses", body)
    try:
        request = _ResponsesBody.model_validate(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = tuple(p for p in error["loc"] if isinstance(p, int) or ("[" not in p and p not in ("str", "list")))
        param = field_path(loc)
        raise SurfaceError(f"'{param}': {error['msg']}", param) from None
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    prior = None
    if request.previous_response_id is not None and history is not None:
        prior = history.get(request.previous_response_id)
        if prior is not None:
            messages.extend(dict(m) for m in prior.conversation())
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
    else:
        _items(request.input, messages)
    continue_final = _continues(request.input)
    prompt = ChatPrompt(
        messages=messages,
        tools=responses_tools(request.tools) or None,
        add_generation_prompt=not continue_final,
        continue_final_message=continue_final,
        chat_template_kwargs=_template_kwargs(request),
    )
    return SurfaceRequest(
        surface="responses",
        prompt=prompt,
        model=request.model,
        media=media_in_messages(messages),
        max_tokens=max_tokens,
        max_tokens_field=field,
        stream=bool(request.stream),
        previous_response_id=request.previous_response_id,
        previous_endpoint=prior.endpoint if prior is not None else None,
        history_resolved=prior is not None,
    )


# -- input items ----------------------------------------------------------------------------------------------


def _items(items: Sequence[Any], out: list[dict[str, Any]]) -> None:
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise SurfaceError(f"'input[{i}]' must be an object (a message or an item with a 'type')", f"input[{i}]")
        message = _item(i, item, out[-1] if out and out[-1].get("role") == "assistant" else None)
        if message is not None:
            out.append(message)


def _text_field(i: int, item: Mapping[str, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise SurfaceError(f"'input[{i}].{name}' must be a string", f"input[{i}].{name}")
    return value


def _item(i: int, item: Mapping[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """The message ``item`` adds, or None when it merged into ``prev`` (the assistant message before it)."""
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call"):
        name = _text_field(i, item, "name")
        if kind == "function_call":
            arguments = _text_field(i, item, "arguments")
            namespace = item.get("namespace")
            if isinstance(namespace, str) and namespace:
                name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
        else:
            arguments = json.dumps({CUSTOM_TOOL_INPUT_KEY: item.get("input") or ""}, ensure_ascii=False)
        call = {
            "id": _text_field(i, item, "call_id"),
            "function": {"name": name, "arguments": arguments},
            "type": "function",
        }
        if prev is not None:
            prev["tool_calls"] = [*(prev.get("tool_calls") or []), call]
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise SurfaceError("Encrypted content is not supported.", f"input[{i}].encrypted_content")
        reasoning = _first_text(item.get("content")) or _first_text(item.get("summary")) or ""
        if prev is not None and prev.get("reasoning") is None:
            prev["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    role = item.get("role")
    if kind not in (None, "message") or not isinstance(role, str):
        if kind is None:
            raise SurfaceError(f"'input[{i}]' needs a 'role' (a message) or a 'type'", f"input[{i}]")
        raise SurfaceError(f"Unsupported input item type: {kind}", f"input[{i}].type")
    content = item.get("content")
    if not isinstance(content, (str, list)):
        raise SurfaceError(f"'input[{i}].content' must be a string or a list of parts", f"input[{i}].content")
    if role == "assistant":
        text = content if isinstance(content, str) else _first_text(content)
        if text is not None:
            if prev is not None and prev.get("content") is None:
                prev["content"] = text
                return None
            return {"role": "assistant", "content": text}
    return dict(item)


def _first_text(parts: Any) -> str | None:
    if isinstance(parts, list) and parts and isinstance(parts[0], Mapping):
        text = parts[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _continues(value: str | list[Any]) -> bool:
    """vLLM's ``should_continue_final_message``: the last item is a partial assistant message or reasoning."""
    if isinstance(value, str) or not value or not isinstance(value[-1], Mapping):
        return False
    last = value[-1]
    return last.get("type", "message") in ("message", "reasoning") and last.get("status") in (
        "in_progress",
        "incomplete",
    )


# -- tools and template variables -----------------------------------------------------------------------------


def _custom_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            CUSTOM_TOOL_INPUT_KEY: {"type": "string", "description": "The freeform text payload for this tool."}
        },
        "required": [CUSTOM_TOOL_INPUT_KEY],
        "additionalProperties": False,
    }


def _function(tool: Mapping[str, Any], name: Any, where: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise SurfaceError(f"'{where}.name' must be a non-empty string", f"{where}.name")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": tool.get("description"),
            "parameters": tool.get("parameters"),
            "strict": tool.get("strict"),
            "defer_loading": tool.get("defer_loading"),
        },
    }


def responses_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Responses' flat tools as the chat template sees them (vLLM's ``get_function_tools`` then
    ``convert_tool_responses_to_completions_format``); built-in tool types are not rendered."""
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise SurfaceError(f"'tools[{i}]' must be an object with a 'type'", f"tools[{i}]")
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool, tool.get("name"), f"tools[{i}]"))
        elif kind == "custom":
            shim = {"description": tool.get("description"), "parameters": _custom_parameters()}
            out.append(_function(shim, tool.get("name"), f"tools[{i}]"))
        elif kind == "namespace":
            namespace = tool.get("name")
            inner = tool.get("tools")
            if not isinstance(namespace, str) or not isinstance(inner, list):
                raise SurfaceError(f"'tools[{i}]' (a namespace) needs a 'name' and 'tools'", f"tools[{i}]")
            for j, fn in enumerate(inner):
                if isinstance(fn, Mapping) and fn.get("type", "function") == "function":
                    name = fn.get("name")
                    flat = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if isinstance(name, str) else None
                    out.append(_function(fn, flat, f"tools[{i}].tools[{j}]"))
        elif not isinstance(kind, str):
            raise SurfaceError(f"'tools[{i}].type' must be a string", f"tools[{i}].type")
    return out


def _template_kwargs(request: _ResponsesBody) -> dict[str, Any] | None:
    user = dict(request.chat_template_kwargs or {})
    effort = request.reasoning.get("effort") if request.reasoning else None
    if effort is None or effort == "auto":
        return user or None
    extra: dict[str, Any] = {"reasoning_effort": effort}
    if "enable_thinking" not in user:
        extra["enable_thinking"] = effort != "none"
    return {**user, **extra}
