"""The ``models`` section: the model names clients send, and the engines (endpoints) that serve each.

An endpoint's long-context priors are the cost model's (``cognitora.config.cost_model.EnginePriors``); its
power page, role and engine kind are declared here.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from cognitora.config.cost_model import EnginePriors
from cognitora.config.strict import StrictModel, check_http_url, check_zmq_address

__all__ = ["EndpointConfig", "EngineKind", "ModelConfig", "PowerSourceConfig", "Role"]


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


class PowerSourceConfig(StrictModel):
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
        url = check_http_url(value)
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


class EndpointConfig(StrictModel):
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
        return check_http_url(value)

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _zmq(cls, value: str | None) -> str | None:
        return None if value is None else check_zmq_address(value)

    @model_validator(mode="after")
    def _default_id(self) -> EndpointConfig:
        if not self.id:
            parts = urlsplit(self.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            object.__setattr__(self, "id", f"{parts.hostname}:{port}")
        return self


class ModelConfig(StrictModel):
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
