"""Hardware profiles: what one simulated engine is (model, accelerator, limits) and how long its steps take.

The step-time model is a roofline with a fixed overhead. One scheduler step runs ``batched_tokens`` tokens
(prefill chunks plus one token per decoding sequence) and reads the KV of every decoding sequence's context:

    step_s = overhead_s
           + max(weights_read_s, batched_tokens / compute_tokens_per_s)      # memory floor vs. matmul compute
           + prefill_attention_pairs * attn_s_per_pair                       # causal attention of prefill chunks
           + decode_context_tokens * kv_read_s_per_token                     # decode attention reads the KV

- A small decode batch is memory bound: every step streams the weights once (``weights_read_s``), so inter-token
  latency is flat in batch size until ``batched_tokens / compute_tokens_per_s`` overtakes it, and grows with the
  context each sequence attends to.
- A long prefill is compute bound: ``compute_tokens_per_s`` is the linear (matmul) token rate and attention adds
  ``n * (offset + n / 2)`` query-key pairs for a chunk of ``n`` tokens starting at ``offset``.

The numbers are derived from the model's size and the accelerator's published bandwidth and FLOPs, then checked
against published measurements of the same configuration; docs/sim.md cites them and bench/sim_calibration.py
prints the model's predictions next to them.

Power: a step draws ``idle + (peak - idle) * (floor + (1 - floor) * compute_share)`` where ``compute_share`` is the
fraction of the step spent in compute rather than waiting on memory; an engine with no step running draws ``idle``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cognitora_sim import profile_cpu


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    model: str
    accelerator: str
    gpus: int
    """Accelerators in the engine (tensor parallel); power is reported per accelerator."""
    overhead_s: float
    """Per-step scheduling, launch and sampling overhead."""
    weights_read_s: float
    """Time to stream the weights (per accelerator shard) from memory once: the floor of every step."""
    compute_tokens_per_s: float
    """Linear-layer token throughput when compute bound (large prefill chunks)."""
    attn_s_per_pair: float
    """Causal attention cost per (query token, context token) pair during prefill."""
    kv_read_s_per_token: float
    """Decode attention: time to read one context token's KV (all layers) once."""
    kv_capacity_tokens: int
    """Tokens the paged KV cache holds (num_gpu_blocks * block_size)."""
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    idle_watts: float
    """Per accelerator."""
    peak_watts: float
    """Per accelerator."""
    memory_bound_power_floor: float = 0.55
    """Share of (peak - idle) drawn by a purely memory-bound step."""
    kv_bytes_per_token: int = 131_072
    """KV bytes of one token, all layers (Llama-3.1-8B BF16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes): what a
    reload from the CPU offload tier moves."""

    def step_time(self, batched_tokens: int, prefill_attention_pairs: int, decode_context_tokens: int) -> float:
        """Seconds (engine time) one scheduler step takes; see the module docstring."""
        compute = batched_tokens / self.compute_tokens_per_s
        return (
            self.overhead_s
            + max(self.weights_read_s, compute)
            + prefill_attention_pairs * self.attn_s_per_pair
            + decode_context_tokens * self.kv_read_s_per_token
        )

    def step_power(self, batched_tokens: int, step_s: float) -> float:
        """Average watts (whole engine, all accelerators) drawn during a step of ``step_s`` seconds."""
        compute_s = batched_tokens / self.compute_tokens_per_s
        share = min(1.0, compute_s / step_s) if step_s > 0 else 0.0
        floor = self.memory_bound_power_floor
        per_gpu = self.idle_watts + (self.peak_watts - self.idle_watts) * (floor + (1.0 - floor) * share)
        return per_gpu * self.gpus


def _pairs(prompt_tokens: int) -> int:
    return prompt_tokens * (prompt_tokens + 1) // 2


# Derivations (docs/sim.md has the sources):
# - Llama-3.1-8B BF16: 16.1 GB of weights, 2 * 8.0e9 FLOPs per token, 128 KiB of KV per token
#   (32 layers * 8 KV heads * 128 dims * 2 (K,V) * 2 bytes); attention 4 * 32 layers * 4096 = 0.52 MFLOP per pair.
# - H100 SXM: 3.35 TB/s HBM3 (about 2.8 TB/s achieved), 989 TFLOP/s dense BF16 (about 55% achieved in prefill).
H100_LLAMA8B = HardwareProfile(
    name="h100",
    description="Llama-3.1-8B-Instruct BF16 on one H100 SXM 80GB, vLLM defaults",
    model="meta-llama/Llama-3.1-8B-Instruct",
    accelerator="NVIDIA H100 80GB HBM3",
    gpus=1,
    overhead_s=0.0009,
    weights_read_s=16.1e9 / 2.8e12,
    compute_tokens_per_s=989e12 * 0.55 / 16.0e9,
    attn_s_per_pair=0.52e6 / (989e12 * 0.40),
    kv_read_s_per_token=131072 / 2.8e12,
    kv_capacity_tokens=400_000,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=131072,
    idle_watts=75.0,
    peak_watts=700.0,
)

