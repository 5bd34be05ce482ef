"""What the benchmarks and the tests both start: a real Redis, a real Redis Cluster, LiteLLM's custom auth module.

Here, not in tests/, so bench/ never imports tests/ (tests import it from here). It stays out of the product wheel
(``[tool.setuptools.packages.find]`` takes kvstate, cognitora and the adapters only).

- ``redis_server``: find or start a real ``redis-server`` (``REDIS_URL``, 127.0.0.1:6379, or a private one);
- ``redis_cluster``: a real 3-master Redis Cluster on free ports;
- ``team_key_auth``: a LiteLLM ``custom_auth`` module whose ``sk-team-<name>`` keys are team ``<name>``.
"""

__all__: list[str] = []
