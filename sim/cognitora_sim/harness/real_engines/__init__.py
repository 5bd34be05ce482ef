"""Real engines (vLLM CPU, llama.cpp) for the tests and benchmarks: provisioned once, cached, started on demand
(docs/real_engines.md)."""
