"""``POST /v1/embeddings`` for the simulated engine: OpenAI's request and response shapes, and a deterministic
embedding computed from the prompt's tokens, so the intent ``embeddings`` classifier can be tested end to end
without an embedding model. The request's ``input`` is read as vLLM reads it (``kvstate.surfaces``: a string, strings,
token ids, token-id lists, or one conversation).

The vector is a signed bag of token ids (each id hashed to one of ``DIMENSIONS`` coordinates and a sign),
L2-normalised: texts that share tokens are close, as with a real model's, but nothing more is claimed for it (the
real accuracy is measured with a real model, bench/results/intent_eval_operator.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DIMENSIONS = 256


def token_embedding(ids: Sequence[int]) -> list[float]:
    vector = [0.0] * DIMENSIONS
    for token in ids:
        h = (token * 2654435761) & 0xFFFFFFFF  # Knuth's multiplicative hash: neighbouring ids spread out
        vector[h % DIMENSIONS] += 1.0 if (h >> 16) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


def embeddings_response(model: str, ids: Sequence[Sequence[int]]) -> dict[str, Any]:
    """OpenAI's embeddings answer for inputs already tokenized (``kvstate.surfaces``: texts, token ids, or one
    conversation, as vLLM reads them), one vector per input."""
    tokens = sum(map(len, ids))
    return {
        "object": "list",
        "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": token_embedding(t)} for i, t in enumerate(ids)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
