"""A ``SurfaceRequest`` -> the token ids the engine runs -> block keys, media included.

Without media this is exactly ``kvstate.prompt`` (``prompt_token_ids``, ``PromptKeyer.keys``): same ids, same keys,
same key memo. With media (``kvstate.surfaces.media``), the chat is rendered with a marker in place of each media
part; the text between markers is tokenized piece by piece (a real engine's placeholder tokens are special tokens,
which split the text the same way) and each marker becomes its item's two pseudo-token ids. The key chain runs over
that sequence as over any other, so every key after a media item depends on its content.

Without a tokenizer (text-approximate keys) each media part is written as ``<image:DIGEST>`` into the approximate
text instead, so those keys depend on the content too.
"""

from __future__ import annotations

from dataclasses import replace

from kvstate.prompt import ChatPrompt, PromptKeyer, PromptKeys, PromptTokenizer, prompt_chars, prompt_token_ids
from kvstate.surfaces.media import MediaRef, mark_media, split_marked
from kvstate.surfaces.request import SurfaceRequest

__all__ = ["surface_keys", "surface_prompt_chars", "surface_token_ids"]


def surface_token_ids(tokenizer: PromptTokenizer, request: SurfaceRequest) -> list[list[int]]:
    """The token ids the engine runs for ``request``: one list per prompt (several for a batch)."""
    prompt = request.prompt
    if not request.media or not isinstance(prompt, ChatPrompt):
        return prompt_token_ids(tokenizer, prompt)
    return [_chat_ids_with_media(tokenizer, prompt, request.media)]


def surface_keys(keyer: PromptKeyer, request: SurfaceRequest, lora: str | None = None) -> PromptKeys:
    """``request``'s block keys rooted at the model (or ``lora``), and its prompt tokens; media are keyed by content."""
    prompt = request.prompt
    if not request.media or not isinstance(prompt, ChatPrompt):
        return keyer.keys(prompt, lora)
    if keyer.tokenizer is None:
        texts = [f"<{m.modality}:{m.digest:016x}>" for m in request.media]
        return keyer.keys(replace(prompt, messages=mark_media(prompt.messages, texts)), lora)
    ids = _chat_ids_with_media(keyer.tokenizer, prompt, request.media)
    keys, reused = keyer.key_memo.chain_reusing(keyer.root(lora), ids, keyer.block_size)
    return PromptKeys(keys, len(ids), True, keyer.block_size, reused)


def surface_prompt_chars(request: SurfaceRequest) -> int:
    """``kvstate.prompt.prompt_chars`` of the request with each media part counted as its marker, not its bytes: a
    megabyte of base64 image is a few hundred tokens to the engine, not a quarter of a million."""
    prompt = request.prompt
    if request.media and isinstance(prompt, ChatPrompt):
        prompt = replace(prompt, messages=mark_media(prompt.messages, ["<media>"] * len(request.media)))
    return prompt_chars(prompt)


def _affixes(tokenizer: PromptTokenizer) -> tuple[list[int], list[int]]:
    """What the tokenizer's post-processor puts around one sequence (Llama: ``[<s>]``, ``[]``)."""
    plain = tokenizer.encode("hello", False)
    full = tokenizer.encode("hello", True)
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    return [], []


def _chat_ids_with_media(tokenizer: PromptTokenizer, prompt: ChatPrompt, media: tuple[MediaRef, ...]) -> list[int]:
    text = tokenizer.render_chat(replace(prompt, messages=mark_media(prompt.messages)))
    prefix, suffix = _affixes(tokenizer) if prompt.add_special_tokens else ([], [])
    ids = list(prefix)
    for piece in split_marked(text):
        if isinstance(piece, int):
            if piece < len(media):
                ids.extend(media[piece].token_ids)
        else:
            ids.extend(tokenizer.encode(piece, False))
    ids.extend(suffix)
    return ids
