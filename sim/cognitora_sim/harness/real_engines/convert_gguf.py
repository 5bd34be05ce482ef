"""SmolLM2's GGUF -> a bf16 safetensors checkpoint that vLLM (and transformers) load as ``LlamaForCausalLM``.

Run by ``tests.real_engines.provision`` with the ENGINE venv's Python (it needs ``gguf``, ``numpy``, ``torch``,
``safetensors`` and ``transformers``, which vLLM brings); it imports nothing from the project, so it runs there
as a plain script::

    <engine venv>/bin/python tests/real_engines/convert_gguf.py --gguf X.gguf --tokenizer-dir DIR --out CKPT

transformers reads GGUF but will not save what it read, so the weights are dequantized here with
``gguf.quants.dequantize``. llama.cpp's converter permutes the rows of the Q and K projections (its RoPE pairs
neighbouring dimensions, HF's pairs the two halves); that permutation is undone. The tokenizer and chat template
are NOT the GGUF's: they are copied from ``--tokenizer-dir`` (the ones the project ships), so the router and the
engine tokenize with the same files; the GGUF's vocabulary and merges are only compared with them, and a
difference fails the conversion. ``--check`` then decodes greedily and requires the known answer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CHECK_QUESTION = "What is the capital of France?"
CHECK_ANSWER = "The capital of France is Paris."

# GGUF tensor name (per layer: blk.N.<name>) -> Hugging Face Llama name.
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def field(reader: Any, name: str) -> Any:
    """One metadata value of the GGUF (a scalar, a string, or a list of them)."""
    f = reader.fields.get(name)
    if f is None:
        raise KeyError(f"the GGUF has no {name!r} field")
    return f.contents()


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, n_head)`` of a Q or K projection (rows grouped per head, halves interleaved)."""
    rows = weight.shape[0] // heads // 2
    return weight.reshape(heads, rows, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def llama_config(reader: Any) -> dict[str, Any]:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama GGUF, got architecture {arch!r}")
    heads = int(field(reader, "llama.attention.head_count"))
    hidden = int(field(reader, "llama.embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        "vocab_size": len(field(reader, "tokenizer.ggml.tokens")),
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,  # set to False below when the GGUF has its own output matrix
        "torch_dtype": "bfloat16",
    }


def hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")  # "blk.3.attn_q", "weight"
    if base.startswith("blk."):
        _, layer, kind = base.split(".", 2)
        return f"model.layers.{layer}.{LAYER_TENSORS[kind]}.{suffix}"
    return f"{GLOBAL_TENSORS[base]}.{suffix}"


def weights(reader: Any, config: dict[str, Any]) -> dict[str, Any]:
    import torch
    from gguf.quants import dequantize

    out: dict[str, Any] = {}
    for tensor in reader.tensors:
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        array = array.reshape(tuple(int(d) for d in reversed(tensor.shape.tolist())))  # GGML order is reversed
        if tensor.name.endswith("attn_q.weight"):
            array = unpermute(array, config["num_attention_heads"])
        elif tensor.name.endswith("attn_k.weight"):
            array = unpermute(array, config["num_key_value_heads"])
        out[hf_name(tensor.name)] = torch.from_numpy(np.ascontiguousarray(array)).to(torch.bfloat16)
    if "lm_head.weight" in out:
        config["tie_word_embeddings"] = False
    return out


def compare_tokenizer(reader: Any, tokenizer_json: Path) -> None:
    """The shipped tokenizer.json must have the GGUF's vocabulary (same id for every token) and merges."""
    shipped = json.loads(tokenizer_json.read_text())
    vocab: dict[str, int] = dict(shipped["model"]["vocab"])
    for added in shipped.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = list(field(reader, "tokenizer.ggml.tokens"))
    wrong = [(i, t) for i, t in enumerate(tokens) if vocab.get(t) != i]
    if wrong or len(vocab) != len(tokens):
        raise ValueError(
            f"{tokenizer_json} differs from the GGUF's vocabulary: {len(vocab)} vs {len(tokens)} tokens, "
            f"{len(wrong)} ids differ (first: {wrong[:3]})"
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in shipped["model"]["merges"]]
    if merges != list(field(reader, "tokenizer.ggml.merges")):
        raise ValueError(f"{tokenizer_json} has other BPE merges than the GGUF")


def greedy_answer(checkpoint: Path, question: str, max_new_tokens: int = 12) -> str:
    """What the checkpoint answers to ``question`` (chat template, greedy), as transformers runs it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)).strip()


def convert(gguf_path: Path, tokenizer_dir: Path, out: Path) -> None:
    from gguf import GGUFReader
    from safetensors.torch import save_file

    reader = GGUFReader(gguf_path)
    compare_tokenizer(reader, tokenizer_dir / "tokenizer.json")
    config = llama_config(reader)
    tensors = weights(reader, config)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help=f"require {CHECK_ANSWER!r} to {CHECK_QUESTION!r}")
    args = parser.parse_args(argv)
    convert(args.gguf, args.tokenizer_dir, args.out)
    if args.check:
        answer = greedy_answer(args.out, CHECK_QUESTION)
        print(json.dumps({"question": CHECK_QUESTION, "answer": answer}))
        if not answer.startswith(CHECK_ANSWER):
            print(f"wrong weights: greedy answer {answer!r}, expected {CHECK_ANSWER!r}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
