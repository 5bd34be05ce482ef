"""The schema of ``cognitora.yaml``: one frozen pydantic model per section, each field documented where it is declared.

Every model forbids unknown keys (a typo is an error with a suggestion, ``cognitora.config.errors``) and is frozen.
A field's docstring is its row of docs/config.md (``cognitora.config.reference``). Reading a file, the environment
and file paths is the loader's (``cognitora.config.loader``); the checks that span sections (unique names, files
that exist) run there too, after these models validate.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cognitora.budgets.config import BudgetsConfig
from cognitora.burst.config import BurstConfig
from cognitora.flow.config import FlowControlConfig
from cognitora.identity import DEFAULT_PRIORITY as IDENTITY_DEFAULT_PRIORITY
from cognitora.intent.policy import IntentConfig
from cognitora.metrics.cors import MetricsPageConfig
from cognitora.redaction import redact_url, register_url_password

__all__ = [
    "DEFAULT_PRIORITY",
    "CognitoraConfig",
    "CostModelConfig",
    "DisaggregationConfig",
    "EndpointConfig",
    "EngineKind",
    "EnginePriors",
    "EnginePullsConfig",
    "KvTiersConfig",
    "LimitsConfig",
    "ModelConfig",
    "PlacementConfig",
    "PowerSourceConfig",
    "PriorityClass",
    "Role",
    "ScrapeConfig",
    "TtftFeedbackConfig",
]

DEFAULT_PRIORITY = IDENTITY_DEFAULT_PRIORITY
"""The priority class a request gets when it names none; every config has it."""


class EngineKind(StrEnum):
    """What serves an endpoint: decides the metric names scraped and whether KV events exist."""

    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMACPP = "llamacpp"
    MLX = "mlx"
    TRTLLM = "trtllm"
    OPENAI = "openai"


class Role(StrEnum):
    """An endpoint's part in serving: whole requests (``both``), or one side of prefill/decode disaggregation."""

    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _check_http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"expected an http(s) URL like http://127.0.0.1:8000, got {value!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise ValueError(f"bad port in URL {value!r}") from exc
    return value.rstrip("/")


