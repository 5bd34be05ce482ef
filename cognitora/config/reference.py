"""The configuration reference: docs/config.md's tables, generated from the schema's field docstrings.

``python -m cognitora.config`` prints it; tests/config/test_config.py fails when docs/config.md drifts from it, and when
a field has no docstring (a blank "meaning" cell).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from cognitora.budgets.config import BudgetsConfig, LimitConfig, ModelPrice, SubjectBudget
from cognitora.burst.config import BurstConfig, CloudTargetConfig
from cognitora.config.schema import (
    CognitoraConfig,
    CostModelConfig,
    DisaggregationConfig,
    EndpointConfig,
    EnginePriors,
    EnginePullsConfig,
    KvTiersConfig,
    LimitsConfig,
    ModelConfig,
    PlacementConfig,
    PowerSourceConfig,
    PriorityClass,
    ScrapeConfig,
    TtftFeedbackConfig,
)
from cognitora.flow.config import FlowClassConfig, FlowControlConfig, IsolationConfig, LeaseConfig, MarginConfig
from cognitora.intent.policy import (
    ClassifierSpec,
    DifficultySpec,
    EmbeddingsSpec,
    IntentConfig,
    IntentSpec,
    RuleSpec,
)
from cognitora.metrics.cors import MetricsPageConfig

__all__ = ["REFERENCE_SECTIONS", "reference_markdown"]

REFERENCE_SECTIONS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("top level", CognitoraConfig),
    ("models[]", ModelConfig),
    ("models[].endpoints[]", EndpointConfig),
    ("models[].endpoints[].power", PowerSourceConfig),
    ("placement", PlacementConfig),
    ("placement.priorities.<name>", PriorityClass),
    ("cost_model", CostModelConfig),
    ("cost_model.priors, models[].endpoints[].cost", EnginePriors),
    ("cost_model.feedback", TtftFeedbackConfig),
    ("limits", LimitsConfig),
    ("scrape", ScrapeConfig),
    ("engine_pulls", EnginePullsConfig),
    ("intent", IntentConfig),
    ("intent.intents[]", IntentSpec),
    ("intent.intents[].rules[]", RuleSpec),
    ("intent.classifier", ClassifierSpec),
    ("intent.classifier.embeddings", EmbeddingsSpec),
    ("intent.difficulty", DifficultySpec),
    ("disaggregation", DisaggregationConfig),
    ("burst", BurstConfig),
    ("burst.targets[]", CloudTargetConfig),
    ("budgets", BudgetsConfig),
    ("budgets.teams.<name> / keys.<name> / users.<name>", SubjectBudget),
    ("budgets.…limits[] / budgets.defaults.team[] / key[] / user[]", LimitConfig),
    ("budgets.prices.<model>", ModelPrice),
    ("flow_control", FlowControlConfig),
    ("flow_control.classes.<name>", FlowClassConfig),
    ("flow_control.margin", MarginConfig),
    ("flow_control.isolation", IsolationConfig),
    ("flow_control.leases", LeaseConfig),
    ("kv_tiers", KvTiersConfig),
    ("metrics", MetricsPageConfig),
)
"""Each table of the reference: its heading (where the section sits in the file) and the model whose fields it lists."""


def reference_markdown() -> str:
    """The configuration reference as Markdown tables, generated from the models' field docstrings."""
    out: list[str] = []
    for title, model in REFERENCE_SECTIONS:
        out.append(f"### `{title}`\n")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        for name, field in model.model_fields.items():
            default = "required" if field.is_required() else _show_default(field.get_default(call_default_factory=True))
            kind = _show_type(field.annotation)
            doc = (field.description or "").replace("\n", " ").replace("|", "\\|")
            out.append(f"| `{name}` | {kind} | {default} | {doc} |")
        out.append("")
    return "\n".join(out)


def _show_default(value: Any) -> str:
    if isinstance(value, StrEnum):
        return f"`{value.value}`"
    if isinstance(value, BaseModel):
        return "(see below)"
    if isinstance(value, dict):
        return ", ".join(f"`{k}`" for k in value) or "`{}`"
    if value is None:
        return "absent"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "(derived)"
    return f"`{value}`"


def _show_type(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return " \\| ".join(m.value for m in annotation)
    text = str(annotation)
    if text.startswith("<class '"):
        text = text[len("<class '") : -2]
    text = re.sub(r"\b[A-Za-z_]\w*\.(?=[A-Za-z_])", "", text)  # module prefixes: typing., pathlib., ...
    return text.replace("|", "\\|")
