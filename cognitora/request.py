"""What the adapters hand the core: a ``RouteRequest`` (its end comes back as a ``cognitora.core.outcome.Outcome``),
and the core's rules for the request fields an adapter must read before it can build one (``read_max_tokens``,
``read_choices``, and the body's shape: ``check_body``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from cognitora.identity import DEFAULT_PRIORITY, Identity, IdentitySource
from kvstate.prompt import PromptError, completion_prompts

if TYPE_CHECKING:
    from cognitora.intent.verdict import Rewrite
    from kvstate.surfaces.request import SurfaceRequest

__all__ = [
    "MAX_TOKENS_LIMIT",
    "InvalidRequest",
    "RouteRequest",
    "Surface",
    "check_body",
    "new_request_id",
    "read_choices",
    "read_max_tokens",
]

MAX_TOKENS_LIMIT = 16_777_216
"""The most ``max_tokens`` a request may ask for (2**24): more than any model's context window (the longest are
about 10M tokens), so a larger value is a mistake or an attack, never a real budget. Placement counts a request's
``max_tokens`` as decode work in flight on its engine: ``1e20`` would make that engine look busy for everyone."""

MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens")
"""OpenAI's two names for the budget, the newer first: when a request has both, it is the one that counts."""


MAX_CHOICES = 128
"""The most sequences (``n``, ``best_of``) one request may ask for per prompt: OpenAI's own bound for ``n``."""


class Surface(StrEnum):
    """The API a request came through: what it may generate (``cognitora.budgets.estimate`` reserves by it)."""

    CHAT = "chat"
    """``/v1/chat/completions``: ``messages``; ``n`` choices of up to ``max_tokens`` each."""
    COMPLETIONS = "completions"
    """``/v1/completions``: ``prompt`` (one or a batch); ``max(n, best_of)`` sequences per prompt."""
    RESPONSES = "responses"
    """OpenAI's ``/v1/responses``: one answer of up to ``max_output_tokens``."""
    MESSAGES = "messages"
    """Anthropic's ``/v1/messages``: one answer of up to ``max_tokens`` (required by that API)."""
    EMBEDDINGS = "embeddings"
    """``/v1/embeddings``: input tokens only, nothing generated."""


