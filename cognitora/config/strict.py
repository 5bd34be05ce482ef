"""What every section of ``cognitora.yaml`` shares: the strict, frozen base model and the checks of an address.

A leaf of the schema's modules (``cognitora.config.schema`` names them all): every section's model derives from
``StrictModel``, so an unknown key is an error with a suggestion (``cognitora.config.errors``) and a loaded config
never changes.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel", "check_http_url", "check_zmq_address"]


class StrictModel(BaseModel):
    """Unknown keys are errors, and a validated section never changes; field docstrings are docs/config.md's rows."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def check_http_url(value: str) -> str:
    """``value`` as an http(s) base URL without its trailing slash; a ValueError (the config's message) if not."""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"expected an http(s) URL like http://127.0.0.1:8000, got {value!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise ValueError(f"bad port in URL {value!r}") from exc
    return value.rstrip("/")


def check_zmq_address(value: str) -> str:
    """``value`` if it is a ZMQ address (tcp, ipc, inproc); a ValueError (the config's message) if not."""
    parts = urlsplit(value)
    if parts.scheme not in {"tcp", "ipc", "inproc"}:
        raise ValueError(f"expected a ZMQ address like tcp://127.0.0.1:5557, got {value!r}")
    return value
