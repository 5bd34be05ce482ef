"""Any OpenAI-compatible server: health only.

The OpenAI API guarantees no health route and no metrics; ``GET /v1/models`` is the one read-only route every such
server answers. A server that wants an API key answers it with 401/403: that still proves it is up, so any status
below 500 counts as healthy.
"""

from __future__ import annotations

from kvstate.engines.base import EngineSpec, no_metrics

__all__ = ["SPEC", "answers"]

KIND = "openai"
HEALTH_PATH = "/v1/models"


def answers(status: int) -> bool:
    return status < 500


SPEC = EngineSpec(
    kind=KIND,
    health_path=HEALTH_PATH,
    metrics_path=None,
    load_from=no_metrics,
    known_metrics=frozenset(),
    healthy_status=answers,
)
