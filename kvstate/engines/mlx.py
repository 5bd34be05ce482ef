"""MLX-LM ``mlx_lm.server``: ``/health`` only (engines.md 4.4).

No /metrics and no KV events: load comes from the router's own in-flight accounting, cache reuse from
``usage.prompt_tokens_details.cached_tokens`` in responses.
"""

from __future__ import annotations

from kvstate.engines.base import EngineSpec, no_metrics

__all__ = ["SPEC"]

KIND = "mlx"
HEALTH_PATH = "/health"

SPEC = EngineSpec(
    kind=KIND,
    health_path=HEALTH_PATH,
    metrics_path=None,
    load_from=no_metrics,
    known_metrics=frozenset(),
)
