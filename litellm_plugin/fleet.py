"""LiteLLM's ``model_list`` + ``routing_strategy_args`` -> a ``cognitora.config.CognitoraConfig``.

The fleet is what LiteLLM already knows: every deployment with an ``api_base`` is an engine endpoint, its id is
``host:port`` of that ``api_base``, and its model is the deployment's ``model_name`` (the name clients send).
Facts LiteLLM has no field for go in ``model_info`` under ``cognitora_`` keys (``cognitora_engine``,
``cognitora_kv_events``, ...; a bare key like ``tier`` would collide with LiteLLM's own ``model_info`` fields).

``routing_strategy_args`` holds the rest, with the keys of ``cognitora.yaml`` (``redis_url``, ``key_prefix``,
``placement``, ``scrape``, ``models[]`` with ``block_size``/``tokenizer``/``chat_template``), inline or in a file
named by ``config:``. A ``models[]`` entry there may omit ``endpoints``: they come from ``model_list``; endpoints it
does list only lend their facts to the model_list deployment with the same id.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from cognitora.config import CognitoraConfig, ConfigError, EndpointConfig, ModelConfig, config_from_dict

MODEL_INFO_PREFIX = "cognitora_"
"""Prefix of every ``model_info`` key the plugin reads."""

ENDPOINT_KEYS: tuple[str, ...] = tuple(k for k in EndpointConfig.model_fields if k not in {"url", "id"})
"""``model_info`` ``cognitora_<key>`` entries that describe the one engine behind a deployment."""

MODEL_KEYS: tuple[str, ...] = tuple(k for k in ModelConfig.model_fields if k not in {"name", "endpoints"})
"""``model_info`` ``cognitora_<key>`` entries that describe the model (must agree across its deployments)."""

ARGS_KEY_CONFIG = "config"
"""``routing_strategy_args.config``: path of a ``cognitora.yaml`` whose settings the inline ones override."""

_PATH_KEYS = ("tokenizer", "chat_template")


@dataclass(frozen=True)
class Fleet:
    """The core's config, and which LiteLLM deployment is which endpoint."""

    config: CognitoraConfig
    endpoint_by_deployment: dict[str, str]
    """LiteLLM deployment id (``model_info.id``) -> endpoint id (``host:port``)."""


def endpoint_id(api_base: str) -> str:
    """``host:port`` of an ``api_base`` (the port defaults by scheme), as Envoy and the store name endpoints."""
    parts = urlsplit(api_base)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ConfigError(f"api_base {api_base!r}: expected an http(s) URL like http://127.0.0.1:8000/v1")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def engine_url(api_base: str) -> str:
    """The engine's server root (``scheme://host:port``): where ``/metrics`` lives, whatever path ``/v1`` has."""
    parts = urlsplit(api_base)
    return f"{parts.scheme}://{parts.netloc}"


def deployment_id(deployment: Mapping[str, Any]) -> str:
    info = deployment.get("model_info") or {}
    return str(info.get("id", ""))


def build_fleet(
    model_list: Iterable[Mapping[str, Any]],
    routing_strategy_args: Mapping[str, Any] | None,
    base_dir: Path | None = None,
) -> Fleet:
    """Assemble and validate the config. Raises ``ConfigError`` naming the deployment or key that is wrong.

    ``base_dir`` anchors relative paths written inline (default: the current directory, which is where the
    LiteLLM proxy was started); paths inside a ``config:`` file are relative to that file.
    """
    base = (base_dir or Path.cwd()).resolve()
    settings = _settings(routing_strategy_args or {}, base)
    file_models = {str(m.get("name")): m for m in settings.pop("models", []) or [] if isinstance(m, Mapping)}

    models: dict[str, dict[str, Any]] = {}
    by_deployment: dict[str, str] = {}
    for index, deployment in enumerate(model_list):
        api_base = (deployment.get("litellm_params") or {}).get("api_base")
        if not api_base:
            continue  # a hosted provider, not an engine of the fleet: LiteLLM's own choice applies
        group = str(deployment.get("model_name", ""))
        where = f"model_list[{index}] (model_name {group!r}, api_base {api_base})"
        info = dict(deployment.get("model_info") or {})
        endpoint_facts, model_facts = _model_info_facts(info, where, base)
        ep_id = endpoint_id(str(api_base))
        model = models.setdefault(group, _model_entry(group, file_models.get(group)))
        for key, value in model_facts.items():
            if key in model["_from_model_info"] and model[key] != value:
                raise ConfigError(
                    f"{where}: model_info.{MODEL_INFO_PREFIX}{key}={value!r} disagrees with another deployment of "
                    f"model {group!r} ({model[key]!r}); it is a fact of the model, not of one deployment"
                )
            model[key] = value
            model["_from_model_info"].add(key)
        by_deployment[deployment_id(deployment)] = ep_id
        if any(e["id"] == ep_id for e in model["endpoints"]):
            continue  # the same engine listed twice in one group (e.g. two keys): one endpoint
        endpoint = {**model["_file_endpoints"].get(ep_id, {}), **endpoint_facts}
        endpoint.update(url=engine_url(str(api_base)), id=ep_id)
        model["endpoints"].append(endpoint)

    # A LoRA adapter's own model group serves from its base model's engines: it is a name of that model (one
    # key space, one event stream), not a model of its own.
    for lora in {str(name) for m in models.values() for name in m.get("loras") or []}:
        models.pop(lora, None)
    unknown = sorted(set(file_models) - set(models))
    if unknown:
        raise ConfigError(
            f"routing_strategy_args.models: {', '.join(map(repr, unknown))} match no model_name in model_list with an "
            f"api_base (model names there: {', '.join(map(repr, sorted(models))) or 'none'})"
        )
    if not models:
        raise ConfigError(
            "model_list has no deployment with litellm_params.api_base: Cognitora places requests on engines it "
            "can reach at an api_base (vLLM, SGLang, llama.cpp, ... servers)"
        )
    for model in models.values():
        model.pop("_from_model_info")
        model.pop("_file_endpoints")
    data = {**settings, "models": list(models.values())}
    config = config_from_dict(data, source="LiteLLM model_list + routing_strategy_args", base_dir=base)
    return Fleet(config=config, endpoint_by_deployment=by_deployment)


