"""The ``cpu`` profile: SmolLM2-135M-Instruct (bf16) on vLLM 0.32's CPU backend with one thread, as the project's
real-engine harness runs it (``tests/real_engines``: 128 KV blocks of 32 tokens, vLLM's default batching).

Unlike the GPU profiles, these figures are not derived from datasheets: they are fitted to what the real engine did
on this project's machine (2 shared cores), by ``python -m bench.cpu_calibration``, which measures TTFT of cold
prompts of several lengths, TTFT with the prompt's prefix cached, and decode pace alone and in a batch. The fit and
the measured points are in ``bench/results/cpu_calibration.md``; docs/sim.md compares the simulator on this profile
with the real engines on one workload.

Only plain numbers here (``profiles.py`` builds the ``HardwareProfile``), so this file imports nothing of the sim.
"""

from __future__ import annotations

# The engine alone, fitted on 2026-12-06 (bench/results/cpu_calibration.md): cold TTFT 0.25 s at 128 tokens to
# 10.6 s at 1,920 (attention dominates past ~400 tokens on this backend), a hit on 1,888 of 1,920 tokens 0.17-0.93 s,
# ITL 42 ms alone and 52 ms with 4 sequences; the machine's load average was 10-13 on its 2 cores (other work).
ALONE_OVERHEAD_S = 0.0467
ALONE_COMPUTE_TOKENS_PER_S = 890.9
ALONE_ATTN_S_PER_PAIR = 2.37e-6
ALONE_WEIGHTS_READ_S = 0.0011
ALONE_KV_READ_S_PER_TOKEN = 8.13e-6

# The benchmark's engines against that fit, refitted on 2026-12-07 to the committed run
# (`bench/results/real_engines.md`: an AMD EPYC host of 2 cores, engines at autogroup nice 10 with vLLM's `uni`
# executor) by `python -m bench.cpu_calibration --from-requests bench/results/real_engines_seed*.requests.jsonl.gz`:
# least squares over the 123 requests that ran with no other request in flight (TTFT and ITL; median error 12% and
# 9%). The fit before (0.206 and 0.837) was to the run of commit 523ee39, on a faster machine with vLLM's `mp`
# executor.
PREFILL_SLOWDOWN = 0.768
"""Scales a prefill's compute (the compute rate's inverse, the attention cost). Below 1: the calibration ran on a
machine at load average 10-13, the benchmark with nothing else running."""
STEP_SLOWDOWN = 0.704
"""Scales every step's fixed costs (overhead, weights read, KV read): per-step Python work, which a quiet machine
speeds up differently from prefill's matrix products. Under one factor for both, a fit to cold TTFT made the sim
decode 4x faster than the real engines (on the 523ee39 run)."""
