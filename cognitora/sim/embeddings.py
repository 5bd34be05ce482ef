"""``POST /v1/embeddings`` for the simulated engine: OpenAI's request and response shapes, and a deterministic
embedding computed from the prompt's tokens, so the intent ``embeddings`` classifier can be tested end to end
without an embedding model.

The vector is a signed bag of token ids (each id hashed to one of ``DIMENSIONS`` coordinates and a sign),
L2-normalised: texts that share tokens are close, as with a real model's, but nothing more is claimed for it (the
real accuracy is measured with a real model, bench/results/intent_eval_operator.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

DIMENSIONS = 256


def token_embedding(ids: Sequence[int]) -> list[float]:
    vector = [0.0] * DIMENSIONS
    for token in ids:
        h = (token * 2654435761) & 0xFFFFFFFF  # Knuth's multiplicative hash: neighbouring ids spread out
        vector[h % DIMENSIONS] += 1.0 if (h >> 16) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    """The texts of a request's ``input``: a string or a list of strings (token-id inputs are refused)."""
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError("'input' must be a string or a non-empty list of strings")


def embeddings_response(model: str, texts: Sequence[str], encode: Callable[[str], list[int]]) -> dict[str, Any]:
    ids = [encode(t) for t in texts]
    tokens = sum(map(len, ids))
    return {
        "object": "list",
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": token_embedding(t)} for i, t in enumerate(ids)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
