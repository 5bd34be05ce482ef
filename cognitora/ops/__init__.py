"""Running Cognitora as a service: readiness probes (``health``), draining at shutdown (``drain``), reloading the
configuration without a restart (``reload``). docs/operations.md."""

__all__: list[str] = []
