"""``Identity``: who a request is for, from trusted sources only, and the one rule that merges those sources.

Each adapter reads what its gateway authenticated and hands it over as ``Claims`` naming where it came from:

- LiteLLM: the authenticated key's ``user_api_key_*`` metadata and what an admin set on the key or its team
  (``IdentitySource.LITELLM_KEY``);
- Envoy: the dynamic metadata of its authentication filters, jwt_authn or ext_authz (``ENVOY_METADATA``), and the
  headers its config sets after authentication (``ENVOY_HEADER``).

``resolve_identity`` decides, here and nowhere else, which claim wins: per field, the most trusted source that
names it (verified metadata and an authenticated key before a header a route sets). Never the client's body.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["DEFAULT_PRIORITY", "Claims", "Identity", "IdentitySource", "resolve_identity"]

DEFAULT_PRIORITY = "default"
"""The priority class of a request nobody classed (``cognitora.config.DEFAULT_PRIORITY``)."""


class IdentitySource(StrEnum):
    """Where an identity came from, most trusted first (``resolve_identity`` ranks them so)."""

    ENVOY_METADATA = "envoy_metadata"
    """Envoy's jwt_authn / ext_authz dynamic metadata: what the authentication filter verified."""
    LITELLM_KEY = "litellm_key"
    """LiteLLM's authenticated virtual key, and what an admin set on it or its team."""
    ENVOY_HEADER = "envoy_header"
    """A header the Envoy config sets after authentication (``--trusted-*-header``; the client's copy is stripped)."""
    CALLER = "caller"
    """Built in process by the caller (``cognitora explain``, a script, a test)."""
    NONE = "none"
    """Nothing authenticated: an anonymous request."""


_RANK = {source: rank for rank, source in enumerate(IdentitySource)}


@dataclass(frozen=True)
class Identity:
    """Who a request is for: budgets count it, burst and intent policies read it. Frozen: the core never edits it
    (a priority the team's budget class decides is a new ``Identity``)."""

    team: str | None = None
    key: str | None = None
    """The API key's id (an alias or hash: never the key itself)."""
    user: str | None = None
    """The key's owner (never the body's ``user``, which the client chooses)."""
    priority: str = DEFAULT_PRIORITY
    intent_hint: str | None = None
    """A trusted intent hint for the rewrite rules (``cognitora.intent``)."""
    source: IdentitySource = IdentitySource.NONE
    """The most trusted source that named any field."""


@dataclass(frozen=True)
class Claims:
    """What one trusted source says of a request (empty fields: it says nothing of them)."""

    source: IdentitySource
    team: str | None = None
    key: str | None = None
    user: str | None = None
    priority: str | None = None
    intent_hint: str | None = None


def resolve_identity(*claims: Claims) -> Identity:
    """The request's identity from its sources' claims, in any order: per field, the most trusted source that names
    it (a tie keeps the earlier claim); the priority defaults to ``DEFAULT_PRIORITY``."""
    ranked = sorted(claims, key=lambda c: _RANK[c.source])
    found: dict[str, str] = {}
    source = IdentitySource.NONE
    for claim in ranked:
        for name in ("team", "key", "user", "priority", "intent_hint"):
            value = getattr(claim, name)
            if value and name not in found:
                found[name] = value
                if _RANK[claim.source] < _RANK[source]:
                    source = claim.source
    return Identity(
        team=found.get("team"),
        key=found.get("key"),
        user=found.get("user"),
        priority=found.get("priority", DEFAULT_PRIORITY),
        intent_hint=found.get("intent_hint"),
        source=source,
    )
