"""The two requests of a prefill/decode pair, per engine kind: pure functions from the client's body.

vLLM NixlConnector (engines.md 5.1-5.2), two steps one after the other:

1. prefill: the client body with ``kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false,
   remote_engine_id/block_ids/host/port: null}``, ``stream: false`` without ``stream_options``, ``max_tokens: 1``
   (and ``max_completion_tokens: 1`` when the client set it), ``min_tokens``/``min_completion_tokens`` removed;
2. decode: the client body unchanged but for ``kv_transfer_params`` = the prefill response's top-level
   ``kv_transfer_params``, passed through as it came.

SGLang PD (engines.md 5.4), one body to both servers at once, with ``bootstrap_host`` (the prefill server),
``bootstrap_port`` (its bootstrap port) and ``bootstrap_room`` (a 63-bit random integer shared by both); a batch
(a completions ``prompt`` list, chat ``n > 1``) gets one value per item in each field.

TensorRT-LLM (engines.md 5.3, UNCONFIRMED beyond its examples): the context request carries
``disaggregated_params = {request_type: context_only}``; the generation request a copy of the context response's
``choices[0].disaggregated_params`` with ``request_type: generation_only``.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from cognitora.disagg import wire

__all__ = [
    "ProtocolError",
    "sglang_bodies",
    "sglang_room",
    "trtllm_context_body",
    "trtllm_generation_body",
    "vllm_decode_body",
    "vllm_prefill_body",
]

Body = dict[str, Any]


class ProtocolError(ValueError):
    """A prefill response that does not carry what the decode step needs."""


def vllm_prefill_body(body: Body) -> Body:
    out = copy.deepcopy(body)
    out[wire.KV_TRANSFER_PARAMS] = {
        wire.DO_REMOTE_DECODE: True,
        wire.DO_REMOTE_PREFILL: False,
        wire.REMOTE_ENGINE_ID: None,
        wire.REMOTE_BLOCK_IDS: None,
        wire.REMOTE_HOST: None,
        wire.REMOTE_PORT: None,
    }
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("min_tokens", None)
    out.pop("min_completion_tokens", None)
    return out


def vllm_decode_body(body: Body, prefill_response: Body) -> Body:
    params = prefill_response.get(wire.KV_TRANSFER_PARAMS)
    if not isinstance(params, dict):
        raise ProtocolError(
            f"the prefill response has no {wire.KV_TRANSFER_PARAMS} object: is the prefill engine running with a "
            "KV connector (vLLM --kv-transfer-config NixlConnector)?"
        )
    out = copy.deepcopy(body)
    out[wire.KV_TRANSFER_PARAMS] = params
    return out


def sglang_room() -> int:
    """A bootstrap room: 63 random bits, as sgl-router draws it."""
    return random.getrandbits(63)


def _batch_size(body: Body) -> int | None:
    """Items in a batch request, or None for a single one."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return len(prompt)
    n = body.get("n")
    if "messages" in body and isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return n
    return None


def sglang_bodies(body: Body, host: str, port: int, room: int) -> tuple[Body, Body]:
    """The (prefill, decode) bodies: the same body, bootstrap fields added, sent to both servers concurrently."""
    out = copy.deepcopy(body)
    batch = _batch_size(body)
    if batch is None:
        out.update({wire.BOOTSTRAP_HOST: host, wire.BOOTSTRAP_PORT: port, wire.BOOTSTRAP_ROOM: room})
    else:
        out.update(
            {
                wire.BOOTSTRAP_HOST: [host] * batch,
                wire.BOOTSTRAP_PORT: [port] * batch,
                wire.BOOTSTRAP_ROOM: [(room + i) % 2**63 for i in range(batch)],
            }
        )
    return out, copy.deepcopy(out)


def trtllm_context_body(body: Body) -> Body:
    out = copy.deepcopy(body)
    out[wire.DISAGGREGATED_PARAMS] = {wire.REQUEST_TYPE: wire.CONTEXT_ONLY}
    out["stream"] = False
    out.pop("stream_options", None)
    return out


def trtllm_generation_body(body: Body, context_response: Body) -> Body:
    choices = context_response.get("choices")
    params = choices[0].get(wire.DISAGGREGATED_PARAMS) if isinstance(choices, list) and choices else None
    if not isinstance(params, dict):
        raise ProtocolError(
            f"the context response has no choices[0].{wire.DISAGGREGATED_PARAMS}: is the context server running "
            "trtllm-serve in disaggregated mode?"
        )
    out = copy.deepcopy(body)
    out[wire.DISAGGREGATED_PARAMS] = {**params, wire.REQUEST_TYPE: wire.GENERATION_ONLY}
    return out
