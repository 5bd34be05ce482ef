"""Burst to a cloud provider when the local fleet cannot meet a priority class's SLO (docs/burst.md).

- ``config``: the ``burst:`` section of ``cognitora.yaml`` (targets, who may burst, hysteresis).
- ``saturation``: per (model, class) hysteresis with a minimum dwell: when to send requests to the cloud.
- ``cloud_state``: each target's 429/Retry-After, unreachability and in-flight count, learned from outcomes.
- ``spend``: the ``SpendGate`` protocol (cloud spend per team) and its in-process implementation.
- ``policy``: the burst decision itself, and its reason.
"""

__all__: list[str] = []
