"""Identity from Envoy's dynamic metadata, forwarded to the service by ext_proc's
``metadata_options.forwarding_namespaces``: what ``jwt_authn`` verified (``payload_in_metadata``) or what an
``ext_authz`` server returned (its ``dynamic_metadata``). Envoy's filters wrote it after authentication; a client
cannot, so it is as trusted as the identity headers the auth filter sets (and is read first).

In each forwarded namespace, a claim is looked up at the top level and one level down (``jwt_authn`` nests the
payload under the ``payload_in_metadata`` name): ``team``, the key id (``key_id``, else ``sub``), ``user`` and
``priority``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["IDENTITY_NAMESPACES", "identity_from_metadata"]

IDENTITY_NAMESPACES = ("envoy.filters.http.jwt_authn", "envoy.filters.http.ext_authz")
_CLAIMS = {"team": ("team",), "key": ("key_id", "sub"), "user": ("user",), "priority": ("priority",)}


def identity_from_metadata(metadata_context: Any, namespaces: Iterable[str] = IDENTITY_NAMESPACES) -> dict[str, str]:
    """``{"team": ..., "key": ..., "user": ..., "priority": ...}`` (only those found) from a ``Metadata`` message."""
    found: dict[str, str] = {}
    filter_metadata = getattr(metadata_context, "filter_metadata", None)
    if not filter_metadata:
        return found
    for namespace in namespaces:
        if namespace not in filter_metadata:
            continue
        fields = filter_metadata[namespace].fields
        levels = [fields, *(v.struct_value.fields for v in fields.values() if v.HasField("struct_value"))]
        for what, names in _CLAIMS.items():
            if what in found:
                continue
            for level in levels:
                value = next((level[n].string_value for n in names if n in level and level[n].string_value), "")
                if value:
                    found[what] = value
                    break
    return found
