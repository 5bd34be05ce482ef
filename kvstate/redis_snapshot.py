"""``EndpointSnapshot`` <-> the fields of its Redis hash.

One hash field per dataclass field, named as the field, so the hash reads like the snapshot in ``redis-cli``. The
codec is derived from the dataclass's own type hints, so a field added to ``EndpointSnapshot`` is stored and read
back without a change here. Every field is written on every ``put_snapshot``, a ``None`` as the empty string,
so an older snapshot's value can never show through a newer one that lacks it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from kvstate.store import EndpointSnapshot

__all__ = ["decode_snapshot", "encode_snapshot"]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional_float(text: str) -> float | None:
    return None if text == "" else float(text)


def _optional_int(text: str) -> int | None:
    return None if text == "" else int(float(text))


def _decoder(hint: Any) -> Callable[[str], Any]:
    if hint is bool:
        return lambda text: text == "1"
    if hint is int:
        return lambda text: int(float(text))
    if hint is float:
        return float
    if hint is str:
        return str
    if hint == float | None:
        return _optional_float
    if hint == int | None:
        return _optional_int
    raise TypeError(f"EndpointSnapshot field of type {hint!r} has no Redis encoding: add one in {__name__}")


_HINTS = typing.get_type_hints(EndpointSnapshot)
_DECODERS: dict[str, Callable[[str], Any]] = {
    f.name: _decoder(_HINTS[f.name]) for f in dataclasses.fields(EndpointSnapshot) if f.name != "endpoint"
}
"""Field name -> how to read it back; built at import, so a field without an encoding fails at once."""


def _encode(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    return str(value)


def encode_snapshot(snapshot: EndpointSnapshot) -> list[str]:
    """The hash as a flat field, value list (the endpoint is the key's name, not a field)."""
    out: list[str] = []
    for name in _DECODERS:
        out.append(name)
        out.append(_encode(getattr(snapshot, name)))
    return out


def decode_snapshot(endpoint: str, raw: dict[Any, Any]) -> EndpointSnapshot:
    """Lenient: fields this version does not know are ignored, missing ones keep their defaults, and one bad
    field from another writer does not hide the rest of the snapshot."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        decode = _DECODERS.get(_text(key))
        if decode is None:
            continue
        try:
            values[_text(key)] = decode(_text(value))
        except ValueError:
            continue
    return EndpointSnapshot(endpoint, **values)
