"""The prompt's keys: the one prompt normalizer (``kvstate.prompt``) rooted at the model's keyer, and the checks a
prompt must pass before it is read (valid Unicode, a size the gateway will tokenize).

Never blocks the event loop for long (``limits``): a prompt over ``exact_prompt_max_chars`` is not tokenized
(approximate keys, or ``PromptTooLarge``); one with more than ``inline_tokenize_max_chars`` the piece cache lacks is
tokenized on the keying thread; the rest, nearly every request, on the caller's loop. The keying thread gets the chat
as the loop rendered it, and lets the loop take the GIL between slices of its hashing (``let_the_loop_in``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Mapping

from cognitora.config import CognitoraConfig, ModelConfig
from cognitora.request import RouteRequest
from cognitora.telemetry import RouterStats
from kvstate.prompt import Deferred, PromptKeyer, PromptKeys, prompt_chars, read_prompt
from kvstate.surfaces import surface_keys, surface_prompt_chars

__all__ = ["GIL_PAUSE_S", "Keying", "PromptTooLarge", "invalid_unicode", "let_the_loop_in"]


class PromptTooLarge(Exception):
    """A prompt over ``limits.exact_prompt_max_chars`` with ``over_limit: reject``: the message is the client's."""


class Keying:
    """Each model's prompt keyer and the one keying thread. One per core."""

    def __init__(self, config: CognitoraConfig, keyers: Mapping[str, PromptKeyer], stats: RouterStats) -> None:
        self.config = config
        self.keyers = dict(keyers)
        self._stats = stats
        self._key_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._offloaded_chars = 0
        """Characters of prompts submitted to the keying thread and not done yet (running or queued)."""

    async def keys(self, model: ModelConfig, req: RouteRequest) -> PromptKeys:
        """The prompt's keys, rooted at the LoRA adapter when ``req.model`` names one. Raises ``PromptTooLarge``,
        and ``kvstate.prompt.PromptError`` (or ``UnicodeError``, ``RecursionError``) for a prompt it cannot read."""
        read = req.surface_request
        prompt = (
            read.prompt
            if read is not None
            else read_prompt(
                messages=req.messages,
                prompt=req.prompt,
                tools=req.tools,
                add_special_tokens=req.add_special_tokens,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs,
            )
        )
        lora = req.model if req.model in model.loras else None
        keyer = self.keyers[model.name]
        limits = self.config.limits
        size = prompt_chars(prompt) if read is None else surface_prompt_chars(read)
        if size > limits.exact_prompt_max_chars:
            self._stats.oversized_prompts += 1
            if limits.over_limit == "reject":
                raise PromptTooLarge(
                    f"the prompt is too large for this gateway: {size:,} characters, the limit is "
                    f"{limits.exact_prompt_max_chars:,}; shorten it or split it over several requests"
                )
            return keyer.approximate_keys(prompt, lora, limits.exact_prompt_max_chars, size)
        if read is not None and read.media:
            return surface_keys(keyer, read, lora)  # media keyed by content (kvstate.surfaces.tokens)
        if size <= limits.inline_tokenize_max_chars:
            return keyer.keys(prompt, lora)
        keys = keyer.keys_inline(prompt, lora, limits.inline_tokenize_max_chars)
        if isinstance(keys, PromptKeys):
            return keys
        return await self._keys_on_thread(keyer, keys, lora, size)

    async def _keys_on_thread(self, keyer: PromptKeyer, deferred: Deferred, lora: str | None, size: int) -> PromptKeys:
        """``keyer.keys`` on the keying thread, unless ``limits.offload_queue_max_chars`` are already waiting there:
        then approximate keys at once (the request is not refused: only a burst of long prompts put it here)."""
        limits = self.config.limits
        if self._offloaded_chars and self._offloaded_chars + size > limits.offload_queue_max_chars:
            self._stats.offload_queue_full += 1
            return keyer.approximate_keys(deferred.prompt, lora, limits.exact_prompt_max_chars, size)
        if self._key_thread is None:
            # One thread: tokenizing is CPU-bound, and one core is all it may take from the gateway's own work.
            self._key_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cognitora-keys")
        self._stats.offloaded_prompts += 1
        self._offloaded_chars += size
        loop = asyncio.get_running_loop()
        job = self._key_thread.submit(keyer.keys, deferred, lora, let_the_loop_in)

        def done(_: concurrent.futures.Future[PromptKeys]) -> None:
            # When the job ends, not when this request stops waiting for it (a client gone): it still holds the
            # thread until then.
            self._offloaded_chars -= size

        def report(j: concurrent.futures.Future[PromptKeys]) -> None:
            # On the thread; the count is the loop's. A loop already closed has nobody left to count for.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done, j)

        job.add_done_callback(report)
        return await asyncio.wrap_future(job)

    def close(self, *, drop_queued: bool = True) -> None:
        """Stop the keying thread; it exits once its queue is empty. ``drop_queued``: a prompt still queued there is
        dropped (its request is gone with the core); False when only this core goes, not the process's requests
        (a config reload retiring it: a request placed on it just before the swap still waits for its keys)."""
        if self._key_thread is not None:
            self._key_thread.shutdown(wait=False, cancel_futures=drop_queued)
            self._key_thread = None


GIL_PAUSE_S = 100e-6
"""How long the keying thread sleeps between slices of a long prompt's hashing (``let_the_loop_in``)."""


def let_the_loop_in() -> None:
    """The keying thread's pause between slices of a long prompt's hashing (``kvstate.keys.chain_packed_keys``), which
    holds the GIL throughout: a 22k-token prompt's ~1 ms of it (~3 ms before) made the event loop, waking meanwhile,
    wait for the GIL up to all of it. A sleep, not ``sleep(0)``: that releases the GIL too, but asks for it back at
    once, and may take it before the loop's thread, still waking, does (CPython hands the GIL over only when the
    waiter has asked for 5 ms). ~100 us per 256 blocks: ~1 ms on a 22k-token prompt's ~50 ms
    (bench/results/keying_gil.md)."""
    time.sleep(GIL_PAUSE_S)


def invalid_unicode(req: RouteRequest) -> str | None:
    """Where the request's text holds a lone surrogate (JSON's "\\ud800" decodes to one; no engine can tokenize it),
    or None. One pass over the values that builds no paths (a 10 MB body is up to ~1M values: giving each its path
    took a second of the event loop); the path is traced only in a body that has one."""
    for where, root in (("messages", req.messages), ("prompt", req.prompt)):
        if _has_lone_surrogate(root):
            return _surrogate_path(where, root)
    return None


_SCALARS = frozenset({int, float, bool, type(None)})


def _has_lone_surrogate(value: object) -> bool:
    todo = [value]
    while todo:  # iterative: a deeply nested body must not overflow the stack here
        item = todo.pop()
        if isinstance(item, str):
            # isascii() is O(1) in CPython (a flag of the string): no 10 MB copy to find nothing.
            if not item.isascii() and not _encodes(item):
                return True
        elif isinstance(item, list | tuple):
            if set(map(type, item)) <= _SCALARS:  # token ids: read at C speed
                continue
            todo.extend(item)
        elif isinstance(item, (dict, Mapping)):  # dict first: the ABC's check is slow, and JSON gives dicts
            todo.extend(item.values())
    return False


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_path(where: str, value: object) -> str:
    todo: list[tuple[str, object]] = [(where, value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str):
            if not _encodes(item):
                return path
        elif isinstance(item, Mapping):
            todo.extend((f"{path}.{k}", v) for k, v in item.items())
        elif isinstance(item, list | tuple):
            todo.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
    return where
