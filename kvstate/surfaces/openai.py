"""OpenAI's chat completions, completions and embeddings bodies, read with vLLM's rules into a ``SurfaceRequest``.

The prompt rules are ``kvstate.prompt``'s (its module docstring); this module reads the body around them, naming
the field a body gets wrong:

- **chat** (``/v1/chat/completions``): ``messages``, ``tools``, ``add_generation_prompt`` (default true),
  ``continue_final_message``, ``add_special_tokens`` (default false), ``chat_template_kwargs``; ``reasoning_effort``
  reaches the template as vLLM passes it (``reasoning_effort``, and ``enable_thinking`` unless the kwargs set it).
  Output cap: ``max_completion_tokens``, else ``max_tokens``.
- **completions** (``/v1/completions``): ``prompt`` (text, texts, token ids, token-id lists), ``add_special_tokens``
  (default true). Output cap: ``max_tokens``.
- **embeddings** (``/v1/embeddings``): ``input`` as text, texts, token ids or token-id lists, encoded with
  ``add_special_tokens`` (default true), every input its own prompt; or one conversation (``messages``, or
  ``input`` as a list of messages), rendered as a chat without a generation prompt (vLLM's embedding defaults).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstate.chat_template import PromptError
from kvstate.prompt import ChatPrompt, read_prompt
from kvstate.surfaces.media import media_in_messages
from kvstate.surfaces.request import SurfaceError, SurfaceRequest, read_output_cap

__all__ = ["read_chat", "read_completions", "read_embeddings"]


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SurfaceError(f"'{name}' must be true or false", name)
    return value


def _stream(body: Mapping[str, Any]) -> bool:
    return _flag(body, "stream", False)


def _model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise SurfaceError("'model' must be a string", "model")
    return model


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any] | None:
    user = body.get("chat_template_kwargs")
    if user is not None and not isinstance(user, Mapping):
        raise SurfaceError("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    kwargs = dict(user or {})
    effort = body.get("reasoning_effort")
    if effort is None or effort == "auto":
        return kwargs or None
    if not isinstance(effort, str):
        raise SurfaceError("'reasoning_effort' must be a string", "reasoning_effort")
    extra: dict[str, Any] = {"reasoning_effort": effort}
    if "enable_thinking" not in kwargs:
        extra["enable_thinking"] = effort != "none"
    return {**kwargs, **extra}


def _chat_prompt(body: Mapping[str, Any], messages: Any, *, generation_prompt: bool) -> ChatPrompt:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, list) or not messages:
        raise SurfaceError("'messages' must be a non-empty list of {role, content} objects", "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise SurfaceError("'tools' must be a list of {type, function} objects", "tools")
    try:
        prompt = read_prompt(
            messages=messages,
            tools=tools,
            add_special_tokens=_flag(body, "add_special_tokens", False),
            add_generation_prompt=_flag(body, "add_generation_prompt", generation_prompt),
            continue_final_message=_flag(body, "continue_final_message", False),
            chat_template_kwargs=_template_kwargs(body),
        )
    except SurfaceError:
        raise
    except PromptError as exc:
        raise SurfaceError(str(exc), "messages") from None
    assert isinstance(prompt, ChatPrompt)
    return prompt


def read_chat(body: Mapping[str, Any]) -> SurfaceRequest:
    """A ``/v1/chat/completions`` body, read."""
    prompt = _chat_prompt(body, body.get("messages"), generation_prompt=True)
    max_tokens, field = read_output_cap("chat", body)
    return SurfaceRequest(
        surface="chat",
        prompt=prompt,
        model=_model(body),
        media=media_in_messages(prompt.messages),
        max_tokens=max_tokens,
        max_tokens_field=field,
        stream=_stream(body),
    )


def read_completions(body: Mapping[str, Any]) -> SurfaceRequest:
    """A ``/v1/completions`` body, read."""
    if body.get("prompt") is None:
        raise SurfaceError(
            "'prompt' is required: a string, a list of strings, token ids, or a list of token-id lists", "prompt"
        )
    try:
        prompt = read_prompt(prompt=body["prompt"], add_special_tokens=_flag(body, "add_special_tokens", True))
    except SurfaceError:
        raise
    except PromptError as exc:
        raise SurfaceError(str(exc), "prompt") from None
    max_tokens, field = read_output_cap("completions", body)
    return SurfaceRequest(
        surface="completions",
        prompt=prompt,
        model=_model(body),
        max_tokens=max_tokens,
        max_tokens_field=field,
        stream=_stream(body),
    )


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, Mapping) and "role" in m for m in value)


def read_embeddings(body: Mapping[str, Any]) -> SurfaceRequest:
    """A ``/v1/embeddings`` body, read (nothing is generated: no output cap, no stream)."""
    conversation, where = body.get("messages"), "messages"
    if conversation is None and isinstance(body.get("input"), list):
        conversation, where = body["input"], "input"
        if not _is_conversation(conversation) and not all(_is_conversation(c) for c in conversation):
            conversation = None  # texts or token ids
    if conversation is not None:
        if isinstance(conversation, list) and conversation and all(_is_conversation(c) for c in conversation):
            raise SurfaceError(
                "a batch of conversations is not read: send one conversation per embeddings request", where
            )
        prompt = _chat_prompt(body, conversation, generation_prompt=False)
        return SurfaceRequest(
            surface="embeddings", prompt=prompt, model=_model(body), media=media_in_messages(prompt.messages)
        )
    raw = body.get("input")
    if raw is None:
        raise SurfaceError("'input' is required: a string, a list of strings, token ids, or token-id lists", "input")
    try:
        texts = read_prompt(prompt=raw, add_special_tokens=_flag(body, "add_special_tokens", True))
    except SurfaceError:
        raise
    except PromptError as exc:
        raise SurfaceError(str(exc).replace("'prompt'", "'input'"), "input") from None
    return SurfaceRequest(surface="embeddings", prompt=texts, model=_model(body))