def _settings(args: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The cognitora.yaml keys: the ``config:`` file's, overridden by the inline ones; paths made absolute."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"routing_strategy_args must be a mapping, got {type(args).__name__}")
    inline = copy.deepcopy(dict(args))
    path = inline.pop(ARGS_KEY_CONFIG, None)
    merged: dict[str, Any] = {}
    if path is not None:
        file_path = Path(str(path))
        file_path = file_path if file_path.is_absolute() else base / file_path
        merged = _read_yaml(file_path)
        merged["models"] = [_absolute_paths(m, file_path.parent) for m in merged.get("models") or []]
    inline_models = [_absolute_paths(m, base) for m in inline.pop("models", None) or []]
    merged.update(inline)
    by_name = {str(m.get("name")): m for m in merged.get("models") or [] if isinstance(m, Mapping)}
    for m in inline_models:
        name = str(m.get("name"))
        by_name[name] = {**by_name.get(name, {}), **m}
    merged["models"] = list(by_name.values())
    return merged


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"routing_strategy_args.config: cannot read {path} ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"routing_strategy_args.config: {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"routing_strategy_args.config: {path} must hold a mapping of cognitora.yaml keys")
    return data


def _absolute_paths(model: Any, base: Path) -> Any:
    if not isinstance(model, Mapping):
        return model  # config_from_dict reports the wrong shape with its key path
    out = dict(model)
    for key in _PATH_KEYS:
        value = out.get(key)
        if value is not None and not Path(str(value)).is_absolute():
            out[key] = str((base / str(value)).resolve())
    return out


def _model_entry(name: str, from_args: Mapping[str, Any] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {k: v for k, v in (from_args or {}).items() if k != "endpoints"}
    entry["name"] = name
    entry["endpoints"] = []
    entry["_from_model_info"] = set()
    file_endpoints: dict[str, dict[str, Any]] = {}
    for e in (from_args or {}).get("endpoints") or []:
        if isinstance(e, Mapping) and e.get("url"):
            ep = dict(e)
            file_endpoints[str(ep.get("id") or endpoint_id(str(ep["url"])))] = ep
    entry["_file_endpoints"] = file_endpoints
    return entry


def _model_info_facts(info: Mapping[str, Any], where: str, base: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    endpoint: dict[str, Any] = {}
    model: dict[str, Any] = {}
    for raw_key, value in info.items():
        if not str(raw_key).startswith(MODEL_INFO_PREFIX):
            continue
        key = str(raw_key)[len(MODEL_INFO_PREFIX) :]
        if key in ENDPOINT_KEYS:
            endpoint[key] = value
        elif key in MODEL_KEYS:
            if key in _PATH_KEYS and value is not None and not Path(str(value)).is_absolute():
                value = str((base / str(value)).resolve())
            model[key] = value
        else:
            known = [MODEL_INFO_PREFIX + k for k in (*ENDPOINT_KEYS, *MODEL_KEYS)]
            close = difflib.get_close_matches(str(raw_key), known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"expected one of: {', '.join(known)}"
            raise ConfigError(f"{where}: unknown model_info key {raw_key!r}; {hint}")
    return endpoint, model
