"""LiteLLM's request kwargs -> the core's ``RouteRequest``: the prompt as the client sent it, its limits, and who
sent it.

Pure functions, no LiteLLM state. Identity comes only from the ``user_api_key_*`` metadata the proxy writes after
authentication (it strips those keys from the client's own ``metadata`` first); the client's body metadata is never
read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from cognitora.config import DEFAULT_PRIORITY
from cognitora.identity import Claims, Identity, IdentitySource, resolve_identity
from cognitora.request import RouteRequest, check_body, new_request_id, read_choices, read_max_tokens
from cognitora.surface_entry import SurfaceReader, surface_under_prefix
from cognitora.surface_entry import route_request as surface_route_request
from kvstate.surfaces import SurfaceRequest
from litellm_plugin.translate.metadata import metadata_of, rewrite_of

__all__ = [
    "ALLOW_PINNING_KEY",
    "INTENT_KEY",
    "PRIORITY_KEY",
    "responses_holder",
    "route_request",
    "surface_path",
]

PRIORITY_KEY = "cognitora_priority"
"""Key (or team) ``metadata`` entry naming the request's priority class: set by an admin, never by the client."""

ALLOW_PINNING_KEY = "cognitora_allow_pinning"
"""Key (or team) ``metadata`` entry that lets a key's requests name one engine's deployment id and be served there
(``true``): set by an admin, never by the client. Without it a named engine is placed like its model group."""

INTENT_KEY = "cognitora_intent"
"""Key (or team) ``metadata`` entry with an intent hint for the rewrite rules (``rules[].hint``): set by an admin,
never by the client."""


