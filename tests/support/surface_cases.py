"""Conversations sent through every surface, shared by the surface tests (unit, sim, contract, real engine).

``SAME_CONVERSATIONS``: one conversation written as a chat, as Anthropic Messages and as OpenAI Responses.
``renders_alike`` says which of them vLLM renders to the same tokens: all three, except a conversation with a tool
call under a template that prints a whole call as JSON (vLLM's Responses path writes ``{"name", "arguments"}``,
its chat and Messages paths ``{"arguments", "name"}``).

``SINGLE_SURFACE``: requests that exercise one surface's own rules (billing headers, inline system messages, merged
Responses items, tool changes, continued messages, ...), each checked token for token against vLLM.

``TOOLS_TEMPLATE``: a chat template that prints what SmolLM2's own ignores (tools, tool calls, tool call ids,
reasoning) as JSON, so any difference in how a surface builds them shows in the tokens.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
Tools: {{ tools | tojson }}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message['role'] }}
{%- if message.tool_call_id is defined %} [{{ message.tool_call_id }}]{% endif %}
{% if message.reasoning_content is defined and message.reasoning_content -%}
<think>{{ message.reasoning_content }}</think>{% endif %}
{%- if message.content is string %}{{ message['content'] }}{% else %}{{ message['content'] | tojson }}{% endif %}
{%- if message.tool_calls is defined and message.tool_calls %}{{ message.tool_calls | tojson }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""

SYSTEM_FIRST_TEMPLATE = """{%- for message in messages %}
{%- if message['role'] == 'system' and not loop.first -%}
{{ raise_exception('System message must be at the beginning.') }}{% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
"""Qwen-style: a system message anywhere but first is an error (vLLM then merges Messages' inline system turns)."""

EFFORT_TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if reasoning_effort is defined and reasoning_effort %}[effort {{ reasoning_effort }}]{% endif %}
{%- if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}
{% endif %}"""
"""A template that reads the reasoning variables (vLLM's probe then maps ``thinking: disabled`` to ``none``)."""

SYSTEM = "You are the billing assistant of the Acme Rocket Company. Answer briefly and politely. " * 6

CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund an invoice",
            "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "refund",
        "description": "Refund an invoice",
        "input_schema": {"type": "object", "properties": {"invoice": {"type": "string"}}},
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "refund",
        "description": "Refund an invoice",
        "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
    }
]


@dataclass(frozen=True)
class Conversation:
    name: str
    chat: dict[str, Any]
    messages: dict[str, Any]
    responses: dict[str, Any]
    tool_calls: bool = False

    def renders_alike(self, prints_tool_calls_as_json: bool) -> tuple[bool, bool]:
        """(chat == Messages, chat == Responses) in vLLM's rendering, under such a template."""
        return True, not (self.tool_calls and prints_tool_calls_as_json)

    def body(self, surface: str, model: str = "smollm2") -> dict[str, Any]:
        return {"model": model, **getattr(self, surface)}


SAME_CONVERSATIONS = [
    Conversation(
        "plain",
        chat={
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Why was I charged twice?"},
                {"role": "assistant", "content": "Let me look at your invoices."},
                {"role": "user", "content": "It is invoice 7."},
            ]
        },
        messages={
            "max_tokens": 8,
            "system": SYSTEM,
            "messages": [
                {"role": "user", "content": "Why was I charged twice?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me look at your invoices."}]},
                {"role": "user", "content": "It is invoice 7."},
            ],
        },
        responses={
            "max_output_tokens": 8,
            "instructions": SYSTEM,
            "input": [
                {"role": "user", "content": "Why was I charged twice?"},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Let me look at your invoices.", "annotations": []}],
                },
                {"role": "user", "content": [{"type": "input_text", "text": "It is invoice 7."}]},
            ],
        },
    ),
    Conversation(
        "tools",
        tool_calls=True,
        chat={
            "tools": CHAT_TOOLS,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Refund invoice 7 please."},
                {
                    "role": "assistant",
                    "content": "Refunding it now.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "refund", "arguments": '{"invoice": "7"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "refunded 7"},
                {"role": "user", "content": "Thanks! And invoice 8?"},
            ],
        },
        messages={
            "max_tokens": 8,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "tools": ANTHROPIC_TOOLS,
            "messages": [
                {"role": "user", "content": "Refund invoice 7 please."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Refunding it now."},
                        {"type": "tool_use", "id": "call_1", "name": "refund", "input": {"invoice": "7"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "refunded 7"},
                        {"type": "text", "text": "Thanks! And invoice 8?"},
                    ],
                },
            ],
        },
        responses={
            "max_output_tokens": 8,
            "instructions": SYSTEM,
            "tools": RESPONSES_TOOLS,
            "input": [
                {"role": "user", "content": "Refund invoice 7 please."},
                {"role": "assistant", "content": "Refunding it now."},
                {"type": "function_call", "call_id": "call_1", "name": "refund", "arguments": '{"invoice": "7"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "refunded 7"},
                {"role": "user", "content": "Thanks! And invoice 8?"},
            ],
        },
    ),
    Conversation(
        "parts-and-reasoning",
        chat={
            "messages": [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "2nd."}],
                },
                {"role": "assistant", "content": "An answer.", "reasoning": "Think it over."},
                {"role": "user", "content": "And then?"},
            ]
        },
        messages={
            "max_tokens": 8,
            "system": SYSTEM,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "2nd."}],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Think it over.", "signature": "sig"},
                        {"type": "text", "text": "An answer."},
                    ],
                },
                {"role": "user", "content": "And then?"},
            ],
        },
        responses={
            "max_output_tokens": 8,
            "instructions": SYSTEM,
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "First part."}, {"type": "input_text", "text": "2nd."}],
                },
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Think it over."}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_2",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "An answer.", "annotations": []}],
                },
                {"role": "user", "content": "And then?"},
            ],
        },
    ),
]


