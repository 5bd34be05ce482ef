"""``cognitora.yaml``: the typed configuration, the loader that turns bad config into one clear message, and the
reference generated from it.

- ``schema``: the pydantic models, one per section, each field documented where it is declared;
- ``loader``: YAML, the environment, file paths and shipped tokenizers, then the schema and the cross-section
  checks (``load_config``, ``config_from_dict``);
- ``errors``: ``ConfigError`` and pydantic's errors as sentences;
- ``reference``: docs/config.md's tables (``python -m cognitora.config`` prints them).

Import from here: every public name of the four is re-exported, so callers need not know which module holds it.
"""

from cognitora.config.errors import ConfigError
from cognitora.config.loader import (
    ENV_PREFIX,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_VALUES,
    absolute_paths,
    config_from_dict,
    describe_error,
    load_config,
    read_yaml,
    resolve_env,
)
from cognitora.config.reference import reference_markdown
from cognitora.config.schema import (
    DEFAULT_PRIORITY,
    CognitoraConfig,
    CostModelConfig,
    DisaggregationConfig,
    EndpointConfig,
    EngineKind,
    EnginePriors,
    EnginePullsConfig,
    KvTiersConfig,
    LimitsConfig,
    ModelConfig,
    PlacementConfig,
    PowerSourceConfig,
    PriorityClass,
    Role,
    ScrapeConfig,
    TtftFeedbackConfig,
)

__all__ = [
    "DEFAULT_PRIORITY",
    "ENV_PREFIX",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_VALUES",
    "CognitoraConfig",
    "ConfigError",
    "CostModelConfig",
    "DisaggregationConfig",
    "EndpointConfig",
    "EngineKind",
    "EnginePriors",
    "EnginePullsConfig",
    "KvTiersConfig",
    "LimitsConfig",
    "ModelConfig",
    "PlacementConfig",
    "PowerSourceConfig",
    "PriorityClass",
    "Role",
    "ScrapeConfig",
    "TtftFeedbackConfig",
    "absolute_paths",
    "config_from_dict",
    "describe_error",
    "load_config",
    "read_yaml",
    "reference_markdown",
    "resolve_env",
]
