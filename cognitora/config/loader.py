"""Reading ``cognitora.yaml``: the file, the environment, file paths, then the schema, each with its own errors.

Loading runs in phases, each with its own kind of error (style.md habit 6):

1. parse: strict YAML (a duplicate key is an error, not a silent overwrite);
2. environment: a string value ``os.environ/NAME`` is replaced by that variable, as LiteLLM users write secrets
   (a variable that is not set is an error naming the key and the variable);
3. file paths: every key typed ``Path`` is made absolute against the folder of the file that names it, and a
   ``tokenizer`` naming a model whose tokenizer ships with Cognitora becomes that file's path;
4. defaults and types: the pydantic models of ``cognitora.config.schema``, ``extra="forbid"`` everywhere, so a
   typo is an error with a suggestion;
5. references: unique model names, one URL per endpoint id, a ``default`` priority, files that exist.

Every error becomes a ``ConfigError`` naming the file, the key path (``models[0].endpoints[1].url``) and what is
expected; a pydantic stack dump never reaches the user.

The LiteLLM adapter builds a config without a file: ``config_from_dict(data, source="litellm model_list")`` runs
phases 2 to 5 with the same messages. It merges several sources first (a ``config:`` file, inline keys), so it runs
``resolve_env`` and ``absolute_paths`` on each source itself, against that source's own folder.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from cognitora.config.errors import (
    ConfigError,
    describe_pydantic_error,
    describe_validation_error,
    join_problems,
    key_path,
)
from cognitora.config.schema import CognitoraConfig
from cognitora.redaction import register_secret
from cognitora.shipped_tokenizers import shipped_names, shipped_tokenizer

__all__ = [
    "ENV_PREFIX",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_VALUES",
    "absolute_paths",
    "config_from_dict",
    "describe_error",
    "load_config",
    "read_yaml",
    "resolve_env",
]

ENV_PREFIX = "os.environ/"
"""A string value ``os.environ/NAME`` stands for the environment variable NAME (LiteLLM's own spelling)."""

MAX_CONFIG_VALUES = 100_000
"""A config holding more values than this is refused (a YAML alias bomb expands to billions from a few lines)."""
MAX_CONFIG_DEPTH = 64
"""A config nested deeper than this is refused (the schema is five levels deep; a parser's stack is not endless)."""

_SECRET_KEY = re.compile(r"password|passwd|api_?key|secret|(^|_)token$", re.IGNORECASE)
"""Keys whose value is a secret wherever it was written (``tokenizer`` is not one)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key ([a, b]): construct_mapping below reports it with its line
            continue
        if duplicate:
            mark = key_node.start_mark
            raise ConfigError(f"line {mark.line + 1}: duplicate key {key!r}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file strictly (no duplicate keys, no arbitrary objects); ``ConfigError`` names the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror or exc})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply to parse") from None
    except yaml.reader.ReaderError as exc:  # a character YAML forbids: it has a position, not a mark
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(f"{path}: not valid YAML at line {line}: character {exc.character!r}: {exc.reason}") from None
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None


def load_config(path: str | Path) -> CognitoraConfig:
    """Read ``cognitora.yaml`` at ``path``; relative file paths inside it are relative to its folder."""
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        data = {}
    return config_from_dict(data, source=str(path), base_dir=path.parent)


def config_from_dict(
    data: Mapping[str, Any], *, source: str = "<config>", base_dir: Path | None = None
) -> CognitoraConfig:
    """Build and validate a config from plain data (parsed YAML, or what an adapter assembled).

    ``source`` names where the data came from in error messages. ``base_dir`` anchors relative file paths
    (default: the current directory). ``os.environ/NAME`` values are resolved. ``data`` is not mutated.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    resolved = absolute_paths(resolve_env(data, source), base_dir or Path.cwd())
    try:
        config = CognitoraConfig.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(source, exc, CognitoraConfig)) from None
    problems = _reference_problems(config)
    if problems:
        raise ConfigError(join_problems(source, problems))
    return config


