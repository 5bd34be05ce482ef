"""Every wire name of a prefill/decode pair, in one place: the header a gateway sets, the body fields each engine
kind reads. Sources: shared reference engines.md section 5 (llm-d's routing sidecar, vLLM's NIXL toy proxy,
sgl-router's ``pd_router.rs``, TRT-LLM's disaggregated examples); docs/disaggregation.md repeats them."""

from __future__ import annotations

__all__ = [
    "BOOTSTRAP_HOST",
    "BOOTSTRAP_PORT",
    "BOOTSTRAP_ROOM",
    "CONTEXT_ONLY",
    "DISAGGREGATED_PARAMS",
    "DO_REMOTE_DECODE",
    "DO_REMOTE_PREFILL",
    "GENERATION_ONLY",
    "KV_TRANSFER_PARAMS",
    "PD_FALLBACK_HEADER",
    "PD_HEADER",
    "PD_PREFILL_MS_HEADER",
    "PREFILL_ENDPOINT_HEADER",
    "REMOTE_BLOCK_IDS",
    "REMOTE_ENGINE_ID",
    "REMOTE_HOST",
    "REMOTE_PORT",
    "REQUEST_ID_HEADER",
    "REQUEST_TYPE",
    "SGLANG_DEFAULT_BOOTSTRAP_PORT",
]

# -- gateway -> sidecar (set only by the gateway after placement; the gateway strips any copy a client sent) --------
PREFILL_ENDPOINT_HEADER = "x-cognitora-prefill-endpoint"
"""The prefill endpoint Cognitora chose, ``host:port`` (or a base URL). Absent: the decode engine prefills locally.
llm-d's sidecar reads the same information from ``x-prefiller-host-port``."""
REQUEST_ID_HEADER = "x-request-id"
"""Sent to both engines of a pair, one id for both steps (vLLM's toy proxy and llm-d's sidecar do the same)."""

# -- sidecar -> client (what happened to the split, for logs and tests; never a secret) -----------------------------
PD_HEADER = "x-cognitora-pd"
"""``split`` (prefill remote, decode here), ``local`` (no prefill endpoint given) or ``fallback`` (the prefill step
or the transfer failed: prefilled here instead)."""
PD_FALLBACK_HEADER = "x-cognitora-pd-fallback"
"""Why a split fell back to local prefill, in words."""
PD_PREFILL_MS_HEADER = "x-cognitora-pd-prefill-ms"
"""Wall milliseconds the remote prefill step took (vLLM and TRT-LLM protocols: the sidecar waits for it)."""

# -- vLLM NixlConnector (kv_transfer_params) --------------------------------------------------------------------
KV_TRANSFER_PARAMS = "kv_transfer_params"
DO_REMOTE_DECODE = "do_remote_decode"
DO_REMOTE_PREFILL = "do_remote_prefill"
REMOTE_ENGINE_ID = "remote_engine_id"
REMOTE_BLOCK_IDS = "remote_block_ids"
REMOTE_HOST = "remote_host"
REMOTE_PORT = "remote_port"
REMOTE_REQUEST_ID = "remote_request_id"
TP_SIZE = "tp_size"

# -- SGLang PD (bootstrap) ------------------------------------------------------------------------------------------
BOOTSTRAP_HOST = "bootstrap_host"
BOOTSTRAP_PORT = "bootstrap_port"
BOOTSTRAP_ROOM = "bootstrap_room"
SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998
"""``--disaggregation-bootstrap-port``'s default."""

# -- TensorRT-LLM disaggregated serving (UNCONFIRMED beyond its examples: engines.md 5.3) ----------------------------
DISAGGREGATED_PARAMS = "disaggregated_params"
REQUEST_TYPE = "request_type"
CONTEXT_ONLY = "context_only"
GENERATION_ONLY = "generation_only"