def _first_str(meta: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = meta.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _admin_set(meta: Mapping[str, Any], name: str) -> Any:
    """A value an admin set on the authenticated key (or its team), never one the client sent."""
    for key in ("user_api_key_metadata", "user_api_key_team_metadata"):
        admin_set = meta.get(key)
        if isinstance(admin_set, Mapping) and name in admin_set:
            return admin_set[name]
    return None


def _priority(meta: Mapping[str, Any]) -> str:
    value = _admin_set(meta, PRIORITY_KEY)
    if not (isinstance(value, str) and value):
        # LiteLLM's own spelling (its priority reservation reads it the same way: the team's, then the key's).
        for key in ("user_api_key_team_metadata", "user_api_key_metadata"):
            admin_set = meta.get(key)
            if isinstance(admin_set, Mapping) and isinstance(admin_set.get("priority"), str):
                value = admin_set["priority"]
                break
    return value if isinstance(value, str) and value else DEFAULT_PRIORITY


def _client_body(request_kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The body the client sent the proxy (``proxy_server_request.body``); empty outside the proxy."""
    server_request = request_kwargs.get("proxy_server_request")
    body = server_request.get("body") if isinstance(server_request, Mapping) else None
    return body if isinstance(body, Mapping) else {}


def _check_client_body(request_kwargs: Mapping[str, Any]) -> None:
    """The body the client sent the proxy, by the core's rules as Envoy's service checks it (``check_body``): the
    same malformed chat or completions body gets the same 400 through either gateway. Raises ``InvalidRequest``."""
    server_request = request_kwargs.get("proxy_server_request")
    url = server_request.get("url") if isinstance(server_request, Mapping) else None
    body = _client_body(request_kwargs)
    if not isinstance(url, str) or not body:
        return  # an SDK call: LiteLLM's own Python API typed the fields
    if urlsplit(url).path.rstrip("/").endswith("/chat/completions") or "messages" in body:
        check_body(body, chat=True)
    elif "prompt" in body:  # a completions body (embeddings' and responses' ``input`` are their APIs' own)
        check_body(body, chat=False)


def _is_token_ids(value: Any) -> bool:
    if not isinstance(value, list) or not value:
        return False
    rows = value if all(isinstance(v, list) for v in value) else [value]
    return all(isinstance(t, int) and not isinstance(t, bool) for row in rows for t in row)


def _prompt_fields(
    messages: Sequence[Mapping[str, Any]] | None, input: str | list[Any] | None, request_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The request's prompt fields as the client sent them, for ``RouteRequest`` (the core reads them).

    LiteLLM hands the strategy a text completion as ``messages=[{"role": "user", "content": prompt}]``: the
    client's ``prompt`` comes back from the proxy's copy of the body, or, outside the proxy, from that one message
    when its content can only be a prompt (token ids). Embeddings and responses pass ``input``.
    """
    body = _client_body(request_kwargs)
    if body.get("prompt") is not None and body.get("messages") is None:
        messages, prompt = None, body["prompt"]
    elif messages is not None:
        only = messages[0] if len(messages) == 1 else None
        is_prompt = isinstance(only, Mapping) and set(only) == {"role", "content"} and _is_token_ids(only["content"])
        messages, prompt = (None, only["content"]) if isinstance(only, Mapping) and is_prompt else (messages, None)
    elif isinstance(input, list) and input and all(isinstance(i, Mapping) and "role" in i for i in input):
        messages, prompt = input, None  # Responses API input items of the message kind
    else:
        prompt = input
    extra = request_kwargs.get("extra_body")
    extra = extra if isinstance(extra, Mapping) else {}

    def field(name: str) -> Any:
        # vLLM's own fields reach LiteLLM top-level (the proxy) or in extra_body (the OpenAI SDK's way).
        value = request_kwargs.get(name)
        return extra.get(name) if value is None else value

    flags = {
        name: value
        for name in ("add_special_tokens", "add_generation_prompt", "continue_final_message")
        if isinstance(value := field(name), bool)
    }
    template_kwargs = field("chat_template_kwargs")
    tools = field("tools")
    return {
        "messages": messages,
        "prompt": prompt,
        "tools": tools if isinstance(tools, list) else None,
        "chat_template_kwargs": template_kwargs if isinstance(template_kwargs, Mapping) else None,
        **flags,
    }


_SURFACES_READ_BY_THE_CORE = frozenset({"messages", "responses", "embeddings"})
"""The proxy's endpoints whose client body the core's surface reader reads (``cognitora.surface_entry``): LiteLLM
hands the strategy only part of it (Anthropic's ``system`` is a separate kwarg, Responses' items are ``input``)."""


def surface_path(request_kwargs: Mapping[str, Any]) -> str | None:
    """The proxy path of a Messages, Responses or embeddings request (``/v1/messages``, ...), whose client body
    the core reads; None for chat and completions, and for a call through LiteLLM's Python API (no proxy)."""
    server_request = request_kwargs.get("proxy_server_request")
    url = server_request.get("url") if isinstance(server_request, Mapping) else None
    if not isinstance(url, str) or not _client_body(request_kwargs):
        return None
    path = urlsplit(url).path
    return path if surface_under_prefix(path) in _SURFACES_READ_BY_THE_CORE else None


def responses_holder(request_kwargs: Mapping[str, Any]) -> str | None:
    """The deployment id LiteLLM encoded in a Responses request's ``previous_response_id`` (its response ids carry
    the deployment that answered): only that engine holds the conversation (vLLM's response store is per server)."""
    previous = _client_body(request_kwargs).get("previous_response_id")
    if not isinstance(previous, str):
        return None
    from litellm.responses.utils import ResponsesAPIRequestUtils  # LiteLLM's own decoding of its ids

    found = ResponsesAPIRequestUtils.get_model_id_from_response_id(previous)
    return found if isinstance(found, str) and found else None


def route_request(
    model: str,
    messages: Sequence[Mapping[str, Any]] | None,
    input: str | list[Any] | None,
    request_kwargs: Mapping[str, Any],
    candidates: Sequence[str],
    pinned_endpoint: str | None = None,
    burst_targets: Sequence[str] = (),
    named_cloud: str | None = None,
    *,
    reader: SurfaceReader | None = None,
    holder: str | None = None,
) -> RouteRequest:
    """The core's view of one attempt. ``model`` is the model group; ``candidates`` are endpoint ids.

    ``reader``: the core's surface reader, for a request ``surface_path`` names: its client body is read by the
    surface's own rules (Anthropic's ``system`` and blocks, Responses' items, ...). ``holder``: the endpoint that
    holds a Responses request's ``previous_response_id`` (``responses_holder``), where it is pinned.

    Raises ``cognitora.request.InvalidRequest`` for a body or a ``max_tokens``, ``n`` or ``best_of`` the core
    refuses (the strategy answers 400)."""
    path = surface_path(request_kwargs) if reader is not None else None
    if reader is not None and path is not None:
        read = reader.read(path, _client_body(request_kwargs), model=model)
        assert read is not None  # surface_path named a surface's path
        return _surface_request(model, read, request_kwargs, candidates, burst_targets, named_cloud, holder)
    _check_client_body(request_kwargs)
    meta = metadata_of(request_kwargs)
    n, best_of = read_choices(request_kwargs)
    return RouteRequest(
        model=model,
        **_prompt_fields(messages, input, request_kwargs),
        request_id=new_request_id(),
        identity=_identity(meta),
        max_tokens=read_max_tokens(request_kwargs),
        n=n,
        best_of=best_of,
        stream=bool(request_kwargs.get("stream")),
        candidates=tuple(candidates),
        burst_targets=tuple(burst_targets),
        named_cloud=named_cloud,
        pinned_endpoint=pinned_endpoint,
        may_pin=_admin_set(meta, ALLOW_PINNING_KEY) is True,
        rewrite=rewrite_of(request_kwargs, model),
    )


def _surface_request(
    model: str,
    read: SurfaceRequest,
    request_kwargs: Mapping[str, Any],
    candidates: Sequence[str],
    burst_targets: Sequence[str],
    named_cloud: str | None,
    holder: str | None,
) -> RouteRequest:
    meta = metadata_of(request_kwargs)
    pin: dict[str, Any] = {} if holder is None else {"pinned_endpoint": holder, "may_pin": True}
    return surface_route_request(
        read,
        model=model,
        request_id=new_request_id(),
        identity=_identity(meta),
        candidates=tuple(candidates),
        burst_targets=tuple(burst_targets),
        named_cloud=named_cloud,
        rewrite=rewrite_of(request_kwargs, model),
        **pin,
    )


def _identity(meta: Mapping[str, Any]) -> Identity:
    return resolve_identity(
        Claims(
            IdentitySource.LITELLM_KEY,
            team=_first_str(meta, "user_api_key_team_id"),
            # The key's admin-set alias names it in budgets when it has one; else its hash (never the key).
            key=_first_str(meta, "user_api_key_alias", "user_api_key_hash", "user_api_key"),
            # Only the key's owner: LiteLLM's end-user id is the body's `user` field, which the client chooses.
            user=_first_str(meta, "user_api_key_user_id"),
            priority=_priority(meta),
            intent_hint=_admin_str(meta, INTENT_KEY),
        )
    )


def _admin_str(meta: Mapping[str, Any], name: str) -> str | None:
    value = _admin_set(meta, name)
    return value if isinstance(value, str) and value else None