@dataclass(frozen=True)
class SingleCase:
    name: str
    surface: str
    body: dict[str, Any] = field(default_factory=dict)

    def full_body(self, model: str = "smollm2") -> dict[str, Any]:
        return {"model": model, **self.body}


SINGLE_SURFACE = [
    SingleCase(
        "messages-system-blocks-and-inline-system",
        "messages",
        {
            "max_tokens": 8,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; hash=abc"},
                {"type": "text", "text": "Part one."},
                {"type": "text", "text": "Part two."},
            ],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "A per-turn reminder."},
                {"role": "user", "content": "again"},
            ],
        },
    ),
    SingleCase(
        "messages-tool-result-parts-and-assistant-result",
        "messages",
        {
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"b": 1}}]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                        }
                    ],
                },
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "late"}]},
                {"role": "user", "content": "r"},
            ],
        },
    ),
    SingleCase(
        "messages-empty-turns-and-prefill",
        "messages",
        {
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": []},
                {"role": "user", "content": [{"type": "text", "text": ""}]},
                {"role": "user", "content": "r"},
                {"role": "assistant", "content": "The answer is"},
            ],
        },
    ),
    SingleCase(
        "messages-tool-changes-and-effort",
        "messages",
        {
            "max_tokens": 8,
            "thinking": {"type": "disabled"},
            "output_config": {"effort": "high"},
            "tools": [*ANTHROPIC_TOOLS, {"name": "lookup", "input_schema": {"properties": {}}, "defer_loading": True}],
            "messages": [
                {
                    "role": "system",
                    "content": [
                        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "lookup"}},
                        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "refund"}},
                        {
                            "type": "tool_addition",
                            "tool": {"type": "tool_definition", "definition": {"name": "n", "input_schema": {}}},
                        },
                    ],
                },
                {"role": "user", "content": "q"},
            ],
        },
    ),
    SingleCase(
        "responses-merged-items",
        "responses",
        {
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "sum"}]},
                {"type": "function_call", "call_id": "c1", "name": "refund", "arguments": "{}"},
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "refund",
                    "arguments": '{"a": 1}',
                    "namespace": "billing",
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "m",
                    "status": "completed",
                    "content": [
                        {"type": "output_text", "text": "done", "annotations": []},
                        {"type": "output_text", "text": "second part", "annotations": []},
                    ],
                },
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                {"type": "custom_tool_call", "call_id": "c3", "name": "grep", "input": "foo bar"},
                {"type": "custom_tool_call_output", "call_id": "c3", "output": "x"},
                {"role": "developer", "content": "be terse"},
            ],
        },
    ),
    SingleCase(
        "responses-reasoning-after-text",
        "responses",
        {
            "input": [
                {"role": "user", "content": "q"},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "m1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "first", "annotations": []}],
                },
                {
                    "type": "reasoning",
                    "id": "rs_2",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "r"}],
                },
                {"type": "reasoning", "id": "rs_3", "summary": [{"type": "summary_text", "text": "again"}]},
                {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"},
                {"role": "assistant", "content": "second"},
                {"type": "function_call_output", "call_id": "c9", "output": [{"type": "input_text", "text": "o"}]},
            ],
        },
    ),
    SingleCase(
        "responses-tool-kinds-and-effort",
        "responses",
        {
            "input": "hi",
            "reasoning": {"effort": "low"},
            "tools": [
                {"type": "custom", "name": "grep", "description": "search"},
                {
                    "type": "namespace",
                    "name": "billing",
                    "description": "b",
                    "tools": [{"type": "function", "name": "refund", "parameters": {"type": "object"}}],
                },
                {"type": "web_search"},
                {"type": "function", "name": "s", "strict": True, "parameters": {"type": "object", "properties": {}}},
            ],
        },
    ),
    SingleCase(
        "responses-continued-message",
        "responses",
        {
            "instructions": "Complete the sentence.",
            "input": [
                {"role": "user", "content": "q"},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "m",
                    "status": "incomplete",
                    "content": [{"type": "output_text", "text": "The answer is", "annotations": []}],
                },
            ],
        },
    ),
    SingleCase(
        "chat-tool-fields-vllm-drops",
        "chat",
        {
            "reasoning_effort": "low",
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "strict": True, "x": 1, "parameters": {}},
                    "defer_loading": True,
                }
            ],
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}", "zz": 2}, "id": "c", "e": 1}
                    ],
                },
            ],
        },
    ),
]


def png(seed: int) -> str:
    """A small PNG-looking payload, base64 (the bytes only need to differ by ``seed``)."""
    raw = b"\x89PNG\r\n\x1a\n" + bytes([seed % 256]) * 64
    return base64.b64encode(raw).decode()


def image_conversation(image: str) -> dict[str, dict[str, Any]]:
    """One image question, as chat, Messages and Responses bodies (base64 ``image``)."""
    url = f"data:image/png;base64,{image}"
    return {
        "chat": {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": "What is in this picture? " * 4},
                    ],
                },
            ]
        },
        "messages": {
            "max_tokens": 8,
            "system": SYSTEM,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
                        {"type": "text", "text": "What is in this picture? " * 4},
                    ],
                }
            ],
        },
        "responses": {
            "max_output_tokens": 8,
            "instructions": SYSTEM,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": url},
                        {"type": "input_text", "text": "What is in this picture? " * 4},
                    ],
                }
            ],
        },
    }