# - Qwen3-32B BF16, tensor parallel 2: 65.5 GB of weights (32.8 GB per GPU), 2 * 32.8e9 FLOPs per token,
#   256 KiB of KV per token (64 layers * 8 KV heads * 128 dims * 2 * 2 bytes), split over the two GPUs;
#   all-reduce overhead per layer folded into overhead_s; TP efficiency about 0.8 of two GPUs.
H100X2_QWEN32B = HardwareProfile(
    name="h100x2",
    kv_bytes_per_token=2 * 64 * 8 * 128 * 2,
    description="Qwen3-32B BF16 on two H100 SXM 80GB, tensor parallel 2, vLLM defaults",
    model="Qwen/Qwen3-32B",
    accelerator="NVIDIA H100 80GB HBM3",
    gpus=2,
    overhead_s=0.0030,
    weights_read_s=32.8e9 / 2.8e12,
    compute_tokens_per_s=2 * 0.8 * 989e12 * 0.55 / 65.5e9,
    attn_s_per_pair=4 * 64 * 5120 / (2 * 0.8 * 989e12 * 0.40),
    kv_read_s_per_token=262144 / (2 * 2.8e12),
    kv_capacity_tokens=300_000,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=40960,
    idle_watts=75.0,
    peak_watts=700.0,
)

# - Llama-3.1-8B-Instruct 4-bit (MLX, group size 64): about 4.5 GB of weights; M2 Ultra: 800 GB/s unified memory,
#   about 75% achieved by MLX decode (M3 Ultra, 819 GB/s: 119 tok/s measured for this model, so ~8.4 ms a token).
#   Prefill fitted to two published points: ~1,200 tok/s on short prompts and 869 tok/s on a 33,898-token prompt
#   (a 7B 4-bit model on an M2 Ultra), which gives the attention coefficient. mlx_lm.server batches few requests
#   and prefills in steps of 2,048 tokens; KV in unified memory (192 GB machine, 64k tokens kept by default).
MAC_M2ULTRA_LLAMA8B_4BIT = HardwareProfile(
    name="mac",
    description="Llama-3.1-8B-Instruct 4-bit on an Apple M2 Ultra (76-core GPU) with MLX (mlx_lm.server)",
    model="mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
    accelerator="Apple M2 Ultra",
    gpus=1,
    overhead_s=0.0009,
    weights_read_s=4.5e9 / (800e9 * 0.75),
    compute_tokens_per_s=1200.0,
    attn_s_per_pair=1.87e-8,
    kv_read_s_per_token=131072 / (800e9 * 0.75),
    kv_capacity_tokens=64_000,
    max_num_seqs=8,
    max_num_batched_tokens=2048,
    max_model_len=131072,
    idle_watts=12.0,
    peak_watts=90.0,
)

# SmolLM2-135M on vLLM's CPU backend, one thread: measured on this project's machine (profile_cpu.py says how).
CPU_SMOLLM2 = HardwareProfile(
    name="cpu",
    description="SmolLM2-135M-Instruct bf16 on vLLM 0.32 CPU backend, 1 thread, on a quiet 2-core machine",
    model="HuggingFaceTB/SmolLM2-135M-Instruct",
    accelerator="CPU (1 thread, AVX2)",
    gpus=1,
    overhead_s=profile_cpu.ALONE_OVERHEAD_S * profile_cpu.STEP_SLOWDOWN,
    weights_read_s=profile_cpu.ALONE_WEIGHTS_READ_S * profile_cpu.STEP_SLOWDOWN,
    compute_tokens_per_s=profile_cpu.ALONE_COMPUTE_TOKENS_PER_S / profile_cpu.PREFILL_SLOWDOWN,
    attn_s_per_pair=profile_cpu.ALONE_ATTN_S_PER_PAIR * profile_cpu.PREFILL_SLOWDOWN,
    kv_read_s_per_token=profile_cpu.ALONE_KV_READ_S_PER_TOKEN * profile_cpu.STEP_SLOWDOWN,
    kv_capacity_tokens=128 * 32,
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    max_model_len=2048,
    idle_watts=5.0,
    peak_watts=15.0,
    # 30 layers x 3 KV heads x 64 dims x 2 (K, V) x 2 bytes
    kv_bytes_per_token=30 * 3 * 64 * 2 * 2,
)

PROFILES: dict[str, HardwareProfile] = {
    p.name: p for p in (H100_LLAMA8B, H100X2_QWEN32B, MAC_M2ULTRA_LLAMA8B_4BIT, CPU_SMOLLM2)
}


class UnknownProfileError(ValueError):
    pass


def get_profile(name: str) -> HardwareProfile:
    try:
        return PROFILES[name.strip()]
    except KeyError:
        raise UnknownProfileError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}") from None


def profiles_for_fleet(spec: str, engines: int) -> list[HardwareProfile]:
    """``"h100,h100,mac"`` cycled over ``engines`` engines."""
    names = [s for s in (x.strip() for x in spec.split(",")) if s]
    if not names:
        raise UnknownProfileError("empty --profile; give a name or a comma list, e.g. h100,h100,mac")
    chosen = [get_profile(n) for n in names]
    return [chosen[i % len(chosen)] for i in range(engines)]


def predicted_ttft(profile: HardwareProfile, prompt_tokens: int) -> float:
    """TTFT of a lone request with no cache hit: its prefill in chunks of max_num_batched_tokens."""
    t, done, chunk = 0.0, 0, profile.max_num_batched_tokens
    while done < prompt_tokens:
        n = min(chunk, prompt_tokens - done)
        pairs = _pairs(done + n) - _pairs(done)
        t += profile.step_time(n, pairs, 0)
        done += n
    return t


def predicted_itl(profile: HardwareProfile, batch: int, context_tokens: int) -> float:
    """Inter-token latency of ``batch`` sequences decoding together, each attending ``context_tokens``."""
    return profile.step_time(batch, 0, batch * context_tokens)
