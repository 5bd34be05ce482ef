"""``ConfigError``, and the sentences a bad config gets: pydantic's errors rewritten as ``key.path: what is wrong``.

A leaf of the package: it knows no section of the schema. What needs the root model (the 'did you mean'
suggestions walk it from the top) takes it as an argument, so the schema and the loader both import this module and
it imports neither.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from cognitora.redaction import redact

__all__ = ["ConfigError", "describe_pydantic_error", "describe_validation_error", "join_problems", "key_path"]


class ConfigError(ValueError):
    """The configuration is wrong. The message names the source, the key path and what is expected.

    Its text is redacted (``cognitora.redaction``): an error that quotes a bad ``redis_url`` or a secret's value
    shows ``****`` where the password was, wherever it is printed or logged."""

    def __str__(self) -> str:
        return redact(super().__str__())


def key_path(loc: Sequence[int | str]) -> str:
    """``("models", 0, "endpoints", 1, "url")`` as ``models[0].endpoints[1].url``; the empty path as ``(top level)``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def join_problems(source: str, problems: Sequence[str]) -> str:
    """One message for every problem found in ``source``: a line for one, a list for several."""
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return f"{source}: {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)


def _model_at(loc: Sequence[int | str], root: type[BaseModel]) -> type[BaseModel] | None:
    """The pydantic model class that holds the last key of ``loc`` (for 'did you mean' suggestions)."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            # a dict key (e.g. a priority class name): the value type is the model we want
            continue
        model = _model_of_annotation(field.annotation)
    return model


def _model_of_annotation(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of_annotation(arg)
        if found is not None:
            return found
    return None


_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys",
}


def describe_pydantic_error(err: Mapping[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error (``loc`` from ``root``, the model validated) as ``key.path: what is wrong``."""
    loc = tuple(err.get("loc", ()))
    kind = err.get("type", "")
    value = err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        owner = _model_at(loc, root)
        text = f"unknown key {key!r}"
        if owner is not None:
            names = list(owner.model_fields)
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            text += f"; did you mean {close[0]!r}?" if close else f"; expected one of: {', '.join(names)}"
        return f"{key_path(loc[:-1]) if len(loc) > 1 else '(top level)'}: {text}"
    if kind == "invalid_key":  # loc ends with the key itself, which is not a list index though it may be an int
        return f"{key_path(loc[:-1]) if len(loc) > 1 else '(top level)'}: key {value!r} must be a string"
    path = key_path(loc)
    if kind == "missing":
        return f"{path}: missing required key"
    if kind in _EXPECTED:
        return f"{path}: expected {_EXPECTED[kind]}, got {value!r}"
    if kind == "enum":
        expected = (err.get("ctx") or {}).get("expected", "")
        return f"{path}: expected one of {expected}, got {value!r}"
    message = str(err.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")
    if kind.startswith(("greater_than", "less_than", "too_short", "too_long")):
        return f"{path}: {message[0].lower() + message[1:]} (got {value!r})"
    return f"{path}: {message}"


def describe_validation_error(source: str, exc: ValidationError, root: type[BaseModel]) -> str:
    """Every error of ``exc`` (raised validating ``root``) as one message naming ``source``."""
    return join_problems(source, [describe_pydantic_error(e, root) for e in exc.errors(include_url=False)])