def _check_zmq_address(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in {"tcp", "ipc", "inproc"}:
        raise ValueError(f"expected a ZMQ address like tcp://127.0.0.1:5557, got {value!r}")
    return value


class PowerSourceConfig(_Strict):
    """Where an endpoint's power is measured: a page with the DCGM exporter's names (dcgm-exporter, or
    ``cognitora node-agent``) and which of the node's GPUs the endpoint uses (docs/power.md)."""

    url: str
    """The page's URL, e.g. ``http://gpu-node-1:9400/metrics`` (no path: ``/metrics``)."""
    gpus: list[int | str] = Field(default_factory=list)
    """The GPUs this endpoint runs on, by NVML index (the page's ``gpu`` label) or UUID (``GPU-...``); their power
    and energy are summed. Empty: every GPU on the page (an exporter that serves this endpoint alone)."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        url = _check_http_url(value)
        return url if urlsplit(url).path not in {"", "/"} else url.rstrip("/") + "/metrics"

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[int | str]) -> list[int | str]:
        for gpu in value:
            if isinstance(gpu, int) and gpu < 0:
                raise ValueError(f"a GPU index is 0 or more, got {gpu}")
            if isinstance(gpu, str) and not gpu.strip():
                raise ValueError("a GPU UUID must not be empty")
        if len({str(g) for g in value}) != len(value):
            raise ValueError(f"a GPU is listed twice in {value}")
        return value


class EnginePriors(_Strict):
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


class EndpointConfig(_Strict):
    """One inference engine serving the model."""

    url: str
    """Base URL of the engine's OpenAI-compatible server, e.g. ``http://127.0.0.1:8001``."""
    id: str = ""
    """Endpoint id used in the store and handed to the gateway; default ``host:port`` of ``url``."""
    engine: EngineKind = EngineKind.VLLM
    """Engine kind: vllm, sglang, llamacpp, mlx, trtllm or openai."""
    kv_events: str | None = None
    """ZMQ PUB address of the engine's KV-cache event stream (vLLM/SGLang); absent: text-approximate history only."""
    kv_events_replay: str | None = None
    """ZMQ ROUTER address that replays missed KV events by sequence number (vLLM)."""
    role: Role = Role.BOTH
    """``both`` serves whole requests; ``prefill``/``decode`` are the halves of a disaggregated pair."""
    prefill_tokens_per_s: float | None = Field(default=None, gt=0)
    """Prior prefill throughput (tokens/s) until one is learned from the engine's metrics."""
    hardware: str | None = None
    """What the engine runs on (e.g. ``h100x2``, ``m2-ultra``). Endpoints alike in engine kind, this label and their
    priors are one hardware class, and learned prefill rates are pooled within it
    (``placement.rate_pooling_band``): label engines whose hardware differs by less than that band."""
    decode_tokens_per_s: float | None = Field(default=None, gt=0)
    """Prior per-sequence decode speed (tokens/s) until one is learned from the engine's metrics; the power rule's
    E2E bound needs one (docs/placement.md)."""
    joules_per_token: float | None = Field(default=None, gt=0)
    """Prior marginal energy per token (J), until one is learned from the power meter; absent: no power preference."""
    cost: EnginePriors = Field(default_factory=lambda: EnginePriors())
    """This engine's long-context priors (step size, attention, KV read, KV capacity); unset keys take
    ``cost_model.priors``. Set them for hardware unlike the rest of the fleet (docs/placement.md, "Long contexts")."""
    power: PowerSourceConfig | None = None
    """A separate power page for this endpoint's GPUs (``{url: http://node:9400/metrics, gpus: [0, 1]}``); absent:
    power is read from DCGM names on the engine's own /metrics, when it has them."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_http_url(value)

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _zmq(cls, value: str | None) -> str | None:
        return None if value is None else _check_zmq_address(value)

    @model_validator(mode="after")
    def _default_id(self) -> EndpointConfig:
        if not self.id:
            parts = urlsplit(self.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            object.__setattr__(self, "id", f"{parts.hostname}:{port}")
        return self


class ModelConfig(_Strict):
    """A model name clients send, and the engines that serve it."""

    name: str = Field(min_length=1)
    """The model name clients send (the ``model`` field of the request)."""
    block_size: int = Field(default=16, gt=0)
    """Tokens per KV block; must equal the engines' block size (vLLM 16, TRT-LLM 32, SGLang page size)."""
    tokenizer: Path | None = None
    """The model's ``tokenizer.json`` (relative to the config file), or the Hugging Face id of a model whose
    tokenizer ships with Cognitora (``cognitora.shipped_tokenizers``): makes block keys token-exact."""
    chat_template: Path | None = None
    """The chat template (Jinja); default: ``chat_template.jinja`` or ``tokenizer_config.json`` beside the tokenizer."""
    loras: list[str] = Field(default_factory=list)
    """LoRA adapters the engines serve on this model (vLLM ``--lora-modules`` names). A request whose ``model`` is
    one of them goes to this model's endpoints, its block keys rooted at the adapter, as the engines' KV events are."""
    endpoints: list[EndpointConfig] = Field(min_length=1)
    """The engines serving this model (at least one)."""
    kv_bytes_per_token: int | None = Field(default=None, gt=0)
    """Bytes of KV cache one token takes on the engines (layers x KV heads x head dim x 2 x dtype bytes; Llama-3-8B
    in bf16: 131072). Prices the KV transfer of a prefill/decode pair; absent: ``disaggregation.kv_bytes_per_token``."""


class PriorityClass(_Strict):
    """A request class with a time-to-first-token objective."""

    ttft_slo_s: float = Field(gt=0)
    """Predicted TTFT (seconds) the class must meet; endpoints predicted slower are not 'feasible' for it."""
    itl_slo_s: float | None = Field(default=None, gt=0)
    """Inter-token latency (seconds) the class must meet: an endpoint whose decode step, as its engine measures it
    now plus the context this request and the ones sent since add to every step, is slower is not 'feasible' for
    it either. Overload then sheds (a sheddable class) instead of slowing every running request's stream past it
    (docs/placement.md, "Admission by ITL"). None: no ITL objective."""
    sheddable: bool = False
    """When no endpoint meets the SLO: true rejects with 429 and Retry-After; false takes the best endpoint."""


def _default_priorities() -> dict[str, PriorityClass]:
    return {
        DEFAULT_PRIORITY: PriorityClass(ttft_slo_s=2.0, sheddable=False),
        "batch": PriorityClass(ttft_slo_s=30.0, sheddable=True),
    }


class PlacementConfig(_Strict):
    """The placement model's weights. Every term is in seconds or tokens; see docs/placement.md."""

    default_prefill_tokens_per_s: float = Field(default=10000.0, gt=0)
    """Prefill throughput (tokens/s) assumed for an endpoint with neither a learned rate nor a configured prior."""
    rate_pooling_band: float = Field(default=1.5, ge=1.0)
    """Learned prefill rates within one hardware class (``endpoints[].hardware``, engine kind, priors) that lie
    within this factor of each other are priced at their median: what an engine learns carries the prompts it
    happened to serve, and identical engines learned apart drew unequal shares. Rates further apart are kept
    (different hardware, or a slowed engine). Learned energy per token is pooled the same way, within a class that
    also shares the ``joules_per_token`` prior. 1 turns pooling off."""
    kv_usage_limit: float = Field(default=0.97, gt=0, le=1)
    """KV-cache usage (0..1) above which an endpoint is filtered out, unless no other endpoint is left."""
    decode_penalty_s_per_running: float = Field(default=0.0002, ge=0)
    """Seconds added to predicted TTFT per request running on the endpoint (decode steps share the batch)."""
    slot_wait_weight: float = Field(default=0.0, ge=0)
    """Multiplier of the slot-wait term (seconds a request waits for a free batch slot on an engine at capacity).
    0 (off) by default: on the B2B-SaaS benchmark it moved groups off the engine holding their prefix whenever
    engines queued, duplicating 6,000-token prefixes until every KV cache was full (top-stage TTFT p50 27.6 s vs
    0.18 s with it off; bench/results and docs/placement.md, "Saturation"). The term prices the wait but not the
    KV a cache miss costs; 1 turns it on as documented."""
    saturated_kv_usage: float = Field(default=0.97, gt=0, le=1)
    """KV-cache usage (0..1) at or above which an endpoint counts as at capacity even with nothing waiting: a new
    request then waits for running ones to finish (the slot-wait term; docs/placement.md)."""
    waiting_request_tokens: int = Field(default=512, ge=0)
    """Prefill tokens assumed per request the engine reports waiting, when that exceeds what routers counted: a
    prior (the snapshot has no request counter to learn a mean from; see docs/placement.md)."""
    speculative_ttl_s: float = Field(default=10.0, gt=0)
    """How long a routed prompt's blocks count as cached on its endpoint before the engine's events confirm them."""
    routing_history_ttl_s: float = Field(default=300.0, gt=0)
    """For endpoints without ``kv_events`` (llama.cpp, MLX, ...), how long a routed prompt counts as cached there:
    the router's own routing history is their only prefix index."""
    inflight_ttl_s: float = Field(default=900.0, gt=0)
    """A dispatched request stops counting as in flight after this long, even if its end is never reported."""
    prefill_report_factor: float = Field(default=4.0, gt=0)
    """A dispatched request whose first token is never reported stops counting as queued prefill after this many
    times its predicted TTFT (or ``prefill_report_min_s``, whichever is longer): some gateways (LiteLLM's SDK
    streams) have no first-token hook, and a prefill counted until the stream ends makes its engine look swamped."""
    prefill_report_min_s: float = Field(default=10.0, gt=0)
    """The shortest such deadline (seconds): a first token reported late must still arrive before it."""
    unhealthy_mark_ttl_s: float = Field(default=30.0, gt=0)
    """A gateway's "this endpoint failed" mark lasts this long (or until a newer healthy scrape): then the endpoint
    is tried again, so it comes back even where no scraper runs. The scraper's own health verdict still applies."""
    snapshot_max_age_s: float = Field(default=10.0, gt=0)
    """Scraped load older than this is ignored (router-counted in-flight work is still used)."""
    state_max_age_s: float = Field(default=10.0, gt=0)
    """The fleet state a decision reads is stale when the newest collector heartbeat in the store is older than
    this (the collector died, or cannot reach the store), or when none has arrived this long after the router
    started. A stale decision is still made, on what the store holds, and says so: ``Decision.stale_state``, a note
    in its reason and in ``cognitora explain``, ``RouterStats.stale_state``, and a warning logged at most once a
    minute. The collector beats every quarter of its own ``state_max_age_s`` (at least once a second)."""
    power_ttft_slack_s: float = Field(default=0.05, ge=0)
    """Power rule: a candidate counts as close when its predicted TTFT is within this many seconds of the best
    AND within ``power_ttft_slack_ratio`` of it (the smaller bound applies), and its ranking cost within as much of
    the best's; among close ones, the lowest energy for the request wins. The rule never costs a request more than
    this, nor more than that fraction, and never trades away more than that of the recompute and interference
    charges."""
    power_ttft_slack_ratio: float = Field(default=0.1, ge=0)
    """Power rule: the slack as a fraction of the best predicted TTFT; the slack is the smaller of the two."""
    power_e2e_slack_s: float = Field(default=0.3, ge=0)
    """Power rule, end to end: a greener candidate is taken only when its predicted E2E (TTFT + the request's
    expected decode tokens at the engine's learned per-sequence decode speed) is within this many seconds of the
    fastest predicted E2E AND within ``power_e2e_slack_ratio`` of it (the smaller bound applies). Packing onto one
    engine slows every sequence's decode there; this bound stops the rule once that costs more than it allows.
    A candidate whose decode speed is unknown is not taken for energy when the request expects decode tokens."""
    decode_itl_s_per_running: float = Field(default=0.0001, ge=0)
    """Power rule's E2E estimate: seconds each running sequence adds to an engine's inter-token latency (decode
    attention reads its KV every step: ~0.1 ms for a 2k-token context of an 8B or 32B model on H100s). Used to
    charge the request's own load, and to estimate the pace of an engine that has not decoded yet from the others'
    learned paces (docs/placement.md)."""
    power_e2e_slack_ratio: float = Field(default=0.1, ge=0)
    """Power rule: the E2E slack as a fraction of the fastest predicted E2E; the slack is the smaller of the two."""
    power_energy_band_ratio: float = Field(default=0.2, ge=0)
    """Power rule: request energies within this fraction of the lowest count as equal (marginal J/token is
    learned, noisy, and lower on a busier engine of the same hardware; a smaller gap would herd on noise)."""
    recompute_weight: float = Field(default=1.0, ge=0)
    """Ranking charges each candidate this many times its prefill time for the request, on top of the predicted
    TTFT: the capacity a recomputed prefix takes from later requests (and the KV it duplicates, evicting others'
    prefixes). 1 counts that cost once; 0 ranks by predicted TTFT alone, which on B2B SaaS scattered groups over
    engines until every KV cache was full (docs/placement.md, "Bursts of one prefix")."""
    tie_band_s: float = Field(default=0.005, ge=0)
    """Predicted TTFTs within this many seconds of the best are equal (or within ``tie_band_ratio`` of it, whichever
    is larger): the prompt's prefix hash picks among them, so a slightly higher learned rate does not herd."""
    tie_band_ratio: float = Field(default=0.05, ge=0)
    """The tie band as a fraction of the best predicted TTFT (the error of a learned prefill rate)."""
    affinity_prefix_tokens: int = Field(default=256, gt=0)
    """Depth (tokens) of the prefix whose key breaks ties: requests sharing this much of a prompt go to the same
    one of equally good endpoints. Shorter prompts use their last full block."""
    store_timeout_s: float = Field(default=0.25, gt=0)
    """A store read slower than this counts as unavailable: the decision is made degraded, not late."""
    on_error: Literal["fallback", "reject"] = "fallback"
    """When placement itself fails (a bug, never a bad request or the store being down): ``fallback`` serves the
    request on the eligible endpoint with the least work in flight (still counted), ``reject`` answers 503. Either
    way the error is counted and logged at most once a minute."""
    priorities: dict[str, PriorityClass] = Field(default_factory=_default_priorities)
    """Priority classes by name; requests name one (default ``default``)."""

    @model_validator(mode="after")
    def _has_default_priority(self) -> PlacementConfig:
        if DEFAULT_PRIORITY not in self.priorities:
            raise ValueError(f"priorities must define {DEFAULT_PRIORITY!r} (used when a request names no class)")
        return self


class TtftFeedbackConfig(_Strict):
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


class CostModelConfig(_Strict):
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


class LimitsConfig(_Strict):
    """What one request may cost a gateway, so that none stalls it: how large a prompt is tokenized exactly, and
    where (docs/config.md, "Large prompts"). A prompt's size is counted before it is rendered or tokenized: its
    characters of text, plus 4 for each token id and each other JSON value (a message, a part: markup around it)."""

    exact_prompt_max_chars: int = Field(default=262_144, gt=0)
    """The largest prompt (characters) whose block keys are token-exact. Tokenizing costs one core ~1 us per
    character of English text, up to ~3 for CJK, so the default (~64k English tokens) costs well under a second,
    on a worker thread. A larger prompt is handled as ``over_limit`` says, without tokenizing it."""
    over_limit: Literal["approximate", "reject"] = "approximate"
    """A prompt over ``exact_prompt_max_chars``: ``approximate`` places it on text-approximate keys of its first
    ``exact_prompt_max_chars`` characters (they match this gateway's routing history, not the engines' KV events)
    and a token count estimated from its size; ``reject`` refuses it with 413 and a message giving the limit. A
    token-id prompt over the limit gets exact keys for its leading ids instead, or the same 413."""
    inline_tokenize_max_chars: int = Field(default=8192, ge=0)
    """A prompt whose text not already in the tokenizer's piece cache is at most this many characters is keyed on
    the gateway's event loop (10 to 25 ms at most, no thread hop: the common case, a cached system prompt and a new
    question); a larger one on a worker thread, while the loop serves other requests."""
    offload_queue_max_chars: int = Field(default=524_288, ge=0)
    """At most this many characters of prompts wait for (or run on) the keying thread; a prompt that would exceed it
    gets text-approximate keys at once instead of queueing, so a burst of long prompts delays none of them by more
    than this much tokenizing (~0.5 s of English). A prompt alone on the thread always runs."""
    block_key_memo_bytes: int = Field(default=32 << 20, ge=0)
    """Bound of each model's memo of block keys already computed (bytes: token ids and keys as Python holds them):
    a prompt reuses the keys of the whole blocks it shares with the latest prompt that began with the same block,
    so a shared system prompt is hashed once (kvstate/key_memo.py). When full it is emptied and refills. 0 turns it
    off."""
    match_checkpoint_ttl_s: float = Field(default=1.0, ge=0)
    """How long a prefix-match checkpoint is kept (stores that take them: Redis). Requests that share a system prompt
    then have the store walk only the blocks after it, once a few block strings show that the prompt's holders have
    not changed (kvstate/store.py, ``MatchCheckpoint``); a block lost inside the prompt, or moved between tiers, goes
    unseen for at most this long. 0 turns it off."""
    gc_pacing_s: float = Field(default=0.05, ge=0)
    """In a LiteLLM proxy: Python's garbage collections run from the core's event loop every this many seconds
    instead of at arbitrary allocations, which can crash the proxy (a CPython bug that LiteLLM's context variables
    reach: docs/litellm.md, "Garbage collection"). Read when the core starts. 0 leaves Python's collector as it is."""
    tokenizer_cache_bytes: int = Field(default=64 << 20, ge=0)
    """Bound of each model tokenizer's piece cache (bytes, as Python holds the text and token ids); a piece larger
    than a sixteenth of it is encoded but not kept. 0 turns the cache off."""


class KvTiersConfig(_Strict):
    """What reusing a prefix held off the GPU costs: engines that offload KV to host memory or disk (vLLM's CPU
    offloading, LMCache) report those blocks with their ``medium``; placement counts them as cached and adds the
    time to load them back, in seconds (docs/tiers.md)."""

    kv_bytes_per_token: int = Field(default=131_072, gt=0)
    """KV-cache bytes of one token (all layers, K and V): ``2 x layers x kv_heads x head_dim x dtype bytes``.
    Default: Llama-3.1-8B in BF16 (2 x 32 x 8 x 128 x 2 bytes = 128 KiB)."""
    cpu_gb_per_s: float = Field(default=25.0, gt=0)
    """Host memory to GPU bandwidth (GB/s) a reload achieves; default: about 40% of PCIe 5.0 x16's 64 GB/s."""
    disk_gb_per_s: float = Field(default=3.0, gt=0)
    """Disk (or remote store) to GPU bandwidth (GB/s) a reload achieves; default: one NVMe SSD's sequential read."""


class ScrapeConfig(_Strict):
    """How the collector polls engines' ``/metrics``."""

    interval_s: float = Field(default=1.0, gt=0)
    """Seconds between two scrapes of one endpoint."""
    timeout_s: float = Field(default=0.5, gt=0)
    """A scrape slower than this fails; repeated failures mark the endpoint unhealthy."""


class EnginePullsConfig(_Strict):
    """What the collector asks engines for beside ``/metrics``, per kind (docs/mixed_fleets.md)."""

    llamacpp_slots: bool = True
    """Poll llama.cpp's ``GET /slots`` for busy slots and context size; a server answering 404 or 501
    (``--no-slots``) is asked once and then left alone."""
    trtllm_kv_events: bool = True
    """Drain TRT-LLM's ``POST /kv_cache_events`` on ``engine: trtllm`` endpoints without ``kv_events`` (ZMQ). It
    DRAINS the engine's buffer: turn it off when something else (Dynamo) reads those events."""
    trtllm_kv_events_interval_s: float = Field(default=0.25, gt=0)
    """Seconds between two drains of one TRT-LLM engine's events."""
    vllm_kv_event_sources: bool = True
    """Read ``GET /kv_event_sources`` of ``engine: vllm`` endpoints without ``kv_events`` and subscribe to every
    data-parallel rank's stream it names (``cognitora.kv_event_sources``)."""
    vllm_kv_event_sources_interval_s: float = Field(default=5.0, gt=0)
    """Seconds between two reads of one engine's ``/kv_event_sources`` (a restarted engine's new ports are followed)."""


class DisaggregationConfig(_Strict):
    """Prefill/decode disaggregation: how a pair's KV transfer is priced (docs/disaggregation.md). Used only by
    models with ``role: prefill`` endpoints; their ``role: decode`` endpoints are addressed at their
    ``cognitora pd-sidecar``."""

    link_gbps: float = Field(default=100.0, gt=0)
    """Bandwidth of the link a pair's KV crosses, gigabits per second (RDMA NIC, NVLink, or TCP)."""
    link_latency_s: float = Field(default=0.001, ge=0)
    """Fixed cost of one KV transfer (seconds): the handshake and the first bytes, whatever the size."""
    kv_bytes_per_token: int = Field(default=131072, gt=0)
    """KV bytes per token for a model that does not set ``models[].kv_bytes_per_token`` (Llama-3-8B, bf16)."""
    min_gain_s: float = Field(default=0.0, ge=0)
    """A pair is placed only when its predicted TTFT beats the best whole placement by more than this (seconds):
    a split costs two engines' capacity for one request."""
    whole_on_decode: bool = True
    """Decode endpoints may take a request whole (their sidecar prefills locally) when that is predicted faster.
    False keeps their batches for decoding (classic P/D): every request is split while a prefill endpoint is up,
    unless a ``role: both`` endpoint is faster."""


class CognitoraConfig(_Strict):
    """The whole of ``cognitora.yaml``."""

    redis_url: str | None = None
    """Redis shared by gateway replicas and the collector; absent: an in-process store (one gateway process)."""
    key_prefix: str = Field(default="cog", min_length=1)
    """Prefix of every Redis key Cognitora writes."""
    redis_cluster: bool = False
    """`redis_url` names one node of a Redis Cluster: use the cluster client, which finds the other nodes. Every
    script's keys share one hash slot (docs/store.md), so the store works on a Cluster as on one Redis."""
    models: list[ModelConfig] = Field(min_length=1)
    """The models served, each with its endpoints."""
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    """Placement weights, filters and priority classes."""
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig)
    """Long-context cost terms (attention, decode interference, KV capacity) and TTFT feedback."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """What one request may cost a gateway: prompt size for exact keys, and keying off the event loop."""
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    """How often the collector polls each engine's ``/metrics``, and how long it waits for an answer."""
    engine_pulls: EnginePullsConfig = Field(default_factory=EnginePullsConfig)
    """Per-kind pages the collector polls beside /metrics: llama.cpp ``/slots``, TRT-LLM ``/kv_cache_events``."""
    intent: IntentConfig | None = None
    """Intent-based and weighted model rewrite, before placement (docs/intent.md); absent: no rewrite."""
    disaggregation: DisaggregationConfig = Field(default_factory=DisaggregationConfig)
    """Prefill/decode pairs: the KV link's bandwidth and latency."""
    burst: BurstConfig = Field(default_factory=BurstConfig)
    """Cloud targets for a saturated fleet, and who may burst to them (docs/burst.md). Default: nothing bursts."""
    budgets: BudgetsConfig | None = None
    """Per-team, per-key and per-user token budgets (docs/budgets.md); absent: no budgets."""
    flow_control: FlowControlConfig | None = None
    """Hold requests at the gateway while the fleet is saturated, by priority band and fair across teams
    (docs/flow_control.md). Absent: off, as before (a saturated request is placed anyway, or shed if its class is
    sheddable); ``flow_control: {}`` turns it on with the defaults."""
    kv_tiers: KvTiersConfig = Field(default_factory=KvTiersConfig)
    """Reload bandwidths of KV blocks held in CPU memory or on disk, to price their reuse in seconds."""
    metrics: MetricsPageConfig = Field(default_factory=MetricsPageConfig)
    """Who may read the metrics pages from a browser (CORS; docs/metrics.md)."""

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, value: str | None) -> str | None:
        if value is None:
            return None
        register_url_password(value)  # masked in every log line and error from now on, a malformed URL's too
        parts = urlsplit(value)
        if parts.scheme not in {"redis", "rediss", "unix"}:
            raise ValueError(f"expected a Redis URL like redis://127.0.0.1:6379/0, got {redact_url(value)!r}")
        return value

    # -- lookups ------------------------------------------------------------------------------------------
    def model(self, name: str) -> ModelConfig | None:
        """The model clients call ``name`` (its own name, or one of its ``loras``), or None."""
        for m in self.models:
            if m.name == name or name in m.loras:
                return m
        return None

    def model_names(self) -> list[str]:
        """Every name a client may send: the models and their LoRA adapters."""
        return [name for m in self.models for name in (m.name, *m.loras)]

    def endpoint(self, endpoint_id: str) -> EndpointConfig | None:
        """The endpoint with this id (in any model), or None."""
        for m in self.models:
            for e in m.endpoints:
                if e.id == endpoint_id:
                    return e
        return None
