"""HS256 tokens for the stand-in auth filter of examples/envoy.yaml (jwt_authn, issuer ``cognitora-example``, key id
``demo``): what an identity provider would issue, for the end-to-end tests."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any


def example_jwt(secret: bytes, claims: dict[str, Any], ttl_s: int = 3600) -> str:
    """A token signed with ``secret`` carrying ``claims`` (``team``, ``sub``, ``priority``...)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "demo"}).encode())
    body = b64(json.dumps({"iss": "cognitora-example", "exp": int(time.time()) + ttl_s, **claims}).encode())
    signature = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"
