"""Run INSIDE the real-engines venv (vLLM 0.32 installed), by tests/core/test_surfaces_contract.py, in a subprocess.

Reads one JSON object on stdin and writes one on stdout:

- ``convert``: request bodies ``{"surface", "body", "merge_inline_system", "disabled_effort"}``. Each is validated
  with vLLM's own request model and converted with vLLM's own code into what its chat template renders: the
  messages, the tools (as dumped for the template), the template variables and flags. A body vLLM refuses gives
  ``{"refused": message}``.
- ``merge_probe``: template sources, each answered with ``AnthropicServingMessages._detect_merge_inline_system``.
- ``validate``: answers of the simulated engine ``{"kind", "payload"}``, each validated with vLLM's pydantic model
  for it (``messages``, ``messages_event``, ``count_tokens``, ``responses``, ``responses_event``); the answer is
  ``null`` when valid, else the validation error.

Nothing here imports Cognitora: it is vLLM's word on the request and answer shapes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any


def plain(value: Any) -> Any:
    """JSON data from what vLLM builds (dicts, pydantic models, lazily validated iterables)."""
    if hasattr(value, "model_dump"):
        return plain(value.model_dump())
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    if isinstance(value, Iterable):
        return [plain(v) for v in value]
    return str(value)


def convert(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts

    surface, body = case["surface"], case["body"]
    try:
        if surface == "chat":
            request = ChatCompletionRequest.model_validate(body)
        elif surface == "messages":
            anthropic = AnthropicMessagesRequest.model_validate(body)
            request = AnthropicServingMessages.to_chat_completion_request(
                anthropic,
                merge_inline_system=case["merge_inline_system"],
                disabled_thinking_effort=case["disabled_effort"],
            )
        else:
            responses = ResponsesRequest.model_validate(body)
            messages = construct_input_messages(
                request_instructions=responses.instructions, request_input=responses.input
            )
            tools = construct_tool_dicts(responses.tools, responses.tool_choice)
            params = responses.build_chat_params(None, "auto")
            return {"messages": plain(messages), "tools": plain(tools), "kwargs": plain(params.chat_template_kwargs)}
        params = request.build_chat_params(None, "auto")
        tools = [t.model_dump() for t in request.tools] if request.tools else None
        return {
            "messages": plain(request.messages),
            "tools": plain(tools),
            "kwargs": plain(params.chat_template_kwargs),
        }
    except Exception as exc:  # vLLM refuses the body: its 400
        return {"refused": f"{type(exc).__name__}: {exc}"[:500]}


def validate(item: dict[str, Any]) -> str | None:
    from pydantic import TypeAdapter
    from vllm.entrypoints.anthropic.protocol import (
        AnthropicCountTokensResponse,
        AnthropicMessagesResponse,
        AnthropicStreamEvent,
    )
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse, StreamingResponsesResponse
    from vllm.entrypoints.openai.responses.streaming_events import ResponseTextDeltaEvent, ResponseTextDoneEvent

    models: dict[str, Any] = {
        "messages": TypeAdapter(AnthropicMessagesResponse),
        "messages_event": TypeAdapter(AnthropicStreamEvent),
        "count_tokens": TypeAdapter(AnthropicCountTokensResponse),
        "responses": TypeAdapter(ResponsesResponse),
        # vLLM's union leaves out the text events it emits as the openai package's own models: add those.
        "responses_event": TypeAdapter(StreamingResponsesResponse | ResponseTextDeltaEvent | ResponseTextDoneEvent),
    }
    try:
        models[item["kind"]].validate_python(item["payload"])
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:1000]
    return None


def main() -> None:
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    job = json.load(sys.stdin)
    out = {
        "convert": [convert(c) for c in job.get("convert", [])],
        "merge_probe": [AnthropicServingMessages._detect_merge_inline_system(s) for s in job.get("merge_probe", [])],
        "validate": [validate(v) for v in job.get("validate", [])],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
