"""Anthropic Messages requests (``POST /v1/messages``, ``/v1/messages/count_tokens``) as vLLM 0.32 validates them.

The fields and rules are those of ``vllm/entrypoints/anthropic/protocol.py`` that decide the prompt (the rest of a
body is accepted and ignored, as pydantic ignores it there). A body that does not validate raises ``SurfaceError``
naming the field (``messages[0].content[1].type``), where vLLM answers 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvstate.surfaces.request import SurfaceError, field_path

__all__ = [
    "BlockType",
    "ContentBlock",
    "CountTokensRequest",
    "Message",
    "MessagesRequest",
    "Tool",
    "ToolChangeDefinition",
    "validate_messages_body",
]

BlockType = Literal[
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Tool(_Model):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None

    @field_validator("input_schema")
    @classmethod
    def _object_by_default(cls, v: dict[str, Any]) -> dict[str, Any]:
        # vLLM adds the key, so it lands last in the schema the template prints.
        if "type" not in v:
            v["type"] = "object"
        return v


class ToolChangeReference(_Model):
    type: Literal["tool_reference"]
    name: str


class ToolChangeDefinition(_Model):
    type: Literal["tool_definition"]
    definition: Tool


ToolChange = Annotated[ToolChangeReference | ToolChangeDefinition, Field(discriminator="type")]


class ContentBlock(_Model):
    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    tool: ToolChange | None = None

    @model_validator(mode="after")
    def _tool_change(self) -> ContentBlock:
        if self.type not in ("tool_addition", "tool_removal"):
            return self
        if self.tool is None:
            raise ValueError(f"tool is required for {self.type} blocks")
        if self.type == "tool_removal" and self.tool.type != "tool_reference":
            raise ValueError("tool_removal only accepts a tool_reference")
        return self


def _reject_tool_changes(content: str | list[ContentBlock] | None) -> None:
    if content is None or isinstance(content, str):
        return
    for block in content:
        if block.type in ("tool_addition", "tool_removal"):
            raise ValueError(f'{block.type} blocks are only allowed in messages with role "system"')


class Message(_Model):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    @model_validator(mode="after")
    def _tool_changes_in_system_only(self) -> Message:
        if self.role != "system":
            _reject_tool_changes(self.content)
        return self


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


Effort = Literal["low", "medium", "high", "xhigh", "max"]


class OutputConfig(_Model):
    effort: Effort | None = None


class ThinkingEnabled(_Model):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)


class ThinkingDisabled(_Model):
    type: Literal["disabled"]


class ThinkingAdaptive(_Model):
    type: Literal["adaptive"]


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive, Field(discriminator="type")]


class CountTokensRequest(_Model):
    """``/v1/messages/count_tokens``: the prompt fields of a Messages request."""

    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("model")
    @classmethod
    def _model_named(cls, v: str) -> str:
        if not v:
            raise ValueError("Model is required")
        return v

    @field_validator("system")
    @classmethod
    def _system(cls, v: str | list[ContentBlock] | None) -> str | list[ContentBlock] | None:
        _reject_tool_changes(v)
        return v


class MessagesRequest(CountTokensRequest):
    """``/v1/messages``."""

    max_tokens: int
    stream: bool | None = False

    @model_validator(mode="after")
    def _thinking_fits(self) -> MessagesRequest:
        if isinstance(self.thinking, ThinkingEnabled) and self.thinking.budget_tokens >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


_UNION_TAGS = frozenset({"str", "int", "bool", "float", "dict", "list", "none", "function-after", "function-before"})


def _clean_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """pydantic's error location without the union-branch tags it inserts (``list[ContentBlock]``, ``str``)."""
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and p not in _UNION_TAGS))


def validate_messages_body(
    body: Mapping[str, Any], *, count_tokens: bool = False
) -> MessagesRequest | CountTokensRequest:
    """``body`` validated as vLLM validates it; ``SurfaceError`` naming the first field it refuses."""
    model = CountTokensRequest if count_tokens else MessagesRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # The deepest location names the field best: a union's shallow "not a string" hides the real error below.
        worst = max(errors, key=lambda e: len(_clean_loc(tuple(e["loc"]))))
        loc = _clean_loc(tuple(worst["loc"]))
        param = field_path(loc)
        raise SurfaceError(f"'{param}': {worst['msg']}", param) from None
