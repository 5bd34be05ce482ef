"""Prompt -> token ids -> block keys, exactly as the engine sees the prompt.

``ChatTokenizer`` renders a chat with the model's own Jinja chat template and tokenizes it with the model's own
``tokenizer.json`` (HF ``tokenizers``), the way vLLM's OpenAI server does. Special tokens split the rendered text
before BPE runs, so each piece between special tokens tokenizes independently; we cache pieces, which makes the
long shared system prompts that Cognitora routes for nearly free to re-tokenize.

``PromptKeyer`` turns a prompt into block keys: token-exact with a tokenizer, text-approximate without one.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer

from kvstate.keys import (
    APPROX_CHARS_PER_TOKEN,
    BlockKey,
    approx_root_key,
    chain_block_keys,
    root_key,
    text_block_keys,
)

Message = Mapping[str, Any]


class PromptError(ValueError):
    """The prompt cannot be rendered or tokenized (bad message shape, template error)."""


def message_text(content: Any) -> str:
    """OpenAI message content as text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise PromptError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def normalize_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise PromptError(f"messages[{i}] must be an object with 'role' and 'content'")
        out.append({**m, "role": str(m.get("role", "user")), "content": message_text(m.get("content"))})
    return out


def load_chat_template(tokenizer_path: Path, template_path: Path | None = None) -> str | None:
    """The chat template: an explicit file, else ``chat_template.jinja`` or ``tokenizer_config.json`` beside it."""
    if template_path is not None:
        return template_path.read_text()
    sibling = tokenizer_path.parent / "chat_template.jinja"
    if sibling.exists():
        return sibling.read_text()
    cfg = tokenizer_path.parent / "tokenizer_config.json"
    if cfg.exists():
        tmpl = json.loads(cfg.read_text()).get("chat_template")
        if isinstance(tmpl, str):
            return tmpl
    return None


class ChatTokenizer:
    """A model's tokenizer plus its chat template, with a piece cache (see the module docstring)."""

    def __init__(self, tokenizer_path: Path, template_path: Path | None = None, cache_size: int = 4096) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        source = load_chat_template(tokenizer_path, template_path)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        self._template = env.from_string(source) if source else None
        specials = [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]
        specials.sort(key=len, reverse=True)
        self._special_ids = {s: self.tokenizer.token_to_id(s) for s in specials}
        self._split = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")") if specials else None
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        msgs = normalize_messages(messages)
        if self._template is None:
            # No template: a plain transcript, the fallback most servers use.
            body = "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
            return body + ("assistant: " if add_generation_prompt else "")
        try:
            return self._template.render(messages=msgs, add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as exc:
            raise PromptError(f"chat template failed: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added), equal to ``tokenizer.encode(text, add_special_tokens=False)``."""
        if self._split is None:
            return self._encode_piece(text)
        ids: list[int] = []
        for piece in self._split.split(text):
            if not piece:
                continue
            special = self._special_ids.get(piece)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(self._encode_piece(piece))
        return ids

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self.render(messages))

    def _encode_piece(self, piece: str) -> list[int]:
        hit = self._cache.get(piece)
        if hit is not None:
            self._cache.move_to_end(piece)
            return hit
        ids = self.tokenizer.encode(piece, add_special_tokens=False).ids
        self._cache[piece] = ids
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return ids


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)


@dataclass(frozen=True)
class PromptKeys:
    """A prompt's block keys and its size in tokens (estimated when ``exact`` is False)."""

    keys: list[BlockKey]
    prompt_tokens: int
    exact: bool
    tokens_per_key: int


class PromptKeyer:
    """Computes a prompt's block keys for one model: token-exact with a tokenizer, else text-approximate."""

    def __init__(
        self,
        model: str,
        block_size: int = 16,
        tokenizer: ChatTokenizer | None = None,
        lora: str | None = None,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.tokenizer = tokenizer
        self._root = root_key(model, lora)
        self._approx_root = approx_root_key(model, lora)

    @property
    def root(self) -> BlockKey:
        return self._root

    def keys_for_tokens(self, token_ids: Sequence[int]) -> list[BlockKey]:
        return chain_block_keys(self._root, token_ids, self.block_size)

    def keys_for_chat(self, messages: Sequence[Message]) -> PromptKeys:
        if self.tokenizer is not None:
            ids = self.tokenizer.encode_chat(messages)
            return PromptKeys(self.keys_for_tokens(ids), len(ids), True, self.block_size)
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in normalize_messages(messages))
        return self._approx(text)

    def keys_for_text(self, prompt: str) -> PromptKeys:
        if self.tokenizer is not None:
            ids = self.tokenizer.encode(prompt)
            return PromptKeys(self.keys_for_tokens(ids), len(ids), True, self.block_size)
        return self._approx(prompt)

    def _approx(self, text: str) -> PromptKeys:
        chars = self.block_size * APPROX_CHARS_PER_TOKEN
        keys = text_block_keys(self._approx_root, text, chars)
        return PromptKeys(keys, max(1, len(text) // APPROX_CHARS_PER_TOKEN), False, self.block_size)
