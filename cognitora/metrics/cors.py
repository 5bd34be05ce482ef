"""Which web pages may read a Cognitora metrics page from a browser (CORS), and the headers that say so.

The pages hold engine addresses, team names and budget usage: readable by any web page, an insider's browser would
hand them to whatever site it visits. So an answer carries ``Access-Control-Allow-Origin`` only for an origin the
operator listed (``metrics.cors_origins`` in cognitora.yaml), echoed back with ``Vary: Origin``; any other origin
gets no CORS header, and the browser keeps the page from the script that asked.

- ``"null"`` (the default) is the origin a browser gives a page opened from disk: the shipped dashboard
  (dashboard/index.html) opened as a file. Remove it to refuse that too.
- A served dashboard: list its origin, ``https://dash.example.com``.
- ``"*"``: every origin (the page then has no protection from other sites; only where nothing on it is private).

``Access-Control-Allow-Private-Network: true`` (Chrome's preflight of a public page reading a private address) is
answered only for a listed origin other than ``null``: a sandboxed frame of any site also has the origin ``null``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["CorsPolicy", "MetricsPageConfig"]

ANY_ORIGIN = "*"
FILE_ORIGIN = "null"
"""What a page opened from ``file://`` sends as its ``Origin``."""


class MetricsPageConfig(BaseModel):
    """``metrics:`` in cognitora.yaml: who may read this process's metrics page from a browser."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    cors_origins: list[str] = Field(default_factory=lambda: [FILE_ORIGIN])
    """Origins whose pages may read the metrics page (CORS), e.g. ``https://dash.example.com``; ``"null"`` (the
    default): the dashboard opened from disk; ``"*"``: any page of any site. Others get no CORS header
    (docs/metrics.md, "CORS")."""

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin in (ANY_ORIGIN, FILE_ORIGIN):
                continue
            scheme, sep, rest = origin.partition("://")
            if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port] with no path, e.g. "
                    'https://dash.example.com, or "null" (a page opened from disk), or "*"'
                )
        return [o.rstrip("/") for o in value]


@dataclass(frozen=True)
class CorsPolicy:
    """The CORS answer of a metrics page, for the origins it allows."""

    origins: frozenset[str] = frozenset({FILE_ORIGIN})

    @classmethod
    def of(cls, config: MetricsPageConfig | None) -> CorsPolicy:
        return cls() if config is None else cls(frozenset(config.cors_origins))

    def allowed(self, origin: str | None) -> bool:
        return origin is not None and (ANY_ORIGIN in self.origins or origin in self.origins)

    def headers(self, request_headers: Mapping[str, str], preflight: bool = False) -> dict[str, str]:
        """The CORS headers of an answer to a request with ``request_headers`` (those of its answer for a
        preflight); none when its origin is not allowed (``Vary: Origin`` always: the answer depends on it)."""
        headers = {"Vary": "Origin"}
        origin = request_headers.get("Origin")
        if not self.allowed(origin):
            return headers
        assert origin is not None
        headers["Access-Control-Allow-Origin"] = ANY_ORIGIN if ANY_ORIGIN in self.origins else origin
        if not preflight:
            return headers
        headers["Access-Control-Allow-Methods"] = "GET, OPTIONS"
        asked = request_headers.get("Access-Control-Request-Headers")
        if asked:
            headers["Access-Control-Allow-Headers"] = asked
        private = request_headers.get("Access-Control-Request-Private-Network", "").lower() == "true"
        if private and origin != FILE_ORIGIN:
            headers["Access-Control-Allow-Private-Network"] = "true"
        headers["Access-Control-Max-Age"] = "600"
        return headers
