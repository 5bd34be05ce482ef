"""LiteLLM's ``model_list`` + ``routing_strategy_args`` -> a ``cognitora.config.CognitoraConfig``.

The fleet is the part of ``model_list`` that says it is one. A deployment is an **engine** of the fleet when

- its ``model_info`` carries a ``cognitora_`` key (``cognitora_engine: vllm``, ``cognitora_kv_events: ...``): the
  operator said so;
- or its provider names a server that only runs as a self-hosted engine (``hosted_vllm/...``, ``ollama/...``:
  ``SELF_HOSTED_PROVIDERS``);
- or ``routing_strategy_args.models[].endpoints`` lists its ``host:port`` under its model.

Every other deployment (``azure/``, ``anthropic/``, ``openai/`` even at a localhost ``api_base``: an
OpenAI-compatible address says nothing about what answers there) is not an engine: it is never scraped, and in a
model group that also has engines Cognitora places among the engines only. One marked
``model_info.cognitora_cloud: <target>`` is that ``burst.targets[]`` cloud target: still never scraped, picked only
on a burst decision (docs/burst.md).
An engine's endpoint id is ``host:port`` of its ``api_base``, its model the deployment's ``model_name`` (the name
clients send). Facts LiteLLM has no field for go in ``model_info`` under ``cognitora_``
keys (a bare key like ``tier`` would collide with LiteLLM's own ``model_info`` fields).

``routing_strategy_args`` holds the rest, with the keys of ``cognitora.yaml`` (``redis_url``, ``key_prefix``,
``placement``, ``scrape``, ``models[]`` with ``block_size``/``tokenizer``/``chat_template``), inline or in a file
named by ``config:``. Inline keys merge deeply over the file's (``merge_settings``). A ``models[]`` entry may omit
``endpoints``: they come from ``model_list``; endpoints it does list lend their facts to the model_list deployment
with the same id.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from cognitora.config import (
    CognitoraConfig,
    ConfigError,
    EndpointConfig,
    EngineKind,
    ModelConfig,
    absolute_paths,
    config_from_dict,
    read_yaml,
    resolve_env,
)

__all__ = [
    "ARGS_KEY_CONFIG",
    "CLOUD_KEY",
    "ENDPOINT_KEYS",
    "MODEL_INFO_PREFIX",
    "MODEL_KEYS",
    "Fleet",
    "build_fleet",
    "deployment_id",
    "endpoint_id",
    "engine_url",
    "merge_settings",
]

log = logging.getLogger("cognitora.litellm")

MODEL_INFO_PREFIX = "cognitora_"
"""Prefix of every ``model_info`` key the plugin reads; any such key makes the deployment an engine."""

ENDPOINT_KEYS: tuple[str, ...] = tuple(k for k in EndpointConfig.model_fields if k not in {"url", "id"})
"""``model_info`` ``cognitora_<key>`` entries that describe the one engine behind a deployment."""

MODEL_KEYS: tuple[str, ...] = tuple(k for k in ModelConfig.model_fields if k not in {"name", "endpoints"})
"""``model_info`` ``cognitora_<key>`` entries that describe the model (must agree across its deployments)."""

CLOUD_KEY = MODEL_INFO_PREFIX + "cloud"
"""``model_info.cognitora_cloud: <target>``: the deployment is that ``burst.targets[]`` cloud target, never an
engine: never scraped, and chosen by Cognitora only when it decides to burst (docs/burst.md)."""

ARGS_KEY_CONFIG = "config"
"""``routing_strategy_args.config``: path of a ``cognitora.yaml`` whose settings the inline ones override."""

SELF_HOSTED_PROVIDERS: Mapping[str, EngineKind] = MappingProxyType(
    {
        # vLLM's OpenAI-compatible server: the engine Cognitora knows best (metrics, KV events).
        "hosted_vllm": EngineKind.VLLM,
        # Servers that exist only as something you run yourself. Their metrics (if any) are not vLLM's, so they are
        # health-checked only (``openai``: GET /v1/models) unless ``cognitora_engine`` names their kind.
        "llamafile": EngineKind.OPENAI,
        "lm_studio": EngineKind.OPENAI,
        "ollama": EngineKind.OPENAI,
        "ollama_chat": EngineKind.OPENAI,
        "xinference": EngineKind.OPENAI,
        "triton": EngineKind.OPENAI,
        "oobabooga": EngineKind.OPENAI,
        "docker_model_runner": EngineKind.OPENAI,
    }
)
"""LiteLLM providers (``litellm_params.model`` prefix, or ``custom_llm_provider``) whose deployments are engines
without any ``cognitora_`` key, and the engine kind each gets by default. Deliberately absent: ``openai``,
``custom_openai``, ``text-completion-openai`` (any OpenAI-compatible server, a cloud or another gateway included),
``huggingface`` and ``nvidia_nim`` (hosted services by default), ``vllm`` (LiteLLM's in-process vLLM, no server),
``litellm_proxy`` (another gateway). Those become engines only with a ``cognitora_`` key."""


@dataclass(frozen=True)
class Fleet:
    """The core's config, and which LiteLLM deployment is which endpoint."""

    config: CognitoraConfig
    endpoint_by_deployment: dict[str, str]
    """LiteLLM deployment id (``model_info.id``) -> endpoint id (``host:port``), for engines only."""
    cloud_by_deployment: dict[str, str] = field(default_factory=dict)
    """LiteLLM deployment id -> the cloud target it is (``model_info.cognitora_cloud``)."""
    endpoint_sources: dict[str, str] = field(default_factory=dict)
    """Endpoint id -> where its first deployment is written (``model_list[3].litellm_params.api_base``), for
    messages about the engine (``cognitora.preflight``)."""


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


def provider_of(deployment: Mapping[str, Any]) -> str:
    """The LiteLLM provider of a deployment: ``custom_llm_provider``, else the prefix of ``model`` (``hosted_vllm``
    of ``hosted_vllm/meta-llama/Llama-3.1-8B``); empty when neither names one."""
    params = deployment.get("litellm_params") or {}
    explicit = params.get("custom_llm_provider")
    if explicit:
        return str(explicit)
    model = str(params.get("model") or "")
    return model.split("/", 1)[0] if "/" in model else ""


def build_fleet(
    model_list: Iterable[Mapping[str, Any]],
    routing_strategy_args: Mapping[str, Any] | None,
    base_dir: Path | None = None,
) -> Fleet:
    """Assemble and validate the config. Raises ``ConfigError`` naming the deployment or key that is wrong.

    ``base_dir`` anchors relative paths written in the LiteLLM config (inline ``routing_strategy_args``, the
    ``config:`` path, ``model_info``): the LiteLLM config's own folder (``litellm_plugin.register`` finds it in
    the proxy), default the current directory (an SDK script). Paths inside a ``config:`` file are relative to it.
    """
    base = (base_dir or Path.cwd()).resolve()
    settings, source = _settings(routing_strategy_args or {}, base)
    file_models = {str(m["name"]): m for m in settings.pop("models", [])}
    listed = {group: set(_file_endpoints(m)) for group, m in file_models.items()}

    models: dict[str, dict[str, Any]] = {}
    by_deployment: dict[str, str] = {}
    sources: dict[str, str] = {}
    others = 0
    clouds: dict[str, str] = {}
    cloud_models: dict[str, dict[str, str]] = {}
    for index, deployment in enumerate(model_list):
        params = deployment.get("litellm_params") or {}
        api_base = params.get("api_base")
        group = str(deployment.get("model_name", ""))
        info = dict(deployment.get("model_info") or {})
        if CLOUD_KEY in info:
            target = _cloud_target(info, f"model_list[{index}] (model_name {group!r})", settings)
            clouds[deployment_id(deployment)] = target
            model_name = str(params.get("model") or "")
            cloud_models.setdefault(target, {}).setdefault(group, model_name.split("/", 1)[-1])
            others += 1
            continue
        claims = sorted(str(k) for k in info if str(k).startswith(MODEL_INFO_PREFIX))
        provider = provider_of(deployment)
        where = f"model_list[{index}] (model_name {group!r}, api_base {api_base})"
        if not api_base:
            if claims:
                raise ConfigError(
                    f"{where}: model_info has {', '.join(claims)}, so it is an engine of the fleet, but litellm_params "
                    "has no api_base: Cognitora reaches, scrapes and names an engine by its api_base. Set it."
                )
            if provider in SELF_HOSTED_PROVIDERS:
                log.warning(
                    "%s: provider %s/ is a self-hosted engine, but without an api_base Cognitora cannot tell which "
                    "server it is: not placed by Cognitora (set litellm_params.api_base to make it an engine)",
                    where,
                    provider,
                )
            others += 1
            continue
        said_so = bool(claims) or provider in SELF_HOSTED_PROVIDERS
        try:
            ep_id = endpoint_id(str(api_base))
        except ConfigError as exc:
            if said_so:
                raise ConfigError(f"{where}: {exc}") from None
            ep_id = ""  # not an address Cognitora could reach: not an engine either
        if not said_so and ep_id not in listed.get(group, ()):
            # Not an engine (a cloud or any other OpenAI-compatible service): never scraped, never placed here.
            others += 1
            continue
        endpoint_facts, model_facts = _model_info_facts(info, where, base)
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
        sources.setdefault(ep_id, f"model_list[{index}].litellm_params.api_base")
        if any(e["id"] == ep_id for e in model["endpoints"]):
            continue  # the same engine listed twice in one group (e.g. two keys): one endpoint
        # Facts by precedence: the provider's engine kind < the config's endpoint entry < model_info.
        endpoint: dict[str, Any] = {}
        if provider in SELF_HOSTED_PROVIDERS:
            endpoint["engine"] = SELF_HOSTED_PROVIDERS[provider].value
        endpoint.update(model["_file_endpoints"].get(ep_id, {}))
        endpoint.update(endpoint_facts)
        endpoint.update(url=engine_url(str(api_base)), id=ep_id)
        model["endpoints"].append(endpoint)

    # A LoRA adapter's own model group serves from its base model's engines: it is a name of that model (one
    # key space, one event stream), not a model of its own.
    for lora in {str(name) for m in models.values() for name in m.get("loras") or []}:
        models.pop(lora, None)
    unknown = sorted(set(file_models) - set(models))
    if unknown:
        raise ConfigError(
            f"routing_strategy_args.models: {', '.join(map(repr, unknown))} match no model_name in model_list that "
            f"has an engine (groups with engines: {', '.join(map(repr, sorted(models))) or 'none'}). {_ENGINE_RULE}"
        )
    if not models:
        raise ConfigError(
            f"model_list has no engine for Cognitora to place on ({others} deployment(s), none of them an engine). "
            f"{_ENGINE_RULE}"
        )
    for model in models.values():
        model.pop("_from_model_info")
        model.pop("_file_endpoints")
    data = {**settings, "models": list(models.values())}
    _fill_cloud_models(data, cloud_models)
    config = config_from_dict(data, source=source, base_dir=base)
    return Fleet(
        config=config, endpoint_by_deployment=by_deployment, cloud_by_deployment=clouds, endpoint_sources=sources
    )


def _cloud_target(info: Mapping[str, Any], where: str, settings: Mapping[str, Any]) -> str:
    """The target a ``cognitora_cloud`` deployment names; it must be one of ``burst.targets`` (its prices, cap)."""
    target = info[CLOUD_KEY]
    extra = sorted(str(k) for k in info if str(k).startswith(MODEL_INFO_PREFIX) and k != CLOUD_KEY)
    if extra:
        raise ConfigError(
            f"{where}: model_info has {CLOUD_KEY} and {', '.join(extra)}: a cloud target is not an engine; "
            f"keep only {CLOUD_KEY}"
        )
    burst = settings.get("burst")
    targets = burst.get("targets") if isinstance(burst, Mapping) else None
    names = [str(t.get("name")) for t in targets or [] if isinstance(t, Mapping)]
    if not isinstance(target, str) or target not in names:
        known = ", ".join(names) or "none"
        raise ConfigError(
            f"{where}: model_info.{CLOUD_KEY} is {target!r}, which routing_strategy_args.burst.targets does not "
            f"define (defined: {known}); add a target with that name (its prices and max_concurrency)"
        )
    return target


def _fill_cloud_models(data: dict[str, Any], cloud_models: Mapping[str, Mapping[str, str]]) -> None:
    """Each target serves the model groups it has a deployment in, under the deployment's model name, unless
    ``burst.targets[].models`` says otherwise."""
    if not cloud_models:
        return
    burst = dict(data["burst"])
    targets = []
    for t in burst["targets"]:
        t = dict(t)
        found = cloud_models.get(str(t.get("name")), {})
        t["models"] = {**found, **(t.get("models") or {})}
        targets.append(t)
    burst["targets"] = targets
    data["burst"] = burst


_ENGINE_RULE = (
    "A deployment is an engine when its model_info has a cognitora_ key (e.g. cognitora_engine: vllm), or its "
    "provider is a self-hosted engine server (hosted_vllm/, ollama/, ...), and it has an api_base; see docs/litellm.md."
)


# -- routing_strategy_args: the config file, the inline keys, merged ---------------------------------------------


def merge_settings(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, as a user of ``config:`` + inline keys expects: mappings merge key by key at
    any depth (an inline ``placement: {store_timeout_s: 0.5}`` keeps the file's priority classes), any other value
    replaces (lists included: an inline ``endpoints`` list is the whole list), and ``models[]`` entries, which
    are named, merge by ``name``. Neither argument is mutated.
    """
    merged = _deep_merge(
        {k: v for k, v in base.items() if k != "models"}, {k: v for k, v in override.items() if k != "models"}
    )
    by_name: dict[str, dict[str, Any]] = {}
    for where, models in (("config file", base.get("models")), ("inline", override.get("models"))):
        for model in _models_list(models, where):
            name = str(model["name"])
            by_name[name] = _deep_merge(by_name.get(name, {}), model)
    if by_name or "models" in base or "models" in override:
        merged["models"] = list(by_name.values())
    return merged


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    # Ten lines: no merge library's defaults (list concatenation, in-place mutation) match the rule we document.
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        out[key] = _deep_merge(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return out


def _models_list(models: Any, where: str) -> list[Mapping[str, Any]]:
    if models is None:
        return []
    if not isinstance(models, list):
        raise ConfigError(f"routing_strategy_args.models ({where}): expected a list of models, got {models!r}")
    for i, model in enumerate(models):
        if not isinstance(model, Mapping) or not model.get("name"):
            raise ConfigError(
                f"routing_strategy_args.models[{i}] ({where}): expected a mapping with a 'name' (a model_name of "
                f"model_list), got {model!r}"
            )
    return models


def _settings(args: Mapping[str, Any], base: Path) -> tuple[dict[str, Any], str]:
    """The cognitora.yaml keys: the ``config:`` file's, with the inline ones merged over them; secrets resolved and
    paths made absolute per source (each against its own folder). Also the source's name for error messages."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"routing_strategy_args must be a mapping, got {type(args).__name__}")
    source = "LiteLLM routing_strategy_args"
    inline = resolve_env(dict(args), source)
    _refuse_nulls(inline, "routing_strategy_args")
    path = inline.pop(ARGS_KEY_CONFIG, None)
    from_file: dict[str, Any] = {}
    if path is not None:
        file_path = Path(str(path)).expanduser()
        file_path = file_path if file_path.is_absolute() else base / file_path
        try:
            data = read_yaml(file_path)
        except ConfigError as exc:
            raise ConfigError(f"routing_strategy_args.config: {exc}") from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"routing_strategy_args.config: {file_path} must hold a mapping of cognitora.yaml keys")
        from_file = absolute_paths(resolve_env(data, str(file_path)), file_path.parent)
        source += f" over {file_path}"
    return merge_settings(from_file, absolute_paths(inline, base)), source


def _refuse_nulls(data: Any, where: str) -> None:
    # LiteLLM's proxy resolves os.environ/NAME itself before we see the args, and an unset NAME becomes null: a
    # null redis_url would silently mean embedded mode. A null is therefore refused, never taken as a value.
    if isinstance(data, Mapping):
        for key, value in data.items():
            _refuse_nulls(value, f"{where}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _refuse_nulls(value, f"{where}[{i}]")
    elif data is None:
        raise ConfigError(
            f"{where} is null. LiteLLM's proxy turns os.environ/NAME into null when NAME is not set: set that "
            "variable in the proxy's environment, or leave the key out for its default."
        )


# -- model_list --------------------------------------------------------------------------------------------------


def _file_endpoints(model: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for e in model.get("endpoints") or []:
        if isinstance(e, Mapping) and e.get("url"):
            ep = dict(e)
            out[str(ep.get("id") or endpoint_id(str(ep["url"])))] = ep
    return out


def _model_entry(name: str, from_args: Mapping[str, Any] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {k: v for k, v in (from_args or {}).items() if k != "endpoints"}
    entry["name"] = name
    entry["endpoints"] = []
    entry["_from_model_info"] = set()
    entry["_file_endpoints"] = _file_endpoints(from_args or {})
    return entry


def _model_info_facts(info: Mapping[str, Any], where: str, base: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    ours = {str(k): v for k, v in info.items() if str(k).startswith(MODEL_INFO_PREFIX)}
    _refuse_nulls(ours, f"{where}: model_info")
    ours = resolve_env(ours, f"{where}: model_info")
    endpoint: dict[str, Any] = {}
    model: dict[str, Any] = {}
    for raw_key, value in ours.items():
        key = raw_key[len(MODEL_INFO_PREFIX) :]
        if key in ENDPOINT_KEYS:
            endpoint[key] = value
        elif key in MODEL_KEYS:
            model[key] = value
        else:
            known = [MODEL_INFO_PREFIX + k for k in (*ENDPOINT_KEYS, *MODEL_KEYS)]
            close = difflib.get_close_matches(raw_key, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"expected one of: {', '.join(known)}"
            raise ConfigError(f"{where}: unknown model_info key {raw_key!r}; {hint}")
    # model_info lives in the LiteLLM config: its relative paths are relative to that file's folder.
    return absolute_paths(endpoint, base, EndpointConfig), absolute_paths(model, base, ModelConfig)
