"""Images, audio and video in a prompt: keyed by their content, as the engines key them, in our own key space.

**What vLLM does** (``vllm/multimodal/hasher.py``, ``vllm/multimodal/processing/inputs.py``,
``vllm/v1/core/kv_cache_utils.py``): each media item gets an identifier, ``blake3`` over the model id and the
item's *original bytes* (a ``data:`` URL's base64 decoded; a remote URL's fetched body), or the client's own
``uuid`` for the part when it gives one. The item is expanded into model-specific placeholder tokens, and every
KV block that overlaps them carries ``("mm", identifier, offset in block)`` in its hash's extra keys (published in
``BlockStored.extra_keys``). Two requests share blocks past an image only when the image is the same.

**What a router can do.** The placeholder count depends on the model's processor and the image's size, which a
router does not run, so block boundaries after a media item cannot match the engine's; everything before the first
item is token-exact. Cognitora keeps its own key space (``kvstate.keys``: a chain over block token ids) and puts
each media item *into the token sequence* as two pseudo-token ids that carry a 62-bit digest of its identity
(``media_token_ids``), at the item's place in the rendered prompt. So:

- the blocks before the first item keep their exact keys (a shared system prompt and tool list still match the
  engine's ``BlockStored`` events);
- the block holding an item, and every block after it (they chain on it), are keyed by that item's content:
  the same image (same bytes, or same ``uuid``) gives the same keys whatever the surface that carried it (chat
  ``image_url``, Anthropic ``image`` block, Responses ``input_image``), a different image different keys;
- pseudo ids have bit 31 set, above every real vocabulary, so they never equal a token's id.

The identity mirrors vLLM's: ``uuid`` when the part has one, else the decoded bytes of a base64 ``data:`` URL, else
the URL itself (a router does not fetch it: two URLs serving the same bytes share the engine's cache but not our
keys). Content that does not decode is keyed by its text, never refused: the engine decides what it accepts.

The simulated engine (``cognitora_sim``) computes the same token sequence, so its prefix cache and KV events treat an
image as a two-token item of the prompt: router and sim agree block for block.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvstate.chat_template import MEDIA_PARTS

__all__ = [
    "MEDIA_PARTS",
    "MEDIA_TOKEN_FLAG",
    "MediaRef",
    "is_media_token",
    "mark_media",
    "media_in_messages",
    "media_of_part",
    "media_token_ids",
    "split_marked",
]

Modality = Literal["image", "audio", "video"]

MEDIA_TOKEN_FLAG = 1 << 31
"""Bit set in both pseudo-token ids of a media item: no vocabulary reaches 2**31 ids."""


@dataclass(frozen=True)
class MediaRef:
    """One media item of a prompt: its modality and the 64-bit digest of its identity."""

    modality: Modality
    digest: int
    source: Literal["bytes", "url", "uuid", "embeds"]
    """What the identity was taken from: decoded ``data:`` bytes, the URL, the client's ``uuid``, inline embeds."""

    @property
    def token_ids(self) -> tuple[int, int]:
        return media_token_ids(self.digest)


def media_token_ids(digest: int) -> tuple[int, int]:
    """The two pseudo-token ids that stand for a media item in our key space (62 bits of its digest)."""
    return (MEDIA_TOKEN_FLAG | ((digest >> 33) & 0x7FFFFFFF), MEDIA_TOKEN_FLAG | ((digest >> 2) & 0x7FFFFFFF))


def is_media_token(token_id: int) -> bool:
    return token_id >= MEDIA_TOKEN_FLAG


def _digest(modality: str, source: str, payload: bytes) -> int:
    head = b"cognitora-media\x00" + modality.encode() + b"\x00" + source.encode() + b"\x00"
    return int.from_bytes(hashlib.blake2b(head + payload, digest_size=8).digest(), "big")


def _url_identity(url: str) -> tuple[Literal["bytes", "url"], bytes]:
    """A ``data:...;base64,`` URL's decoded bytes (vLLM hashes those); any other URL as it is written."""
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if sep and head.endswith(";base64"):
            try:
                return "bytes", base64.b64decode(data)
            except (binascii.Error, ValueError):
                pass  # not base64: the engine will refuse it; keyed by its text meanwhile
    return "url", url.encode()


def _url_of(value: Any) -> str | None:
    """``{"url": ...}`` (OpenAI chat) or the URL itself (Responses ``input_image.image_url``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("url"), str):
        return str(value["url"])
    return None


def media_of_part(part: Mapping[str, Any]) -> MediaRef | None:
    """The media item a content part carries, None for a part that is not media (text, thinking, ...)."""
    kind = part.get("type")
    if not isinstance(kind, str):
        kind = next((k for k in MEDIA_PARTS if k in part), None)  # vLLM reads untyped parts by their key
    if kind is None or kind not in MEDIA_PARTS:
        return None
    modality = MEDIA_PARTS[kind]
    uuid = part.get("uuid")
    if isinstance(uuid, str) and uuid:
        return MediaRef(modality, _digest(modality, "uuid", uuid.encode()), "uuid")
    if kind.endswith("_embeds") or kind == "image_pil":
        return MediaRef(modality, _digest(modality, "embeds", repr(part.get(kind)).encode()), "embeds")
    if kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, Mapping) else None
        if isinstance(data, str):
            source, payload = _url_identity(f"data:audio;base64,{data}")
            return MediaRef(modality, _digest(modality, source, payload), source)
        return MediaRef(modality, _digest(modality, "url", repr(audio).encode()), "url")
    if kind == "input_image":
        url = _url_of(part.get("image_url")) or _url_of(part.get("file_id")) or ""
    else:
        url = _url_of(part.get(kind)) or ""
    source, payload = _url_identity(url)
    return MediaRef(modality, _digest(modality, source, payload), source)


def _parts(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[int, int, Mapping[str, Any]]]:
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, Mapping):
                    yield i, j, part


def media_in_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[MediaRef, ...]:
    """Every media item of a chat's messages, in message order."""
    return tuple(ref for _, _, part in _parts(messages) if (ref := media_of_part(part)) is not None)


# A marker a client cannot write: private-use characters around a per-process nonce and the item's index.
_NONCE = secrets.token_hex(8)
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"
_MARK = re.compile(re.escape(_OPEN + _NONCE + ":") + r"(\d+)" + re.escape(_CLOSE))


def mark_media(messages: Sequence[Mapping[str, Any]], text: Sequence[str] | None = None) -> list[Mapping[str, Any]]:
    """``messages`` with the k-th media part replaced by a text part: ``text[k]`` when given, else a marker that
    ``split_marked`` finds in the rendered prompt. Messages without media are the caller's own objects."""
    out: list[Mapping[str, Any]] = list(messages)
    k = 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        parts: list[Any] | None = None
        for j, part in enumerate(content):
            if isinstance(part, Mapping) and media_of_part(part) is not None:
                if parts is None:
                    parts = list(content)
                parts[j] = {"type": "text", "text": text[k] if text is not None else f"{_OPEN}{_NONCE}:{k}{_CLOSE}"}
                k += 1
        if parts is not None:
            out[i] = {**message, "content": parts}
    return out


def split_marked(text: str) -> list[str | int]:
    """A rendered prompt cut at ``mark_media``'s markers: its text pieces, and each marker's item index."""
    out: list[str | int] = []
    at = 0
    for m in _MARK.finditer(text):
        if m.start() > at:
            out.append(text[at : m.start()])
        out.append(int(m.group(1)))
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out
