"""The one prompt normalizer: an OpenAI request's prompt fields -> the token ids vLLM feeds its engine -> block keys.

Every consumer goes through here: the router (``cognitora.router``), the simulated engine's endpoints
(``cognitora_sim.server``: ``/tokenize``, chat and completions), benchmarks and tests. So a prompt gets the same
token ids wherever it is read, and those are the ids vLLM computes (``vllm/entrypoints/serve/tokenize/protocol.py``,
``vllm/renderers``, ``serving_completion.py``):

- ``read_prompt`` validates the raw fields into a ``ChatPrompt`` or a ``CompletionPrompt``;
- ``prompt_token_ids`` turns either into one token-id list per prompt the engine will run;
- ``PromptKeyer.keys`` turns those into block keys rooted at the model, or at the LoRA adapter the request names.

The rules, as vLLM applies them:

- **Chat** (``/v1/chat/completions``, ``/tokenize`` with ``messages``): ``kvstate.chat_template`` renders the
  conversation, with ``tools``, ``add_generation_prompt`` (default true), ``continue_final_message`` (default
  false) and ``chat_template_kwargs``; the text is encoded with ``add_special_tokens`` **false** by default,
  because the template writes the BOS itself (as ``{{ bos_token }}``) where the model wants one.
- **Completions** (``/v1/completions``, ``/tokenize`` with ``prompt``): ``prompt`` is a string, a list of
  strings, a list of token ids, or a list of token-id lists. Text is encoded with ``add_special_tokens``
  **true** by default: the tokenizer's post-processor adds what the model expects (Llama's BOS; SmolLM2's adds
  nothing). Token ids are used as given, nothing added.
- **A batch** (several prompts in one completions request): vLLM runs each as its own request on the engine it
  was sent to, and its ``usage.prompt_tokens`` is the sum over the batch. So ``prompt_tokens`` is the sum (the
  prefill the engine will do), and the keys are the first prompt's: batches share their few-shot prefix in
  practice, and the cost model needs one chain, not several.

``ChatTokenizer`` is the model's own ``tokenizer.json`` (HF ``tokenizers``) plus its chat template. Special tokens
split the text before BPE runs, so each piece between them tokenizes independently; pieces are cached, which makes
the long shared system prompts Cognitora routes for nearly free to re-tokenize. The cache is bounded in bytes, and a
piece too large for it is not cached (one huge prompt must not hold, or flush, everyone's system prompts).

A piece seen once is held in a small probation segment (2Q's "A1in": ``PROBATION_SHARE``), and only a piece seen
again enters the cache proper: most user messages are seen once, and cached at first sight they filled the cache to
its bound with text never asked for again, a gateway's RSS growing for hours at a unique-prompt load
(``bench/results/memory_growth.md``). A chat's next turn finds its history in probation; a piece seen again after it
left probation (a fixed table of hashes remembers ~65k pieces seen once, TinyLFU's "doorkeeper") is tokenized a
second time and cached then.

What tokenizing costs is known before it is paid (``ChatTokenizer.uncached_chars``, ``PromptKeyer.keys_inline``),
so a gateway can key cheap prompts on its event loop and the others on a worker thread: a ``ChatTokenizer`` may be
used from several threads at once, and long texts are encoded with the GIL released (HF ``Tokenizer.encode`` holds
it for the whole call; ``encode_batch_fast`` and ``encode_batch`` do not).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer

from kvstate.chat_template import (
    ChatTemplate,
    PromptError,
    chat_request_messages,
    conversation,
    load_chat_template,
    tool_schemas,
)
from kvstate.key_memo import BlockKeyMemo
from kvstate.keys import APPROX_CHARS_PER_TOKEN, BlockKey, approx_root_key, root_key, text_block_keys

__all__ = [
    "ChatPrompt",
    "ChatTokenizer",
    "CompletionPrompt",
    "Deferred",
    "Message",
    "Prompt",
    "PromptError",
    "PromptKeyer",
    "PromptKeys",
    "PromptTokenizer",
    "completion_prompts",
    "prompt_chars",
    "prompt_token_ids",
    "read_prompt",
]

Message = Mapping[str, Any]
TokenIds = tuple[int, ...]

KEY_MEMO_BYTES = 32 << 20
"""Default bound of a keyer's block-key memo (``kvstate.key_memo``), in bytes: ~600 distinct 8k-token prefixes."""
PIECE_CACHE_BYTES = 64 << 20
"""Default bound of one ``ChatTokenizer``'s piece cache, in bytes (the text and the token ids as Python holds
them): ~1.5M cached tokens of English."""

