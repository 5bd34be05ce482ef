"""Per-team token budgets: limits in ``cognitora.yaml`` (``budgets:``), reserved at placement and settled at the
finish in ONE atomic step per request, in Redis or in process, reported from the store alone.

Modules: ``config`` (the section's models), ``windows`` (calendar and rolling windows), ``plan`` (a request's
counters and amounts), ``ledger`` (the store protocol), ``memory_ledger`` / ``redis_ledger`` (its two backends,
``redis_scripts`` the Lua), ``gate`` (what the Router calls: reserve, settle, fail-open backlog), ``charges`` (the
typed API for spend recorded outside placement), ``report`` and ``cli`` (``cognitora budgets``), ``metrics``.
"""

__all__: list[str] = []
