"""``previous_response_id``: the earlier conversation a Responses request continues, which its body does not carry.

**What vLLM does** (``vllm/entrypoints/openai/responses/serving.py``): only with ``VLLM_ENABLE_RESPONSES_API_STORE=1``
does a server keep each response (``response_store``) and the messages it was rendered from (``msg_store``), in
its own memory, never evicted. A request naming ``previous_response_id`` is rendered as: its ``instructions`` (as
the system message), the stored messages *without their system messages* (instructions do not carry over), one
assistant message per ``output_text`` part of the stored response's message items (reasoning and tool calls of the
output are skipped), then its own ``input``. Without the store, or on another server, the answer is 404 ("Response
with id '...' not found.").

**What the router does.** It keys only what it sees, so without help a continued conversation's keys stop matching
after the instructions. ``ResponseHistory`` is a bounded map, in the gateway process, from a response id to what
vLLM would reuse: the messages of the request that produced it (system messages removed) and its output texts, and
the endpoint that answered (only that engine holds the conversation). The adapter records each Responses answer it
sees (``remember``: the id and output from the JSON body, or from the stream's ``response.completed``); a later
request naming that id is rendered whole (``kvstate.surfaces.responses``), keyed as the engine will compute it, and
placed on the engine that holds it. A miss (evicted, another gateway replica, a response this gateway never saw)
leaves keys for what the body shows; the engine still answers 404 or continues as it would.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvstate.prompt import ChatPrompt, prompt_chars

__all__ = ["DEFAULT_HISTORY_BYTES", "PriorResponse", "ResponseHistory", "response_output_texts"]

DEFAULT_HISTORY_BYTES = 64 << 20
"""Default bound of a history (its messages' size in characters, about bytes): ~400 agent sessions of 150 kB."""


@dataclass(frozen=True)
class PriorResponse:
    """What a continued conversation reuses of one earlier response (see the module docstring)."""

    messages: tuple[Mapping[str, Any], ...]
    """The messages the earlier request was rendered from, its system messages removed."""
    output_texts: tuple[str, ...]
    endpoint: str | None

    def conversation(self) -> list[Mapping[str, Any]]:
        """The messages vLLM puts between a continuing request's instructions and its input."""
        return [*self.messages, *({"role": "assistant", "content": t} for t in self.output_texts)]


def response_output_texts(response: Mapping[str, Any]) -> list[str]:
    """The ``output_text`` parts of a Responses answer's message items, in order (what vLLM reuses of it)."""
    texts: list[str] = []
    output = response.get("output")
    if not isinstance(output, list):
        return texts
    for item in output:
        if not isinstance(item, Mapping) or item.get("type") != "message" or not isinstance(item.get("content"), list):
            continue
        texts.extend(
            str(p["text"])
            for p in item["content"]
            if isinstance(p, Mapping) and p.get("type") == "output_text" and isinstance(p.get("text"), str)
        )
    return texts


class ResponseHistory:
    """Response id -> ``PriorResponse``, least recently used dropped past ``max_bytes``. Thread-safe."""

    def __init__(self, max_bytes: int = DEFAULT_HISTORY_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[PriorResponse, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def remember(
        self,
        response_id: str,
        messages: Sequence[Mapping[str, Any]],
        output_texts: Sequence[str],
        endpoint: str | None = None,
    ) -> None:
        """Record the answer ``response_id`` to a request rendered from ``messages``, as served by ``endpoint``. An
        entry larger than a quarter of the bound is not kept (one huge session must not flush everyone's)."""
        kept = tuple(m for m in messages if not (isinstance(m, Mapping) and m.get("role") == "system"))
        entry = PriorResponse(kept, tuple(output_texts), endpoint)
        size = prompt_chars(ChatPrompt(kept)) + sum(map(len, output_texts)) + len(response_id)
        if size > self.max_bytes // 4:
            return
        with self._lock:
            old = self._entries.pop(response_id, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[response_id] = (entry, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def get(self, response_id: str) -> PriorResponse | None:
        with self._lock:
            hit = self._entries.get(response_id)
            if hit is None:
                return None
            self._entries.move_to_end(response_id)
            return hit[0]
