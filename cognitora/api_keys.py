"""``cognitora keys``: API keys for the Envoy example, as HS256-signed JWTs that Envoy's ``jwt_authn`` verifies.

An OpenAI client sends its API key as ``Authorization: Bearer <key>``. In ``examples/envoy.yaml`` that key is a JWT
signed with the gateway's secret: Envoy checks the signature (``jwt_authn``, local JWKS read from the environment
variable ``COGNITORA_JWKS``), then copies its claims into the identity headers ``cognitora extproc`` reads (``team``,
``sub`` as the key id, optionally ``priority`` and ``user``). The secret lives in one place, the environment of
Envoy and of whoever mints keys; nothing is stored per key.

    export COGNITORA_JWKS="$(cognitora keys jwks)"            # once per gateway: a fresh random signing key
    cognitora keys mint --team research --key-id alice          # prints an API key for team research

A key cannot be revoked on its own: give keys an expiry (``--expires-in-days``), or rotate the JWKS (every key then
stops working). docs/envoy.md, "API keys and teams", has the trade-offs and the alternatives.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["JWKS_ENV", "ApiKeyError", "main", "mint", "new_jwks"]

JWKS_ENV = "COGNITORA_JWKS"
"""The environment variable holding the JWKS (JSON): examples/envoy.yaml's ``local_jwks`` reads the same one."""

ISSUER = "cognitora"
"""The ``iss`` claim the example's provider requires."""

_KID = "cognitora-1"
_CLAIM_VALUE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


class ApiKeyError(ValueError):
    """A JWKS or a claim that cannot make a key; the message says what to do."""


def new_jwks() -> str:
    """A JWKS holding one fresh random 256-bit HS256 key."""
    key = {"kty": "oct", "alg": "HS256", "kid": _KID, "k": _b64url(secrets.token_bytes(32))}
    return json.dumps({"keys": [key]}, separators=(",", ":"))


def signing_key(jwks_text: str) -> tuple[str, bytes]:
    """The (kid, secret) of the first HS256 key of a JWKS."""
    try:
        keys = json.loads(jwks_text)["keys"]
    except (ValueError, KeyError, TypeError):
        raise ApiKeyError(
            f"${JWKS_ENV} is not a JWKS (JSON with a 'keys' list): set it with `export {JWKS_ENV}=\"$(cognitora keys "
            'jwks)"`, the same value Envoy starts with'
        ) from None
    for key in keys if isinstance(keys, list) else []:
        if isinstance(key, Mapping) and key.get("kty") == "oct" and key.get("alg", "HS256") == "HS256" and key.get("k"):
            return str(key.get("kid", "")), _b64url_decode(str(key["k"]))
    raise ApiKeyError(f"${JWKS_ENV} has no HS256 ('oct') key to sign with")


def mint(
    jwks_text: str,
    *,
    team: str,
    key_id: str,
    priority: str | None = None,
    user: str | None = None,
    expires_in_s: float | None = None,
    now: float | None = None,
) -> str:
    """An API key (a compact HS256 JWT) for ``team``, named ``key_id``, that the example's Envoy accepts."""
    claims: dict[str, Any] = {"iss": ISSUER, "team": team, "sub": key_id}
    for name, value in (("team", team), ("key id", key_id), ("priority", priority), ("user", user)):
        if value is not None and not _CLAIM_VALUE.match(value):
            raise ApiKeyError(f"{name} {value!r}: use 1-128 letters, digits and . _ : @ - (it becomes a header value)")
    if priority is not None:
        claims["priority"] = priority
    if user is not None:
        claims["user"] = user
    issued = int(time.time() if now is None else now)
    claims["iat"] = issued
    if expires_in_s is not None:
        claims["exp"] = issued + int(expires_in_s)
    kid, secret = signing_key(jwks_text)
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}, separators=(",", ":")).encode())
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(signature)}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise ApiKeyError(f"${JWKS_ENV}: its key's 'k' is not base64url") from None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cognitora keys", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jwks", help=f"print a fresh signing key (a JWKS) for ${JWKS_ENV}")
    m = sub.add_parser("mint", help=f"print an API key for a team, signed with ${JWKS_ENV}")
    m.add_argument("--team", required=True, help="the team the key's requests count against (budgets, burst)")
    m.add_argument("--key-id", required=True, help="a name for this key (per-key budgets, logs); not a secret")
    m.add_argument("--priority", default=None, help="the key's priority class (placement.priorities)")
    m.add_argument("--user", default=None, help="the end user (weighted rewrites' sticky key)")
    m.add_argument("--expires-in-days", type=float, default=None, help="the key stops working after this many days")
    args = parser.parse_args(argv)
    if args.command == "jwks":
        print(new_jwks())
        return 0
    jwks = os.environ.get(JWKS_ENV)
    if not jwks:
        print(
            f"cognitora keys mint: ${JWKS_ENV} is not set: the signing key Envoy verifies with. Create one once with "
            f'`export {JWKS_ENV}="$(cognitora keys jwks)"` and start Envoy with the same environment.',
            file=sys.stderr,
        )
        return 2
    try:
        expires = None if args.expires_in_days is None else args.expires_in_days * 86400
        print(
            mint(jwks, team=args.team, key_id=args.key_id, priority=args.priority, user=args.user, expires_in_s=expires)
        )
    except ApiKeyError as exc:
        print(f"cognitora keys mint: {exc}", file=sys.stderr)
        return 2
    return 0
