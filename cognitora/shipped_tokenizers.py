"""Tokenizers that ship inside the Cognitora package, named by their Hugging Face model id.

``models[].tokenizer`` (and ``cognitora sim --tokenizer``) take a path to a ``tokenizer.json``, or the Hugging Face id
of a model listed here: ``HuggingFaceTB/SmolLM2-135M-Instruct`` resolves to the copy under
``cognitora/models/`` (the simulated fleet's model), so an example config works the same from a clone and from an
installed wheel, whatever the directory it is started from. Cognitora never downloads a tokenizer: any other model id
is a path, and a path that does not exist is the config's usual "file not found" error, which says how to name one.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIPPED", "SMOLLM2_ID", "shipped_names", "shipped_tokenizer"]

_MODELS_DIR = Path(__file__).resolve().parent / "models"

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The simulated engines' model (its tokenizer and chat template ship with Cognitora: PROVENANCE.md beside them)."""

SHIPPED: dict[str, Path] = {SMOLLM2_ID: _MODELS_DIR / "smollm2-135m-instruct"}
"""Hugging Face model id -> the folder holding its ``tokenizer.json`` and chat template."""


def shipped_tokenizer(name: str) -> Path | None:
    """The shipped ``tokenizer.json`` of model id ``name`` (case-insensitive, as the Hub treats ids), or None."""
    for model_id, folder in SHIPPED.items():
        if name.strip().lower() == model_id.lower():
            return folder / "tokenizer.json"
    return None


def shipped_names() -> str:
    """The ids a config may name, for error messages."""
    return ", ".join(SHIPPED)