def resolve_env(data: Any, source: str) -> Any:
    """A copy of ``data`` with every string ``os.environ/NAME`` (at any depth) replaced by that variable's value.

    Secrets stay out of the file, written as LiteLLM users write them. Every variable that is not set is reported
    at once, each with the key that names it, in one ``ConfigError``. Every value read from the environment, and
    the value of any key that names a password, API key or token, is registered with ``cognitora.redaction``: logs,
    ``explain`` and config errors mask it from then on.
    """
    missing: list[str] = []
    budget = MAX_CONFIG_VALUES

    def walk(value: Any, loc: tuple[int | str, ...]) -> Any:
        nonlocal budget
        budget -= 1
        if budget < 0:
            raise ConfigError(
                f"{source}: {key_path(loc)}: the config holds more than {MAX_CONFIG_VALUES} values "
                "(a YAML alias expanding?)"
            )
        if len(loc) > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{source}: {key_path(loc[:4])}...: nested more than {MAX_CONFIG_DEPTH} levels deep")
        if isinstance(value, Mapping):
            return {k: walk(v, (*loc, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*loc, i)) for i, v in enumerate(value)]
        if isinstance(value, str) and not value.startswith(ENV_PREFIX):
            if loc and isinstance(loc[-1], str) and _SECRET_KEY.search(loc[-1]):
                register_secret(value)
            return value
        if isinstance(value, str):
            name = value[len(ENV_PREFIX) :]
            if not name:
                missing.append(f"{key_path(loc)}: {value!r} names no variable; write os.environ/NAME")
            elif name not in os.environ:
                missing.append(
                    f"{key_path(loc)}: {value} names the environment variable {name}, which is not set; "
                    f"set {name} (or write the value itself)"
                )
            else:
                register_secret(os.environ[name])
                return os.environ[name]
        return value

    out = walk(data, ())
    if missing:
        raise ConfigError(join_problems(source, missing))
    return out


def absolute_paths(data: Any, base_dir: Path, model: type[BaseModel] | None = None) -> Any:
    """A copy of raw config ``data`` (for ``model``, default the whole ``CognitoraConfig``) whose file paths are
    absolute: every key typed ``Path``, at any depth. A relative path is relative to ``base_dir``, the folder of the
    file that names it (never the process's working directory, which is wherever the gateway happened to start);
    ``~`` is the user's home. Values of the wrong shape are left for validation to report.
    """
    return _absolute_in(model or CognitoraConfig, data, base_dir)


def _absolute_in(annotation: Any, value: Any, base_dir: Path) -> Any:
    if value is None:
        return value
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(value, Mapping):
            return value
        out = dict(value)
        for key, item in value.items():
            field = annotation.model_fields.get(key) if isinstance(key, str) else None
            if key == "tokenizer" and isinstance(item, str) and (shipped := shipped_tokenizer(item)) is not None:
                out[key] = str(shipped)  # a model id whose tokenizer ships with Cognitora (never a download)
            elif field is not None:
                out[key] = _absolute_in(field.annotation, item, base_dir)
        return out
    if _is_path_type(annotation):
        if isinstance(value, str | os.PathLike) and str(value):
            path = Path(value).expanduser()
            if path.is_absolute():
                return str(path)
            try:
                return str((base_dir / path).resolve())
            except ValueError:  # a NUL or a lone surrogate: no such file, which the reference check reports
                return str(base_dir / path)
        return value
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list and args and isinstance(value, list):
        return [_absolute_in(args[0], item, base_dir) for item in value]
    if origin is dict and len(args) == 2 and isinstance(value, Mapping):
        return {k: _absolute_in(args[1], item, base_dir) for k, item in value.items()}
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _absolute_in(inner[0], value, base_dir)
    return value


def _is_path_type(annotation: Any) -> bool:
    if annotation is Path:
        return True
    return get_origin(annotation) in (Union, types.UnionType) and Path in get_args(annotation)


_TOKENIZER_HINT = (
    " (give the path of the model's own tokenizer.json, relative to this config file, the one the engines load; "
    f"or the Hugging Face id of a model whose tokenizer ships with Cognitora: {shipped_names()}. "
    "Cognitora never downloads a tokenizer)"
)