class InvalidRequest(ValueError):
    """A request field the core cannot accept: the adapter answers 400 with ``message``, naming ``param``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _whole_number(name: str, value: object, what: str) -> int:
    """``value``, refused unless it is a JSON integer (``1e20`` and ``64.0`` are floats; ``true`` is no number)."""
    if not isinstance(value, int) or isinstance(value, bool):
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
        raise InvalidRequest(f"'{name}' must be {what} (an integer), got {type(value).__name__} {shown}", name)
    return value


def read_max_tokens(fields: Mapping[str, Any]) -> int | None:
    """The request's ``max_tokens`` from its body (or LiteLLM's kwargs): ``max_completion_tokens``, else
    ``max_tokens``; None when neither is set (null counts as unset).

    Refused (``InvalidRequest`` naming the field), never clamped: a value that is not a whole JSON number (``1e20``
    and ``64.0`` are floats, as OpenAI's API also refuses them), is negative, or is above ``MAX_TOKENS_LIMIT``. The
    core does not know each model's context window, and a clamp would silently change what the client asked for:
    the engine would refuse the request anyway, later, after it was counted as placed.
    """
    found: int | None = None
    for name in MAX_TOKENS_FIELDS:
        raw = fields.get(name)
        if raw is None:
            continue
        value = _whole_number(name, raw, "a whole number of tokens")
        if value < 0:
            raise InvalidRequest(f"'{name}' must be a non-negative integer, got {value}", name)
        if value > MAX_TOKENS_LIMIT:
            raise InvalidRequest(
                f"'{name}' is {value}: more than any model's context window (at most {MAX_TOKENS_LIMIT:,} tokens "
                "here); ask for fewer",
                name,
            )
        if found is None:
            found = value
    return found


def read_choices(fields: Mapping[str, Any]) -> tuple[int, int | None]:
    """``(n, best_of)`` from a body (or LiteLLM's kwargs): ``n`` defaults to 1, ``best_of`` to None (null counts as
    unset). Refused (``InvalidRequest`` naming the field), as the engines refuse them: a value that is not a whole
    JSON number, below 1, or above ``MAX_CHOICES``; a ``best_of`` below ``n``. Budgets reserve for every sequence
    generated, so these are read by the core's rule in both gateways."""
    found: dict[str, int] = {}
    for name in ("n", "best_of"):
        raw = fields.get(name)
        if raw is None:
            continue
        value = _whole_number(name, raw, "a whole number")
        if not 1 <= value <= MAX_CHOICES:
            raise InvalidRequest(f"'{name}' must be between 1 and {MAX_CHOICES}, got {value}", name)
        found[name] = value
    n = found.get("n", 1)
    best_of = found.get("best_of")
    if best_of is not None and best_of < n:
        raise InvalidRequest(f"'best_of' ({best_of}) must be at least 'n' ({n})", "best_of")
    return n, best_of


def check_body(fields: Mapping[str, Any], *, chat: bool) -> None:
    """The core's rules for the shape of a request body, the same in both gateways (Envoy's ``parse_body`` and
    LiteLLM's ``route_request`` call it on the body the client sent). Raises ``InvalidRequest`` naming the field:
    ``messages`` (chat: a non-empty list of objects with a string ``role``) or ``prompt`` (completions:
    ``kvstate.prompt``'s rule), ``tools`` (a list), ``chat_template_kwargs`` (an object), ``stream`` (a boolean)."""
    if chat:
        messages = fields.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("'messages' must be a non-empty list of {role, content} objects", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InvalidRequest(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
    else:
        try:
            completion_prompts(fields.get("prompt"))  # the prompt reader's own rule, the field named
        except PromptError as exc:
            raise InvalidRequest(str(exc), "prompt") from None
    tools = fields.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidRequest("'tools' must be a list of {type, function} objects", "tools")
    template_kwargs = fields.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise InvalidRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    if not isinstance(fields.get("stream", False), bool):
        raise InvalidRequest("'stream' must be true or false", "stream")


def new_request_id() -> str:
    return uuid.uuid4().hex


_UNSET = Identity()
"""``RouteRequest.identity`` not given: built from the mirror fields."""


@dataclass(frozen=True)
class RouteRequest:
    """One inference request, as the gateway saw it, after authentication.

    ``identity`` comes only from a trusted source (LiteLLM's authenticated key, Envoy's authentication metadata or
    a header its config sets after authentication), never from the client's body: each adapter hands its sources'
    claims to ``cognitora.identity.resolve_identity``, which decides their precedence. ``team``/``api_key_id``/
    ``user``/``priority``/``intent_hint`` mirror it (read-only in effect): given without an ``identity`` (a script,
    ``cognitora explain``, a test), they build one whose source is ``CALLER``.
    ``candidates``: endpoint ids the gateway allows for this request (LiteLLM's healthy deployments); None means
    every configured endpoint of the model.

    The prompt fields are the client's, untouched: the core reads them once, with the engine's rules
    (``kvstate.prompt``), whichever gateway they came through. ``model`` may name a LoRA adapter (the config's
    ``models[].loras``), as it does for vLLM.
    """

    model: str
    messages: Sequence[Mapping[str, Any]] | None = None
    """A chat's ``messages``; None for a completions request."""
    prompt: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | None = None
    """A completions ``prompt``: text, a batch of texts, token ids, or a batch of token-id lists."""
    tools: Sequence[Mapping[str, Any]] | None = None
    """A chat's ``tools``: the chat template renders them into the prompt."""
    add_special_tokens: bool | None = None
    """vLLM's field; None: the endpoint's default (chat: no, the template adds BOS; completions: yes)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Mapping[str, Any] | None = None
    """Extra variables for the chat template (vLLM's field, e.g. ``{"enable_thinking": false}``)."""
    request_id: str = field(default_factory=new_request_id)
    team: str | None = None
    api_key_id: str | None = None
    user: str | None = None
    priority: str = DEFAULT_PRIORITY
    max_tokens: int | None = None
    n: int = 1
    """Choices asked for (``read_choices``): each may generate up to ``max_tokens``."""
    best_of: int | None = None
    """Completions: sequences generated per prompt, of which ``n`` are returned (all are generated, all are paid)."""
    surface: Surface | None = None
    """The API the request came through; None: chat when it has ``messages``, else completions."""
    stream: bool = False
    candidates: Sequence[str] | None = None
    burst_targets: Sequence[str] | None = None
    """Cloud targets (``burst.targets[].name``) the gateway can reach for this request (LiteLLM: those with a
    healthy ``cognitora_cloud`` deployment in the group); None means every configured target."""
    named_cloud: str | None = None
    """The cloud target the client named (LiteLLM: a ``cognitora_cloud`` deployment's id as ``model``). Honoured only
    for a team in that target's ``burst.targets[].named_teams``; otherwise the request is placed like any other of
    its model (``cognitora.burst.policy``): no client reaches a cloud outside the burst policy."""
    pinned_endpoint: str | None = None
    """The endpoint the client named (LiteLLM: a deployment id as ``model``). Honoured only with ``may_pin``;
    otherwise the request is placed like any other of its model (a client never skips placement or shedding)."""
    may_pin: bool = False
    """A trusted source (an admin-set key flag) lets this request's ``pinned_endpoint`` decide."""
    intent_hint: str | None = None
    """A trusted intent hint for the rewrite rules (an Envoy header set after authentication, or LiteLLM key/team
    metadata ``cognitora_intent``); never the client's body."""
    rewrite: Rewrite | None = None
    """The model rewrite already decided for this request (LiteLLM decides it before choosing the model group):
    placement does not decide it again, and the decision carries it. None: the core decides (``Router.place``)."""
    surface_request: SurfaceRequest | None = None
    """The body as its surface's rules read it (``cognitora.surface_entry``): keyed from it, media included. None:
    the prompt fields above are read by ``kvstate.prompt`` (chat, completions built by hand or by an older caller)."""
    identity: Identity = field(default_factory=lambda: _UNSET)
    """Who the request is for (``cognitora.identity``): the one place the core reads it from."""

    def __post_init__(self) -> None:
        if self.identity is _UNSET:
            named = self.team or self.api_key_id or self.user or self.intent_hint or self.priority != DEFAULT_PRIORITY
            built = Identity(
                team=self.team,
                key=self.api_key_id,
                user=self.user,
                priority=self.priority,
                intent_hint=self.intent_hint,
                source=IdentitySource.CALLER if named else IdentitySource.NONE,
            )
            object.__setattr__(self, "identity", built)
            return
        who = self.identity
        for mirror, value in (
            ("team", who.team),
            ("api_key_id", who.key),
            ("user", who.user),
            ("priority", who.priority),
            ("intent_hint", who.intent_hint),
        ):
            object.__setattr__(self, mirror, value)
