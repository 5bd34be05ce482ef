"""What the simulated engine counts and caches as tokens.

Prompts become token ids through ``kvstate.prompt`` (``read_prompt`` + ``prompt_token_ids``), the same normalizer
the router uses, with vLLM's rules: chats rendered by the template without added special tokens, completions
prompts (string, strings, token ids, token-id lists) encoded with them, token ids taken as given.

``HFSimTokenizer`` is ``kvstate.prompt.ChatTokenizer`` (the model's own ``tokenizer.json`` and chat template) plus
the engine's output vocabulary, so the router and the engine agree token for token.

``BuiltinTokenizer`` needs no files. It is deterministic and documented so a router can reproduce it:

- text is cut into pieces by the regex ``\\s?[^\\s]{1,4}|\\s+`` (an optional leading space, then at most four
  non-space characters; runs of whitespace are their own piece), so English averages about one token per
  3.5 characters;
- a piece's id is ``256 + (first 4 bytes of blake2b(piece, digest 8) as big-endian int) % 50000``;
- chats render as ChatML: with tools, first ``<|im_start|>tools\\n{tools as compact JSON}<|im_end|>\\n``; then
  ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message (content as vLLM flattens it for a string
  template), then ``<|im_start|>assistant\\n`` (unless ``add_generation_prompt`` is false); the two markers are the
  special ids 1 and 2;
- it has no BOS or EOS to add: ``add_special_tokens`` changes nothing.

Both produce output text from a fixed word list whose words are single tokens, so a client that sends a reply back
in the next turn re-tokenizes it to the same ids the engine generated (multi-turn prefix reuse works).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Protocol

from cognitora.shipped_tokenizers import SHIPPED, SMOLLM2_ID, shipped_names, shipped_tokenizer
from kvstate.chat_template import conversation, tool_schemas
from kvstate.prompt import ChatPrompt, ChatTokenizer, PromptTokenizer

SMOLLM2_DIR = SHIPPED[SMOLLM2_ID]
"""SmolLM2-135M-Instruct's ``tokenizer.json`` and chat template, shipped with Cognitora (PROVENANCE.md there): the
real tokenizer the demo, the benchmarks and the tests give the engines and the router alike."""

_PIECE = re.compile(r"\s?[^\s]{1,4}|\s+")
_SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}
_SPECIAL_SPLIT = re.compile(r"(<\|im_start\|>|<\|im_end\|>)")
_WORD_LIST = """
the of and to in is it you that he was for on are as with his they at be
this have from or one had by but not what all were we when your can said there use an
each which she do how their if will up other about out many then them these so some her would
make like him into time has look two more go see way who its now find long down day did
get come made may part over new sound take only little work know place year live me back give most
very after thing our just name good man think say great where help much line turn same tell boy set
"""
_WORDS = _WORD_LIST.split()


class SimTokenizer(PromptTokenizer, Protocol):
    def output_vocabulary(self) -> list[tuple[int, str]]:
        """(token id, text) pairs the engine generates from; each text tokenizes back to exactly that id."""
        ...


class BuiltinTokenizer:
    """See the module docstring for the exact rule."""

    def __init__(self, vocab_size: int = 50000) -> None:
        self.vocab_size = vocab_size
        self._cache: dict[str, int] = {}

    def _piece_id(self, piece: str) -> int:
        hit = self._cache.get(piece)
        if hit is None:
            digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
            hit = 256 + int.from_bytes(digest[:4], "big") % self.vocab_size
            if len(self._cache) < 200_000:
                self._cache[piece] = hit
        return hit

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for part in _SPECIAL_SPLIT.split(text):
            if not part:
                continue
            special = _SPECIAL.get(part)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(self._piece_id(p) for p in _PIECE.findall(part))
        return ids

    @staticmethod
    def render_chat(prompt: ChatPrompt) -> str:
        schemas = tool_schemas(prompt.tools)
        head = f"<|im_start|>tools\n{json.dumps(schemas, separators=(',', ':'))}<|im_end|>\n" if schemas else ""
        turns = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation(prompt.messages)]
        if prompt.continue_final_message and turns:
            turns[-1] = turns[-1].removesuffix("<|im_end|>\n")
        return head + "".join(turns) + ("<|im_start|>assistant\n" if prompt.add_generation_prompt else "")

    def output_vocabulary(self) -> list[tuple[int, str]]:
        return [(self._piece_id(" " + w), " " + w) for w in _WORDS if len(w) <= 4]


class HFSimTokenizer(ChatTokenizer):
    """A model's ``tokenizer.json`` plus chat template (``chat_template.jinja`` beside it), and its output words."""

    def __init__(self, tokenizer_path: Path) -> None:
        super().__init__(tokenizer_path)
        self._vocab: list[tuple[int, str]] | None = None

    def output_vocabulary(self) -> list[tuple[int, str]]:
        if self._vocab is None:
            vocab: list[tuple[int, str]] = []
            for w in _WORDS:
                ids = self.tokenizer.encode(" " + w, add_special_tokens=False).ids
                if len(ids) == 1:
                    vocab.append((ids[0], " " + w))
            self._vocab = vocab or [(self.tokenizer.encode(" a", add_special_tokens=False).ids[0], " a")]
        return self._vocab


BUILTIN = "builtin"
"""``--tokenizer builtin``: the file-free ``BuiltinTokenizer`` (a router cannot load it: its keys are then
text-approximate)."""

DEFAULT_TOKENIZER = SMOLLM2_ID
"""What the simulated engines tokenize with unless ``--tokenizer`` says otherwise: the real model the examples name
(``models[].tokenizer: HuggingFaceTB/SmolLM2-135M-Instruct``), so a router configured as they are agrees with the
engines token for token."""


def load_tokenizer(name: str | Path | None = DEFAULT_TOKENIZER) -> SimTokenizer:
    """``builtin``, the Hugging Face id of a shipped model, or a ``tokenizer.json`` path (None: the default)."""
    name = DEFAULT_TOKENIZER if name is None else name
    if str(name) == BUILTIN:
        return BuiltinTokenizer()
    path = shipped_tokenizer(str(name)) or Path(name)
    if not path.exists():
        raise FileNotFoundError(
            f"--tokenizer {name}: no such file (give a HuggingFace tokenizer.json, {BUILTIN}, or a shipped model id: "
            f"{shipped_names()})"
        )
    return HFSimTokenizer(path)