def _reference_problems(config: CognitoraConfig) -> list[str]:
    problems: list[str] = []
    seen_models: dict[str, int] = {}
    urls_by_id: dict[str, tuple[str, str]] = {}
    for i, m in enumerate(config.models):
        if m.name in seen_models:
            problems.append(f"models[{i}].name: duplicate model name {m.name!r} (also models[{seen_models[m.name]}])")
        seen_models.setdefault(m.name, i)
        for lora in m.loras:
            # One request model name must mean one key space: a LoRA name shadowing another name would split it.
            if lora in seen_models:
                problems.append(f"models[{i}].loras: {lora!r} is already a name in models[{seen_models[lora]}]")
            seen_models.setdefault(lora, i)
        for key in ("tokenizer", "chat_template"):
            value: Path | None = getattr(m, key)
            if value is not None and not value.is_file():
                hint = _TOKENIZER_HINT if key == "tokenizer" else ""
                problems.append(f"models[{i}].{key}: file not found: {value}{hint}")
        ids_here: set[str] = set()
        for j, e in enumerate(m.endpoints):
            where = f"models[{i}].endpoints[{j}]"
            if e.id in ids_here:
                problems.append(f"{where}.id: endpoint {e.id!r} listed twice for model {m.name!r}")
            ids_here.add(e.id)
            previous = urls_by_id.get(e.id)
            if previous is not None and previous[0] != e.url:
                problems.append(
                    f"{where}.url: endpoint id {e.id!r} already names {previous[0]} at {previous[1]}; "
                    "one id must mean one engine"
                )
            urls_by_id.setdefault(e.id, (e.url, f"{where}.url"))
    if config.intent is not None and config.intent.file is None:
        problems += [f"intent.{p}" for p in config.intent.problems(set(config.model_names()))]
    if config.budgets is not None:
        for team, entry in config.budgets.teams.items():
            if entry.priority is not None and entry.priority not in config.placement.priorities:
                problems.append(
                    f"budgets.teams.{team}.priority: {entry.priority!r} is not a class of placement.priorities "
                    f"({', '.join(sorted(config.placement.priorities))})"
                )
    problems.extend(_burst_problems(config))
    if config.flow_control is not None:
        problems.extend(config.flow_control.problems(config.placement.priorities))
        problems.extend(_lease_problems(config))
    return problems


def _lease_problems(config: CognitoraConfig) -> list[str]:
    """Leases shared by replicas need Redis; without ``max_num_seqs`` on any engine they would gate nothing."""
    flow = config.flow_control
    if flow is None or not flow.leases.enabled:
        return []
    out = []
    if config.redis_url is None:
        out.append(
            "flow_control.leases.enabled: leases are shared through Redis; set redis_url, or turn leases off "
            "(one gateway process needs none)"
        )
    seats = config.cost_model.priors.max_num_seqs
    if not seats and not any(e.cost.max_num_seqs for m in config.models for e in m.endpoints):
        out.append(
            "flow_control.leases.enabled: no endpoint sets max_num_seqs, so no engine would be lease-gated; set "
            "models[].endpoints[].cost.max_num_seqs or cost_model.priors.max_num_seqs"
        )
    return out


def _burst_problems(config: CognitoraConfig) -> list[str]:
    problems = [
        f"burst.priorities: {name!r} is not a class of placement.priorities ({', '.join(config.placement.priorities)})"
        for name in config.burst.priorities
        if name not in config.placement.priorities
    ]
    for i, t in enumerate(config.burst.targets):
        for local in t.models:
            if config.model(local) is None:
                names = ", ".join(config.model_names())
                problems.append(f"burst.targets[{i}].models: {local!r} is not a configured model ({names})")
    return problems


def describe_error(err: Mapping[str, Any], section: str) -> str:
    """One pydantic error of the config section ``section`` (its ``loc`` relative to it) as a sentence."""
    return describe_pydantic_error({**err, "loc": (section, *err.get("loc", ()))}, CognitoraConfig)
