"""What a request reserves before it runs: the prompt tokens the router counted (the sum over a batch), plus the
most it can generate, which depends on the API it came through (``cognitora.request.Surface``).

- chat: ``n`` choices (``best_of`` where an engine takes it) of up to ``max_tokens`` each;
- completions: every prompt of a batch runs as its own request, each generating ``max(n, best_of)`` sequences of
  up to ``max_tokens`` (``best_of`` sequences are generated and paid for even though ``n`` are returned);
- Anthropic Messages, OpenAI Responses: one answer of up to the request's output cap;
- embeddings: nothing generated.

``max_tokens`` unset: ``budgets.default_max_tokens`` per sequence. The settle replaces the estimate with the
response's usage, so a generous estimate costs nothing in the end; a short one would let a batch past its cap,
which is why every sequence counts here.

A new surface plugs in with one entry in ``_RULES``: how many sequences it generates, and whether it generates at
all (its adapter sets ``RouteRequest.surface``, and its output cap as ``RouteRequest.max_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable

from cognitora.request import RouteRequest, Surface
from kvstate.prompt import PromptError, completion_prompts

__all__ = ["output_tokens", "sequences", "surface_of"]


def surface_of(request: RouteRequest) -> Surface:
    """The request's surface: as its adapter set it, else chat (``messages``) or completions (``prompt``)."""
    if request.surface is not None:
        return request.surface
    return Surface.CHAT if request.messages is not None else Surface.COMPLETIONS


def _prompts(request: RouteRequest) -> int:
    """Prompts in a completions batch (1 when it is not one, or when the prompt cannot be read: placement then
    refuses the request anyway)."""
    if request.prompt is None:
        return 1
    try:
        return len(completion_prompts(request.prompt))
    except PromptError:
        return 1


def _choices(request: RouteRequest) -> int:
    return max(request.n, request.best_of or 1)


def _none(request: RouteRequest) -> int:
    return 0


def _one(request: RouteRequest) -> int:
    return 1


_RULES: dict[Surface, Callable[[RouteRequest], int]] = {
    Surface.CHAT: _choices,
    Surface.COMPLETIONS: lambda r: _prompts(r) * _choices(r),
    Surface.RESPONSES: _one,
    Surface.MESSAGES: _one,
    Surface.EMBEDDINGS: _none,
}
"""Per surface: how many sequences of up to ``max_tokens`` a request generates."""


def sequences(request: RouteRequest) -> int:
    """Sequences ``request`` may generate, each up to its ``max_tokens``."""
    return _RULES[surface_of(request)](request)


def output_tokens(request: RouteRequest, default_max_tokens: int) -> int:
    """The most output tokens ``request`` may be billed for: sequences x (``max_tokens``, else the default)."""
    count = sequences(request)
    if count == 0:
        return 0
    per_sequence = default_max_tokens if request.max_tokens is None else request.max_tokens
    return count * per_sequence
