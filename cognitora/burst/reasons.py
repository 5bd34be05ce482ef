"""The words of burst decisions: why a request went to the cloud, and why one that would have stayed local (the
``reason`` and ``why`` labels of the burst metrics, and the explanation's words)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["BurstReason", "Denied"]


class BurstReason(StrEnum):
    """Why a request went to a cloud target: the ``reason`` label of ``cognitora_burst_decisions_total``."""

    SATURATED = "saturated"
    """The best local predicted TTFT missed the class's burst threshold (``enter_ratio``/``exit_ratio`` x SLO)."""
    ITL_SATURATED = "itl_saturated"
    """The best local predicted inter-token latency missed the burst threshold of the class's ITL SLO."""
    NO_LOCAL_ENDPOINT = "no_local_endpoint"
    """No local endpoint was eligible (all unhealthy or full)."""
    NAMED = "named"
    """The request named the target and its team may (``burst.targets[].named_teams``)."""


class Denied(StrEnum):
    """Why a request that would have gone to the cloud stayed local: the ``why`` label of
    ``cognitora_burst_denied_total``."""

    TEAM = "team_not_allowed"
    NAMED = "named_not_allowed"
    """The request named a cloud target its team may not name (or no team): placed like its model."""
    NO_TARGET = "no_target_for_model"
    RETRY = "cloud_failed_this_request"
    SPEND = "spend_exhausted"
    UNHEALTHY = "cloud_unhealthy"
    RATE_LIMITED = "cloud_rate_limited"
    AT_CAPACITY = "cloud_at_capacity"
