"""One request model for every API a client speaks to an engine: what the core needs of it, whatever the surface.

A ``SurfaceRequest`` is a request of any surface read with the engine's rules: its prompt as the engine will render
it (``kvstate.prompt``'s ``ChatPrompt`` for chat, Anthropic Messages and OpenAI Responses, which vLLM turns into a
chat before rendering; ``CompletionPrompt`` for completions and embeddings), the media it carries (keyed by content,
``kvstate.surfaces.media``), its output cap whatever the field is called, and whether it streams.

A body that cannot be read raises ``SurfaceError``: a ``PromptError`` (the client's 400) that names the field, in
the path notation of the surface's own docs (``messages[2].content[0].type``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvstate.chat_template import PromptError
from kvstate.prompt import ChatPrompt, CompletionPrompt, Prompt
from kvstate.surfaces.media import MediaRef

__all__ = [
    "OUTPUT_CAP_FIELDS",
    "SURFACES",
    "SurfaceError",
    "SurfaceName",
    "SurfaceRequest",
    "field_path",
    "read_output_cap",
]

SurfaceName = Literal["chat", "completions", "messages", "responses", "embeddings"]
"""The API a request came through; the values of ``cognitora.request.Surface``."""

SURFACES: tuple[SurfaceName, ...] = ("chat", "completions", "messages", "responses", "embeddings")

OUTPUT_CAP_FIELDS: dict[SurfaceName, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "messages": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "embeddings": (),
}
"""Per surface, the body fields that cap what one answer generates, the one that wins first (OpenAI chat: the newer
``max_completion_tokens`` over ``max_tokens``; Anthropic: ``max_tokens``, required; Responses:
``max_output_tokens``; embeddings generate nothing)."""


class SurfaceError(PromptError):
    """A request body its surface's rules cannot read: the client's 400, naming ``param`` (the field)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class SurfaceRequest:
    """A request of any surface, read (see the module docstring)."""

    surface: SurfaceName
    prompt: Prompt
    """What the engine renders and tokenizes: a chat (chat, messages, responses) or texts/token ids."""
    model: str | None = None
    media: tuple[MediaRef, ...] = ()
    """Images, audio and video of the prompt, in the order they appear; each is a media part of ``prompt``."""
    max_tokens: int | None = None
    """The output cap of one answer, whatever the surface calls it (``max_tokens_field``); None: not set."""
    max_tokens_field: str | None = None
    """The body field ``max_tokens`` came from (for the error that names it), None when not set."""
    stream: bool = False
    previous_response_id: str | None = None
    """Responses: the earlier response this one continues (the engine holds that conversation, not the body)."""
    previous_endpoint: str | None = None
    """Responses: the endpoint that served ``previous_response_id``, when the history knew it. vLLM keeps a
    response's conversation in the memory of the server that answered it: only that engine can continue it."""
    history_resolved: bool = False
    """Responses: the earlier conversation was found in the history and is part of ``prompt``; False with a
    ``previous_response_id`` means ``prompt`` holds only what this request's body shows (its keys then match the
    engine's prompt as far as the instructions, see docs/surfaces.md)."""

    @property
    def chat(self) -> ChatPrompt | None:
        """``prompt`` when it is a chat."""
        return self.prompt if isinstance(self.prompt, ChatPrompt) else None

    @property
    def completion(self) -> CompletionPrompt | None:
        """``prompt`` when it is texts or token ids (completions, embeddings)."""
        return self.prompt if isinstance(self.prompt, CompletionPrompt) else None

    @property
    def prompt_count(self) -> int:
        """Prompts the engine runs: a completions batch or an embeddings batch runs each input on its own."""
        return len(self.prompt.prompts) if isinstance(self.prompt, CompletionPrompt) else 1


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """``("messages", 2, "content")`` -> ``messages[2].content``: the notation of OpenAI's and Anthropic's docs."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def read_output_cap(
    surface: SurfaceName, body: Mapping[str, Any], *, required: bool = False
) -> tuple[int | None, str | None]:
    """The output cap of ``body`` by its surface's field names (``OUTPUT_CAP_FIELDS``): ``(value, field)``.

    Refused (``SurfaceError`` naming the field) unless a whole JSON number (``64.0``, ``"64"``, ``true`` are not),
    not negative; Anthropic's ``max_tokens`` must be positive and, with ``required``, present. The upper bound is
    the core's (``cognitora.request.MAX_TOKENS_LIMIT``), applied where the request is placed.
    """
    for name in OUTPUT_CAP_FIELDS[surface]:
        raw = body.get(name)
        if raw is None:
            continue
        if not isinstance(raw, int) or isinstance(raw, bool):
            shown = repr(raw) if len(repr(raw)) <= 40 else f"{repr(raw)[:37]}..."
            raise SurfaceError(f"'{name}' must be a whole number of tokens, got {type(raw).__name__} {shown}", name)
        minimum = 1 if surface == "messages" else 0
        if raw < minimum:
            raise SurfaceError(f"'{name}' must be at least {minimum}, got {raw}", name)
        return raw, name
    if required and OUTPUT_CAP_FIELDS[surface]:
        name = OUTPUT_CAP_FIELDS[surface][0]
        raise SurfaceError(f"'{name}' is required: the most tokens the answer may have", name)
    return None, None
