"""The decision core both gateways call: ``Core.open(config)`` (``cognitora.core.core``) builds it once.

Rooms, in the order a request meets them: ``keying`` (the prompt's keys), ``fleet_view`` (the state placement
reads), ``router`` (``admit`` and ``place``), ``attempt`` (one dispatched request: once, in order, from any
thread), ``lifecycle`` (every attempt: counting, redispatch, settling, forgetting), ``learning`` (what finished
attempts teach), ``outcome`` (how an attempt ended: a leaf). Nothing is imported here: import the module you need.
"""

__all__: list[str] = []
