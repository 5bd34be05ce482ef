"""The ``cost_model`` section: what long contexts cost an engine (``EnginePriors``, fleet-wide here and per
endpoint as ``models[].endpoints[].cost``), how ranking weighs those costs, and the TTFT feedback.
"""

from __future__ import annotations

from pydantic import Field

from cognitora.config.strict import StrictModel

__all__ = ["CostModelConfig", "EnginePriors", "TtftFeedbackConfig"]


class EnginePriors(StrictModel):
    """What one engine pays for long contexts, as the cost model needs it (docs/placement.md, "Long contexts").
    Every key may be set per endpoint (``models[].endpoints[].cost``); an unset one takes ``cost_model.priors``."""

    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    """Tokens the engine computes per scheduler step (vLLM/SGLang ``max_num_batched_tokens``, MLX's prefill step):
    a prefill of N uncached tokens takes ceil(N / this) steps, each of which also reads every running request's KV."""
    attention_context_tokens: float | None = Field(default=None, gt=0)
    """The context length at which a prefill token's attention costs as much as its linear layers: the prefill of
    the tokens from offset c to p costs ``((p - c) + (p^2 - c^2) / (2 x this)) / prefill_rate``. A property of the
    model's shape (4 x layers x hidden / (2 x parameters), scaled by the kernels' efficiency): ~22k for Llama-3.1-8B
    and ~36k for Qwen3-32B on H100s."""
    kv_read_s_per_token: float | None = Field(default=None, ge=0)
    """Seconds a scheduler step spends reading one resident context token's KV (bytes of KV per token / memory
    bandwidth): ~4.7e-8 for Llama-3.1-8B or Qwen3-32B TP2 on H100s, ~2.2e-7 on an M2 Ultra."""
    kv_capacity_tokens: int | None = Field(default=None, gt=0)
    """Tokens the engine's KV cache holds; learned from its metrics (vLLM ``cache_config_info`` num_gpu_blocks x
    block_size) when it reports them. Unknown: no KV-capacity charge and resident context from the routers' counts."""
    max_num_seqs: int | None = Field(default=None, gt=0)
    """Requests the engine runs at once (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``, llama.cpp
    ``-np``): a request beyond them waits for a running one to finish (the seat wait). vLLM and SGLang do not
    export it: set it to the engine's flag (vLLM's default is 1024 on a GPU of 70 GiB or more other than an A100,
    else 256). Unset: llama.cpp's ``/slots`` count, else unknown, and no seat wait."""


class TtftFeedbackConfig(StrictModel):
    """Online correction of each endpoint's predicted TTFT from what its requests achieved (docs/placement.md,
    "Feedback")."""

    enabled: bool = True
    """Learn and apply a per-endpoint bias factor; off: predictions are used as the model computes them."""
    alpha: float = Field(default=0.1, gt=0, le=1)
    """EWMA weight of one streamed attempt's log(achieved / predicted) ratio."""
    max_factor: float = Field(default=2.0, ge=1)
    """The factor is bounded to [1 / this, this]: feedback corrects a bias, it never overrules the model."""
    floor_s: float = Field(default=0.05, ge=0)
    """Added to both sides of the ratio (and taken off after): network and step overhead the model does not price
    would otherwise make every short request look 10x late."""
    half_life_s: float = Field(default=120.0, gt=0)
    """Without new samples the learned factor decays toward 1 with this half-life: an endpoint no longer picked
    (so never measured) is not held to an old verdict."""
    min_samples: int = Field(default=3, ge=1)
    """Samples an endpoint needs before its factor is applied."""
    relative: bool = True
    """Apply how much more (or less) an endpoint is off than its peers on predictions of the same size (its factor
    against the median of theirs, per power of two of the prediction): a bias the whole fleet shares (the gateway's
    own network time, a clock that runs at another rate, as the time-scaled simulator's) then moves no prediction,
    nor does an error the model makes on one size of request. False: the endpoint's absolute factor is applied."""


class CostModelConfig(StrictModel):
    """The long-context terms of the cost model: attention, decode interference by resident context, KV capacity,
    and the TTFT feedback (docs/placement.md, "Long contexts")."""

    priors: EnginePriors = Field(
        default_factory=lambda: EnginePriors(
            max_num_batched_tokens=8192,
            attention_context_tokens=24_000.0,
            kv_read_s_per_token=4.7e-8,
        )
    )
    """Fleet-wide priors for every engine that sets none of its own (``models[].endpoints[].cost``)."""
    decode_interference_weight: float = Field(default=1.0, ge=0)
    """Ranking charges this many times the decode slowdown a placement causes: the request's own decode over the
    context already resident there, plus what its context adds to every running request's steps while it decodes
    (``max_tokens`` tokens; 0 when the request sets none). 0 ranks by predicted TTFT and recompute charge alone."""
    prefill_stall_weight: float = Field(default=1.0, ge=0)
    """Ranking charges this many times the seconds the prefix a placement recomputes (although another candidate
    holds it) stalls the requests running there: each one's decode steps wait for the prefill's chunks, so a cache
    miss costs every neighbour, not only the request itself. 0 leaves it out."""
    kv_pressure_weight: float = Field(default=1.0, ge=0)
    """Multiplier of the KV-capacity term: a placement whose new blocks (uncached prompt + ``max_tokens``) would not
    fit beside the resident context waits for enough of it to leave (or preempts, and recomputes), in seconds."""
    seat_wait_weight: float = Field(default=1.0, ge=0)
    """Multiplier of the seat wait: on an engine whose seats (``max_num_seqs``) are all taken by the requests in
    flight there, a new one starts only when enough running ones finish, at the times their ages say
    (docs/placement.md, "Seats"). 0 leaves it out."""
    affinity_prompt_share: float = Field(default=0.5, ge=0, le=1)
    """The tie-breaking prefix key is taken at least this share of the way into the prompt (and at least
    ``placement.affinity_prefix_tokens`` deep): requests converge on what most of their prompt shares, so 30k-token
    prompts that share only a 200-token system prompt spread instead of hashing to one engine."""
    feedback: TtftFeedbackConfig = Field(default_factory=TtftFeedbackConfig)
    """Online bias correction of the predicted TTFT per endpoint."""
