"""``cognitora sim``: simulated vLLM engines for demos, tests and benchmarks (docs/sim.md).

Modules, one concept each:

- ``profiles``: hardware profiles and the step-time/power model calibrated to them;
- ``block_hash``: vLLM's ``sha256_cbor`` chained block hashes;
- ``kv_cache``: the paged prefix cache (capacity in blocks, ref counts, LRU eviction, cache events);
- ``scheduler``: continuous batching with chunked prefill, queueing and preemption;
- ``engine``: one engine driven by a (time-scaled) clock, with its metrics, power and faults;
- ``kv_events``: the ZMQ PUB stream and ROUTER replay, vLLM's wire format;
- ``metrics``, ``power``: ``/metrics`` with vLLM's and DCGM's names;
- ``tokenizer``: what the engine counts as tokens (HF tokenizer + chat template, or a documented built-in);
- ``server``: the OpenAI-compatible HTTP face and the fault API; ``fleet``: N engines in one process;
- ``cli``: ``cognitora sim fleet|engine``; ``launch``: ``start_fleet`` for tests and benchmarks.
"""

from cognitora_sim.launch import SimFleet, start_fleet
from cognitora_sim.profiles import PROFILES, HardwareProfile

__all__ = ["PROFILES", "HardwareProfile", "SimFleet", "start_fleet"]