PROBATION_SHARE = 1 / 16
"""The share of the piece cache's bytes its probation segment, for pieces seen once, takes by default (4 MiB of the
default 64; ``limits.tokenizer_cache_probation_share``): at a unique-prompt load it is all the cache holds. A 16th,
not the 64th first chosen: 500 users' interleaved chats found 89.7% of their text cached (as when every piece is
cached at first sight) against 78.1% at a 64th, b2b-saas' first 1,000 prompts 77.8% against 66%, for 3 MiB more
at the soak's unique prompts; a quarter was worse (73.6% on those chats: the cache proper left too small;
``bench/results/memory_growth.md``)."""

GIL_FREE_ENCODE_CHARS = 2048
"""Texts at least this long are encoded with HF ``encode_batch_fast``, which releases the GIL while it runs (``encode``
holds it throughout: a 1 MB text froze every other thread, the event loop's too, for 1.5 s). Below, the two cost
the same and the GIL is held for under a millisecond."""


# -- the request's prompt -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's prompt fields, as the client sent them (defaults are vLLM's)."""

    messages: Sequence[Message]
    tools: Sequence[Mapping[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    """Encode the rendered text with the tokenizer's special tokens too (vLLM's chat default: no, the template
    adds them)."""
    chat_template_kwargs: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class CompletionPrompt:
    """A completions request's prompts: one entry per prompt of the batch, text or token ids."""

    prompts: tuple[str | TokenIds, ...]
    add_special_tokens: bool = True
    """Encode text prompts with the tokenizer's special tokens (vLLM's completions default: yes)."""


Prompt = ChatPrompt | CompletionPrompt


def read_prompt(
    *,
    messages: Sequence[Message] | None = None,
    prompt: Any = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_special_tokens: bool | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> Prompt:
    """A request's raw prompt fields, validated: ``messages`` make a chat, else ``prompt`` a completion.

    ``add_special_tokens`` None means the endpoint's default (chat: False, completions: True). A chat's tool calls
    are put in the order vLLM's request validation writes them (``chat_request_messages``). Raises
    ``PromptError`` with a message meant for the client.
    """
    if messages is not None:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
            raise PromptError("'messages' must be a non-empty list of {role, content} objects")
        if tools is not None and (isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence)):
            raise PromptError("'tools' must be a list of {type, function} objects")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise PromptError("'chat_template_kwargs' must be an object")
        return ChatPrompt(
            messages=chat_request_messages(messages),
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            add_special_tokens=bool(add_special_tokens),
            chat_template_kwargs=chat_template_kwargs,
        )
    if prompt is None:
        raise PromptError("the request has neither 'messages' nor 'prompt'")
    return CompletionPrompt(completion_prompts(prompt), True if add_special_tokens is None else add_special_tokens)


def _all_tokens(values: Sequence[Any]) -> bool:
    """Every value is a token id (a non-negative int, not a bool). At C speed, by the set of the values' types: a
    10 MB body of ids is ~1.2M of them, which a per-value Python check took 0.3 s of the event loop to read."""
    types = set(map(type, values))
    if not all(issubclass(t, int) and not issubclass(t, bool) for t in types):
        return False
    return not values or min(values) >= 0


def completion_prompts(prompt: Any) -> tuple[str | TokenIds, ...]:
    """A completions ``prompt`` as a batch (vLLM's ``parse_and_batch_prompt``): str | [str] | [int] | [[int]]."""
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise PromptError("'prompt' is empty: give at least one prompt")
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if _all_tokens(prompt):
            return (tuple(prompt),)
        if all(isinstance(p, (list, tuple)) for p in prompt):
            if not prompt[0]:
                raise PromptError("'prompt' holds an empty token list: give at least one token")
            if all(_all_tokens(p) for p in prompt):
                return tuple(tuple(p) for p in prompt)
    raise PromptError("'prompt' must be a string, a list of strings, a list of token ids, or a list of token-id lists")


# -- prompt -> token ids --------------------------------------------------------------------------------------


class PromptTokenizer(Protocol):
    """What the normalizer needs of a tokenizer: render a chat, encode text."""

    def render_chat(self, prompt: ChatPrompt) -> str:
        """The text vLLM's chat endpoint would tokenize for ``prompt``."""
        ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """``text``'s token ids; with ``add_special_tokens``, what the tokenizer's post-processor adds too."""
        ...


def prompt_token_ids(tokenizer: PromptTokenizer, prompt: Prompt) -> list[list[int]]:
    """The token ids the engine runs: one list per prompt (a chat or one completion prompt: one; a batch: each)."""
    if isinstance(prompt, ChatPrompt):
        return [tokenizer.encode(tokenizer.render_chat(prompt), prompt.add_special_tokens)]
    return [tokenizer.encode(p, prompt.add_special_tokens) if isinstance(p, str) else list(p) for p in prompt.prompts]


class ChatTokenizer:
    """A model's ``tokenizer.json`` and chat template, with a piece cache (see the module docstring). Thread-safe.

    ``cache_bytes`` bounds the piece cache; a piece whose entry would take more than ``max_piece_bytes`` (default a
    sixteenth of the cache) is encoded but not kept. A piece seen once waits in a probation segment of
    ``probation_share`` of ``cache_bytes`` and enters the cache proper when seen again (see the module docstring);
    with ``probation_share`` 0 every piece enters the cache proper at once.
    """

    def __init__(
        self,
        tokenizer_path: Path,
        template_path: Path | None = None,
        cache_bytes: int = PIECE_CACHE_BYTES,
        max_piece_bytes: int | None = None,
        probation_share: float = PROBATION_SHARE,
    ) -> None:
        if not 0 <= probation_share < 1:
            raise ValueError(f"probation_share must be at least 0 and below 1, not {probation_share}")
        second_sighting = probation_share > 0
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.template: ChatTemplate | None = load_chat_template(tokenizer_path, template_path)
        added = list(self.tokenizer.get_added_tokens_decoder().values())
        # Splitting on added tokens before BPE is exactly what the tokenizer does, unless a token strips the spaces
        # around it, matches whole words only, or matches normalized text: then encode whole texts (no cache).
        self._split: re.Pattern[str] | None = None
        self._added_ids: dict[str, int] = {}
        self._piecewise = not any(
            t.lstrip or t.rstrip or t.single_word or (t.normalized and self.tokenizer.normalizer is not None)
            for t in added
        )
        if self._piecewise and added:
            contents = sorted({t.content for t in added}, key=len, reverse=True)
            self._added_ids = {c: i for c in contents if (i := self.tokenizer.token_to_id(c)) is not None}
            self._split = re.compile("(" + "|".join(re.escape(c) for c in contents) + ")")
        self._prefix: list[int] | None
        self._suffix: list[int] | None
        self._prefix, self._suffix = self._special_affixes()
        self._cache: OrderedDict[str, tuple[list[int], int]] = OrderedDict()
        """piece -> (its token ids, the entry's size in bytes), least recently used first."""
        self._max_piece_bytes = cache_bytes // 16 if max_piece_bytes is None else min(max_piece_bytes, cache_bytes)
        self._probation: OrderedDict[str, tuple[array[int], int]] = OrderedDict()
        """Pieces seen once, oldest first, their ids packed 4 bytes each (a list of ints takes 36, and most of these
        are never read): a hit moves one into ``_cache``, as a list (hits there must not pay for unpacking)."""
        self._probation_bytes = int(cache_bytes * probation_share)
        self._probation_held = 0
        self._main_bytes = cache_bytes - self._probation_bytes
        self._cached_bytes = 0
        # Pieces seen once, as hashes, one per slot, a newer one taking the slot: one seen again after it left
        # probation goes into the cache proper. A fixed array, allocated once (512 KiB for the default cache).
        slots = 1 << max(8, min(16, (cache_bytes // 512).bit_length() - 1)) if second_sighting and cache_bytes else 0
        self._sightings = array("q", bytes(8 * slots))
        self._sightings_mask = slots - 1
        # Held while the cache and its byte count change (a miss), never while encoding: a worker thread keying a
        # long prompt must not make the event loop's cheap lookups wait.
        self._lock = threading.Lock()

    def _special_affixes(self) -> tuple[list[int], list[int]] | tuple[None, None]:
        """What the post-processor puts before and after a single sequence (Llama: ``[<s>]``, ``[]``)."""
        probe = "hello"
        plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
        full = self.tokenizer.encode(probe, add_special_tokens=True).ids
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                return full[:i], full[i + len(plain) :]
        return None, None  # not a plain wrap: encode whole texts through the post-processor

    def render_chat(self, prompt: ChatPrompt) -> str:
        if self.template is None:
            # No template anywhere: a plain transcript (vLLM would refuse the request; keys then only match
            # requests the router itself routed).
            body = "".join(f"{m['role']}: {m['content']}\n" for m in conversation(prompt.messages))
            return body + ("assistant: " if prompt.add_generation_prompt else "")
        return self.template.render(
            prompt.messages,
            prompt.tools,
            add_generation_prompt=prompt.add_generation_prompt,
            continue_final_message=prompt.continue_final_message,
            template_kwargs=prompt.chat_template_kwargs,
        )

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """A chat's prompt text with vLLM's defaults."""
        return self.render_chat(ChatPrompt(messages, tools))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Equal to ``tokenizer.encode(text, add_special_tokens=...).ids``, from cached pieces where possible."""
        if add_special_tokens:
            if self._prefix is None or self._suffix is None:
                return self._encode_raw(text, True)
            return [*self._prefix, *self.encode(text), *self._suffix]
        if not self._piecewise:
            return self._encode_raw(text, False)
        if self._split is None:
            return self._encode_piece(text)
        return self._encode_pieces(self._split.split(text))

    def _encode_pieces(self, pieces: list[str]) -> list[int]:
        ids: list[int] = []
        for piece in pieces:
            if not piece:
                continue
            token = self._added_ids.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._encode_piece(piece))
        return ids

    def uncached_chars(self, text: str, add_special_tokens: bool = False) -> int:
        """How much of ``text`` ``encode`` would tokenize rather than find cached, in characters: what encoding it
        costs, for the price of a split and a few lookups (the cache is not reordered)."""
        if not self._piecewise or (add_special_tokens and (self._prefix is None or self._suffix is None)):
            return len(text)
        return self._uncached(self._pieces(text))

    def encode_within(self, text: str, add_special_tokens: bool, max_uncached_chars: int) -> list[int] | None:
        """``encode(text, add_special_tokens)`` if at most ``max_uncached_chars`` of ``text`` are not cached (see
        ``uncached_chars``); else None, nothing encoded. One split serves both the check and the encoding."""
        if not self._piecewise or (add_special_tokens and (self._prefix is None or self._suffix is None)):
            return None if len(text) > max_uncached_chars else self.encode(text, add_special_tokens)
        pieces = self._pieces(text)
        if self._uncached(pieces) > max_uncached_chars:
            return None
        ids = self._encode_pieces(pieces)
        if add_special_tokens:
            assert self._prefix is not None and self._suffix is not None
            return [*self._prefix, *ids, *self._suffix]
        return ids

    def _pieces(self, text: str) -> list[str]:
        return [text] if self._split is None else self._split.split(text)

    def _uncached(self, pieces: list[str]) -> int:
        added, cache, probation = self._added_ids, self._cache, self._probation
        return sum(len(p) for p in pieces if p not in added and p not in cache and p not in probation)

    def encode_chat(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """A chat's token ids with vLLM's defaults."""
        return prompt_token_ids(self, ChatPrompt(messages, tools))[0]

    def _encode_raw(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) >= GIL_FREE_ENCODE_CHARS:
            return _encode_gil_free(self.tokenizer, text, add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def _encode_piece(self, piece: str) -> list[int]:
        cache = self._cache
        # Lookups take no lock: each OrderedDict call is atomic under the GIL, and a hit evicted by another thread
        # between the two calls is still a correct answer.
        hit = cache.get(piece)
        if hit is not None:
            with contextlib.suppress(KeyError):
                cache.move_to_end(piece)
            return hit[0]
        waiting = self._probation.get(piece)
        if waiting is not None:  # seen a second time: into the cache proper
            ids = waiting[0].tolist()
            with self._lock:
                if self._probation.pop(piece, None) is not None:  # unless another thread moved it meanwhile
                    self._probation_held -= waiting[1]
                    self._keep(piece, (ids, _entry_bytes(piece, ids)))
            return ids
        ids = self._encode_raw(piece, False)
        size = _entry_bytes(piece, ids)
        if size > self._max_piece_bytes:
            return ids
        with self._lock:
            if self._seen_before(piece):
                self._keep(piece, (ids, size))
            elif (packed := _packed_bytes(piece, ids)) <= self._probation_bytes:
                probation = self._probation
                old = probation.pop(piece, None)
                if old is not None:
                    self._probation_held -= old[1]
                probation[piece] = (array("I", ids), packed)
                self._probation_held += packed
                while self._probation_held > self._probation_bytes:
                    _, (_, dropped) = probation.popitem(last=False)
                    self._probation_held -= dropped
        return ids

    def _keep(self, piece: str, entry: tuple[list[int], int]) -> None:
        """Into the cache proper, the least recently used out past its bound. Called holding the lock."""
        cache = self._cache
        old = cache.pop(piece, None)  # another thread may have cached it meanwhile
        if old is not None:
            self._cached_bytes -= old[1]
        cache[piece] = entry
        self._cached_bytes += entry[1]
        while self._cached_bytes > self._main_bytes:
            _, (_, dropped) = cache.popitem(last=False)
            self._cached_bytes -= dropped

    def _seen_before(self, piece: str) -> bool:
        """Whether ``piece`` was encoded before (and has left probation since); notes it if not. Called holding the
        lock. A sighting lost to a newer piece in its slot only delays the piece's way into the cache proper."""
        sightings = self._sightings
        if not sightings:
            return True
        # A stable hash, not ``hash()``: that one is seeded per process, so which pieces shared a slot (and lost
        # their sighting) changed from run to run, and so did what the cache held after the same traffic.
        seen = zlib.crc32(piece.encode("utf-8", "surrogatepass"))
        slot = seen & self._sightings_mask
        if sightings[slot] == seen:
            return True
        sightings[slot] = seen
        return False

    @property
    def cached_bytes(self) -> int:
        """What the piece cache holds now, probation included, in bytes (never more than ``cache_bytes``)."""
        return self._cached_bytes + self._probation_held

    @property
    def probation_bytes(self) -> int:
        """The bound of the probation segment, in bytes (0: a piece is cached when first seen)."""
        return self._probation_bytes


def _encode_gil_free(tokenizer: Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """``text``'s token ids, encoded with the GIL released. ``encode_batch_fast`` (tokenizers >= 0.20) gives the same
    ids without the character offsets we never read: with them (``encode_batch``), a 22k-token prompt cost ~25% more
    CPU, and dropping its ``Encoding`` held the GIL ~1.1 ms (bench/results/keying_gil.md)."""
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    return encode([text], add_special_tokens=add_special_tokens)[0].ids


_INT_BYTES = sys.getsizeof(1 << 20)
"""A token id above CPython's small-int cache is an object of its own (28 bytes), beside its slot in the list."""
_ENTRY_OVERHEAD_BYTES = 160
"""The cache's own per-entry cost: the ``OrderedDict`` slot and link, the tuple."""
_ARRAY_BYTES = sys.getsizeof(array("I"))


def _entry_bytes(piece: str, ids: list[int]) -> int:
    """A cache entry's size in bytes, as Python holds it (an upper bound: small ids are shared objects)."""
    return sys.getsizeof(piece) + sys.getsizeof(ids) + _INT_BYTES * len(ids) + _ENTRY_OVERHEAD_BYTES


def _packed_bytes(piece: str, ids: list[int]) -> int:
    """A probation entry's size in bytes: the piece, and its ids in an ``array`` of 4 bytes each."""
    return sys.getsizeof(piece) + _ARRAY_BYTES + 4 * len(ids) + _ENTRY_OVERHEAD_BYTES


# -- token ids -> block keys ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptKeys:
    """A prompt's block keys and its size in tokens (estimated when ``exact`` is False)."""

    keys: list[BlockKey]
    prompt_tokens: int
    """Tokens the engine prefills for the request: the sum over a completions batch."""
    exact: bool
    tokens_per_key: int
    reused_blocks: int = 0
    """Leading keys shared with the latest prompt that began the same way (``kvstate.key_memo``): a shared system
    prompt's whole blocks, where this prompt's own text begins. 0: none, or not known."""


@dataclass(frozen=True)
class Deferred:
    """A prompt ``PromptKeyer.keys_inline`` leaves to a worker thread (more of it is new to the piece cache than an
    event loop may tokenize), with its chat's text as rendered there: ``PromptKeyer.keys`` tokenizes that, not a
    second rendering (a 22k-token chat's: 0.15-1 ms holding the GIL, bench/results/keying_gil.md)."""

    prompt: Prompt
    rendered: str | None = None
    """The chat's text (vLLM's rendering); None for a completion, whose text needs none."""


class PromptKeyer:
    """A prompt's block keys for one model: token-exact with a tokenizer (or token-id prompts), else text-approximate.

    Keys are rooted at ``root_key(model, lora)``: a request that names a LoRA adapter gets the adapter's key space,
    the one the engines' ``BlockStored`` events for that adapter are keyed in (``kvstate.events.ingest``).
    """

    def __init__(
        self,
        model: str,
        block_size: int = 16,
        tokenizer: ChatTokenizer | None = None,
        key_memo_bytes: int = KEY_MEMO_BYTES,
    ) -> None:
        """``key_memo_bytes``: bound of the memo of block keys already computed (``kvstate.key_memo``); 0: none."""
        self.model = model
        self.block_size = block_size
        self.tokenizer = tokenizer
        self._roots: dict[str | None, BlockKey] = {}
        self.key_memo = BlockKeyMemo(key_memo_bytes)

    def root(self, lora: str | None = None) -> BlockKey:
        hit = self._roots.get(lora)
        if hit is None:
            hit = self._roots[lora] = root_key(self.model, lora)
        return hit

    def keys(
        self, prompt: Prompt | Deferred, lora: str | None = None, pause: Callable[[], None] | None = None
    ) -> PromptKeys:
        """``prompt``'s keys (the first prompt's, for a completions batch) and its prompt tokens; a ``Deferred``'s
        chat is not rendered again. ``pause``: called between slices of the hashing
        (``kvstate.keys.chain_packed_keys``), from a worker thread only."""
        rendered = None
        if isinstance(prompt, Deferred):
            rendered = prompt.rendered
            prompt = prompt.prompt
        if rendered is not None and self.tokenizer is not None:
            ids = self.tokenizer.encode(rendered, prompt.add_special_tokens)  # as prompt_token_ids encodes a chat
            keys, reused = self.key_memo.chain_reusing(self.root(lora), ids, self.block_size, pause)
            return PromptKeys(keys, len(ids), True, self.block_size, reused)
        if self.tokenizer is not None or (
            isinstance(prompt, CompletionPrompt) and not isinstance(prompt.prompts[0], str)
        ):
            sequences = prompt_token_ids(self.tokenizer or _NO_TEXT, prompt)
            total = sum(len(s) for s in sequences)
            keys, reused = self.key_memo.chain_reusing(self.root(lora), sequences[0], self.block_size, pause)
            return PromptKeys(keys, total, True, self.block_size, reused)
        return self._approx(prompt, lora)

    def keys_inline(self, prompt: Prompt, lora: str | None, max_uncached_chars: int) -> PromptKeys | Deferred:
        """``keys(prompt, lora)`` if computing them tokenizes at most ``max_uncached_chars`` characters that the
        piece cache does not hold; else a ``Deferred``, having tokenized nothing (only rendered the chat, which it
        carries): a caller on an event loop then runs ``keys`` of it on a worker thread. Hashing alone (token ids,
        text-approximate keys) costs ~1 us per block and always runs."""
        tok = self.tokenizer
        if tok is None:
            return self.keys(prompt, lora)
        if isinstance(prompt, ChatPrompt):
            text = tok.render_chat(prompt)
            ids = tok.encode_within(text, prompt.add_special_tokens, max_uncached_chars)
            if ids is None:
                return Deferred(prompt, text)
            keys, reused = self.key_memo.chain_reusing(self.root(lora), ids, self.block_size)
            return PromptKeys(keys, len(ids), True, self.block_size, reused)
        texts = [p for p in prompt.prompts if isinstance(p, str)]
        if sum(tok.uncached_chars(t, prompt.add_special_tokens) for t in texts) > max_uncached_chars:
            return Deferred(prompt)
        return self.keys(prompt, lora)

    def approximate_keys(self, prompt: Prompt, lora: str | None, max_chars: int, size: int | None = None) -> PromptKeys:
        """Keys for a prompt too large to tokenize, at a cost bounded by ``max_chars`` whatever its size: text-
        approximate keys of its first ``max_chars`` characters (its leading ``max_chars / 4`` ids for token-id
        prompts: those keys are exact), and a token count estimated from ``prompt_chars`` (``size``, when the
        caller has it already; a token-id count is exact). Nothing is tokenized."""
        if isinstance(prompt, CompletionPrompt) and not isinstance(prompt.prompts[0], str):
            head = prompt.prompts[0][: max(1, max_chars // APPROX_CHARS_PER_TOKEN)]
            total = sum(len(p) for p in prompt.prompts)
            return PromptKeys(self.keys_for_tokens(head, lora), total, True, self.block_size)
        keys = self._approx(prompt, lora, max_chars).keys
        size = prompt_chars(prompt) if size is None else size
        return PromptKeys(keys, max(1, size // APPROX_CHARS_PER_TOKEN), False, self.block_size)

    def keys_for_tokens(self, token_ids: Sequence[int], lora: str | None = None) -> list[BlockKey]:
        return self.key_memo.chain(self.root(lora), token_ids, self.block_size)

    def keys_for_chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        lora: str | None = None,
    ) -> PromptKeys:
        """A chat's keys with vLLM's defaults (what most callers send)."""
        return self.keys(read_prompt(messages=messages, tools=tools), lora)

    def _approx(self, prompt: Prompt, lora: str | None, max_chars: int | None = None) -> PromptKeys:
        """Text-approximate keys; with ``max_chars``, of the first ``max_chars`` characters only, and only the
        leading messages holding them are read."""
        chars = self.block_size * APPROX_CHARS_PER_TOKEN
        if isinstance(prompt, ChatPrompt):
            schemas = tool_schemas(prompt.tools)
            head = f"<tools>{schemas}\n" if schemas else ""
            if max_chars is None:
                texts = [head + "".join(f"<{m['role']}>{m['content']}\n" for m in conversation(prompt.messages))]
            else:
                texts = [_leading_text(head, conversation(_leading_messages(prompt.messages, max_chars)), max_chars)]
        else:
            texts = [p for p in prompt.prompts if isinstance(p, str)]
        first = texts[0] if max_chars is None else texts[0][:max_chars]
        keys = text_block_keys(approx_root_key(self.model, lora), first, chars)
        tokens = sum(max(1, len(t) // APPROX_CHARS_PER_TOKEN) for t in texts)
        return PromptKeys(keys, tokens, False, self.block_size)


def prompt_chars(prompt: Prompt) -> int:
    """A prompt's size in characters, known before it is rendered or tokenized (``limits`` in cognitora.yaml bound
    it): its text, plus ``APPROX_CHARS_PER_TOKEN`` for each token id and each other JSON value (a message, a part,
    a number: each renders with markup around it). One pass over the values; no text is copied."""
    if isinstance(prompt, CompletionPrompt):
        return sum(len(p) if isinstance(p, str) else APPROX_CHARS_PER_TOKEN * len(p) for p in prompt.prompts)
    return _json_chars(prompt.messages) + _json_chars(prompt.tools) + _json_chars(prompt.chat_template_kwargs)


def _json_chars(value: object) -> int:
    if value is None:
        return 0
    total = 0
    todo = [value]
    while todo:  # iterative: a deeply nested body must not overflow the stack here
        item = todo.pop()
        if isinstance(item, str):
            total += len(item)
            continue
        total += APPROX_CHARS_PER_TOKEN
        if isinstance(item, (list, tuple)):
            if set(map(type, item)) <= _SCALARS:  # numbers (token ids): counted at C speed
                total += APPROX_CHARS_PER_TOKEN * len(item)
            else:
                todo.extend(item)
        elif isinstance(item, (dict, Mapping)):  # dict first: the ABC's check is slow, and JSON gives dicts
            todo.extend(item.values())
    return total


_SCALARS = frozenset({int, float, bool, type(None)})


def _leading_messages(messages: Sequence[Message], max_chars: int) -> Sequence[Message]:
    """The fewest leading ``messages`` whose size reaches ``max_chars`` (all of them if they do not)."""
    total = 0
    for i, message in enumerate(messages):
        total += _json_chars(message)
        if total >= max_chars:
            return messages[: i + 1]
    return messages


def _leading_text(head: str, chat: Sequence[Mapping[str, Any]], max_chars: int) -> str:
    """The approximate text of ``chat`` (``_approx``), its first ``max_chars`` characters only: a long content is
    cut before it is copied."""
    out = [head[:max_chars]]
    left = max_chars - len(out[0])
    for m in chat:
        if left <= 0:
            break
        content = m["content"]
        piece = f"<{m['role']}>{content[:left] if isinstance(content, str) else content}\n"[:left]
        out.append(piece)
        left -= len(piece)
    return "".join(out)


class _TokenIdsOnly:
    """The tokenizer of a keyer without one: token-id prompts need none, anything else is a bug in the caller."""

    def render_chat(self, prompt: ChatPrompt) -> str:
        raise AssertionError("a keyer without a tokenizer renders no chat")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise AssertionError("a keyer without a tokenizer encodes no text")


_NO_TEXT = _TokenIdsOnly()
