"""The ``limits`` section: what one request may cost a gateway (how large a prompt is keyed exactly, and on which
thread), and the bounds of the gateway's memos and caches.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cognitora.config.strict import StrictModel

__all__ = ["LimitsConfig"]


class LimitsConfig(StrictModel):
    """What one request may cost a gateway, so that none stalls it: how large a prompt is tokenized exactly, and
    where (docs/config.md, "Large prompts"). A prompt's size is counted before it is rendered or tokenized: its
    characters of text, plus 4 for each token id and each other JSON value (a message, a part: markup around it)."""

    exact_prompt_max_chars: int = Field(default=262_144, gt=0)
    """The largest prompt (characters) whose block keys are token-exact. Tokenizing costs one core ~1 us per
    character of English text, up to ~3 for CJK, so the default (~64k English tokens) costs well under a second,
    on a worker thread. A larger prompt is handled as ``over_limit`` says, without tokenizing it."""
    over_limit: Literal["approximate", "reject"] = "approximate"
    """A prompt over ``exact_prompt_max_chars``: ``approximate`` places it on text-approximate keys of its first
    ``exact_prompt_max_chars`` characters (they match this gateway's routing history, not the engines' KV events)
    and a token count estimated from its size; ``reject`` refuses it with 413 and a message giving the limit. A
    token-id prompt over the limit gets exact keys for its leading ids instead, or the same 413."""
    inline_tokenize_max_chars: int = Field(default=8192, ge=0)
    """A prompt whose text not already in the tokenizer's piece cache is at most this many characters is keyed on
    the gateway's event loop (10 to 25 ms at most, no thread hop: the common case, a cached system prompt and a new
    question); a larger one on a worker thread, while the loop serves other requests."""
    offload_queue_max_chars: int = Field(default=524_288, ge=0)
    """At most this many characters of prompts wait for (or run on) the keying thread; a prompt that would exceed it
    gets text-approximate keys at once instead of queueing, so a burst of long prompts delays none of them by more
    than this much tokenizing (~0.5 s of English). A prompt alone on the thread always runs."""
    block_key_memo_bytes: int = Field(default=32 << 20, ge=0)
    """Bound of each model's memo of block keys already computed (bytes: token ids and keys as Python holds them):
    a prompt reuses the keys of the whole blocks it shares with the latest prompt that began with the same block,
    so a shared system prompt is hashed once (kvstate/key_memo.py). When full it is emptied and refills. 0 turns it
    off."""
    match_checkpoint_ttl_s: float = Field(default=1.0, ge=0)
    """How long a prefix-match checkpoint is kept (stores that take them: Redis). Requests that share a system prompt
    then have the store walk only the blocks after it, once a few block strings show that the prompt's holders have
    not changed (kvstate/store.py, ``MatchCheckpoint``); a block lost inside the prompt, or moved between tiers, goes
    unseen for at most this long. 0 turns it off."""
    gc_pacing_s: float = Field(default=0.05, ge=0)
    """In a LiteLLM proxy: Python's garbage collections run from the core's event loop every this many seconds
    instead of at arbitrary allocations, which can crash the proxy (a CPython bug that LiteLLM's context variables
    reach: docs/litellm.md, "Garbage collection"). Read when the core starts. 0 leaves Python's collector as it is."""
    tokenizer_cache_bytes: int = Field(default=64 << 20, ge=0)
    """Bound of each model tokenizer's piece cache (bytes, as Python holds the text and token ids); a piece larger
    than a sixteenth of it is encoded but not kept. 0 turns the cache off."""
    tokenizer_cache_probation_share: float = Field(default=1 / 16, ge=0, lt=1)
    """The share of the piece cache that holds pieces seen once, until they are seen again and enter the rest
    (kvstate/prompt.py: most user messages are seen once, and cached at first sight they grew a gateway's memory for
    hours). The default, a 16th, keeps 500 users' interleaved chats at the hit rate of caching at first sight (90%;
    a 64th: 78%) for 4 MiB at a unique-prompt load; a quarter leaves the rest too small (74%). 0 caches every piece
    at first sight."""
