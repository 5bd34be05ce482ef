"""One small module per engine kind: its metric names, health route and how its /metrics read as load.

``ENGINES`` holds the built-in kinds (``vllm``, ``sglang``, ``llamacpp``, ``trtllm``, ``mlx``, ``openai``);
``ENGINES.get(kind)`` returns an ``EngineSpec`` or raises ``UnknownEngineError`` naming the known kinds.
"""

from kvstate.engines.base import EngineLoad, EngineSpec
from kvstate.engines.prom import MetricSamples, MetricsParseError, parse_prometheus_text
from kvstate.engines.registry import DuplicateEngineError, EngineRegistry, UnknownEngineError, builtin_engines

ENGINES: EngineRegistry = builtin_engines()

__all__ = [
    "ENGINES",
    "DuplicateEngineError",
    "EngineLoad",
    "EngineRegistry",
    "EngineSpec",
    "MetricSamples",
    "MetricsParseError",
    "UnknownEngineError",
    "builtin_engines",
    "parse_prometheus_text",
]
