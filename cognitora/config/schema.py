"""The schema of ``cognitora.yaml``: the root model, ``CognitoraConfig``, and every section's model by name.

Each section is its own module, one frozen pydantic model per section, each field documented where it is declared:
``fleet`` (``models``: models and their endpoints), ``placement`` (weights and priority classes), ``cost_model``
(long-context priors and terms, TTFT feedback), ``limits`` (what one request may cost a gateway), ``kv_transfer``
(``kv_tiers`` and ``disaggregation``: what moving KV costs), ``collector`` (``scrape`` and ``engine_pulls``), and
``strict`` (the base they share). The sections of other packages (budgets, burst, flow control, intent, metrics)
live beside the code that reads them.

Every model forbids unknown keys (a typo is an error with a suggestion, ``cognitora.config.errors``) and is frozen.
A field's docstring is its row of docs/config.md (``cognitora.config.reference``). Reading a file, the environment
and file paths is the loader's (``cognitora.config.loader``); the checks that span sections (unique names, files
that exist) run there too, after these models validate.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from cognitora.budgets.config import BudgetsConfig
from cognitora.burst.config import BurstConfig
from cognitora.config.collector import EnginePullsConfig, ScrapeConfig
from cognitora.config.cost_model import CostModelConfig, EnginePriors, TtftFeedbackConfig
from cognitora.config.fleet import EndpointConfig, EngineKind, ModelConfig, PowerSourceConfig, Role
from cognitora.config.kv_transfer import DisaggregationConfig, KvTiersConfig
from cognitora.config.limits import LimitsConfig
from cognitora.config.placement import DEFAULT_PRIORITY, PlacementConfig, PriorityClass
from cognitora.config.strict import StrictModel
from cognitora.flow.config import FlowControlConfig
from cognitora.intent.policy import IntentConfig
from cognitora.metrics.cors import MetricsPageConfig
from cognitora.redaction import redact_url, register_url_password

__all__ = [
    "DEFAULT_PRIORITY",
    "CognitoraConfig",
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
]


class CognitoraConfig(StrictModel):
    """The whole of ``cognitora.yaml``."""

    redis_url: str | None = None
    """Redis shared by gateway replicas and the collector; absent: an in-process store (one gateway process)."""
    key_prefix: str = Field(default="cog", min_length=1)
    """Prefix of every Redis key Cognitora writes."""
    redis_cluster: bool = False
    """`redis_url` names one node of a Redis Cluster: use the cluster client, which finds the other nodes. Every
    script's keys share one hash slot (docs/store.md), so the store works on a Cluster as on one Redis."""
    models: list[ModelConfig] = Field(min_length=1)
    """The models served, each with its endpoints."""
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    """Placement weights, filters and priority classes."""
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig)
    """Long-context cost terms (attention, decode interference, KV capacity) and TTFT feedback."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """What one request may cost a gateway: prompt size for exact keys, and keying off the event loop."""
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    """How often the collector polls each engine's ``/metrics``, and how long it waits for an answer."""
    engine_pulls: EnginePullsConfig = Field(default_factory=EnginePullsConfig)
    """Per-kind pages the collector polls beside /metrics: llama.cpp ``/slots``, TRT-LLM ``/kv_cache_events``."""
    intent: IntentConfig | None = None
    """Intent-based and weighted model rewrite, before placement (docs/intent.md); absent: no rewrite."""
    disaggregation: DisaggregationConfig = Field(default_factory=DisaggregationConfig)
    """Prefill/decode pairs: the KV link's bandwidth and latency."""
    burst: BurstConfig = Field(default_factory=BurstConfig)
    """Cloud targets for a saturated fleet, and who may burst to them (docs/burst.md). Default: nothing bursts."""
    budgets: BudgetsConfig | None = None
    """Per-team, per-key and per-user token budgets (docs/budgets.md); absent: no budgets."""
    flow_control: FlowControlConfig | None = None
    """Hold requests at the gateway while the fleet is saturated, by priority band and fair across teams
    (docs/flow_control.md). Absent: off, as before (a saturated request is placed anyway, or shed if its class is
    sheddable); ``flow_control: {}`` turns it on with the defaults."""
    kv_tiers: KvTiersConfig = Field(default_factory=KvTiersConfig)
    """Reload bandwidths of KV blocks held in CPU memory or on disk, to price their reuse in seconds."""
    metrics: MetricsPageConfig = Field(default_factory=MetricsPageConfig)
    """Who may read the metrics pages from a browser (CORS; docs/metrics.md)."""

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, value: str | None) -> str | None:
        if value is None:
            return None
        register_url_password(value)  # masked in every log line and error from now on, a malformed URL's too
        parts = urlsplit(value)
        if parts.scheme not in {"redis", "rediss", "unix"}:
            raise ValueError(f"expected a Redis URL like redis://127.0.0.1:6379/0, got {redact_url(value)!r}")
        return value

    # -- lookups ------------------------------------------------------------------------------------------
    def model(self, name: str) -> ModelConfig | None:
        """The model clients call ``name`` (its own name, or one of its ``loras``), or None."""
        for m in self.models:
            if m.name == name or name in m.loras:
                return m
        return None

    def model_names(self) -> list[str]:
        """Every name a client may send: the models and their LoRA adapters."""
        return [name for m in self.models for name in (m.name, *m.loras)]

    def endpoint(self, endpoint_id: str) -> EndpointConfig | None:
        """The endpoint with this id (in any model), or None."""
        for m in self.models:
            for e in m.endpoints:
                if e.id == endpoint_id:
                    return e
        return None
