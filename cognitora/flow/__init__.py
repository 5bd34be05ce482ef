"""Flow control: requests wait at the gateway while the fleet is saturated for them, by priority band and fair
across teams (by the prefill they really add), and are placed when they leave, on the fleet as it is then.

| module | what |
|---|---|
| ``config`` | the ``flow_control:`` section |
| ``bands`` | priority classes in dispatch order, with their limits |
| ``saturation`` | whether a placement says "wait", and what a request costs its flow |
| ``priority`` | strict priority at admission: a lower band held under an active higher band's objective |
| ``margin`` | the prediction margin: a measured quantile of achieved / predicted TTFT, applied to admission |
| ``isolation`` | team isolation: no team's in-flight prefill takes every engine while another team is active |
| ``fair_queue`` | the order: strict bands with an aged share, virtual-time DRR across flows, FIFO within |
| ``controller`` | ``FlowController``: the asyncio queue, its dispatcher and wake-ups, timeouts, cancellation |
| ``outcome`` | what the queue hands back (``QueueRefusal``, ``Departure``) and asks (``Placer``, ``Held``) |
| ``drain_rate`` | the recent dispatch rate, for Retry-After |
| ``snapshot`` | a typed snapshot for metrics, and ``cognitora explain``'s sentence |
| ``leases``, ``redis_leases`` | per-engine leases, queue depths and margins shared by replicas (Redis, heartbeat TTL) |
| ``shared_served`` | fairness counters shared by replicas |

docs/flow_control.md describes the design, its bounds and its limits.
"""

from cognitora.flow.bands import Band, plan_bands
from cognitora.flow.config import (
    FairnessCost,
    FlowClassConfig,
    FlowControlConfig,
    HoldReason,
    IsolationConfig,
    LeaseConfig,
    MarginConfig,
)
from cognitora.flow.controller import FlowController, Ticket
from cognitora.flow.leases import FairCharge, LeaseGrant, Leases, MemoryLeases, SharedMargin
from cognitora.flow.margin import FleetMargin, PredictionMargin, most_cautious
from cognitora.flow.outcome import Departure, Held, Left, Placer, QueueRefusal, WakeReason
from cognitora.flow.saturation import Saturation, request_cost, saturation_of
from cognitora.flow.snapshot import QueueSnapshot, wait_explanation

__all__ = [
    "Band",
    "Departure",
    "FairCharge",
    "FairnessCost",
    "FleetMargin",
    "FlowClassConfig",
    "FlowControlConfig",
    "FlowController",
    "Held",
    "HoldReason",
    "IsolationConfig",
    "LeaseConfig",
    "LeaseGrant",
    "Leases",
    "Left",
    "MarginConfig",
    "MemoryLeases",
    "Placer",
    "PredictionMargin",
    "QueueRefusal",
    "QueueSnapshot",
    "Saturation",
    "SharedMargin",
    "Ticket",
    "WakeReason",
    "most_cautious",
    "plan_bands",
    "request_cost",
    "saturation_of",
    "wait_explanation",
]
