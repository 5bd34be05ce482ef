"""No request can stall a gateway (issue 11, finding 1): what one huge prompt may cost, and that it costs no more.

Unit level: the store's speculative expiry is linear in what it forgets; the tokenizer's piece cache is bounded in
bytes, and a long text is encoded without holding the GIL.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tokenizers import Tokenizer

from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer

M, A = "m", "10.0.0.1:8000"


async def test_expiring_many_speculative_entries_is_linear() -> None:
    # Quadratic before (one next(iter(dict)) per purged entry, each skipping the slots already popped): 100k
    # entries took 3 to 7 s, with the event loop frozen. Linear, 200k take ~0.1 s; the bound leaves room for a
    # loaded machine and still fails the quadratic purge by an order of magnitude.
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    n = 200_000
    await store.add_speculative(M, A, list(range(1, n + 1)), ttl_s=10.0)
    now[0] = 20.0
    started = time.perf_counter()
    await store.add_speculative(M, A, [n + 1], ttl_s=10.0)
    assert time.perf_counter() - started < 2.0
    assert await store.match_prefix(M, [1]) == {}
    assert (await store.match_prefix(M, [n + 1]))[A].blocks == 1


async def test_speculative_entries_past_the_cap_are_dropped_oldest_first_in_linear_time() -> None:
    now = [0.0]
    cap = 100_000
    store = MemoryStore(max_blocks_per_endpoint=cap, clock=lambda: now[0])
    await store.add_speculative(M, A, list(range(1, cap + 1)), ttl_s=1000.0)
    started = time.perf_counter()
    for i in range(50):
        first = cap + 1 + i * 1000
        await store.add_speculative(M, A, list(range(first, first + 1000)), ttl_s=1000.0)
    assert time.perf_counter() - started < 3.0
    # The oldest 50k are gone: the first chain's tail (a chain is stored head last, so tails go first).
    assert await store.match_prefix(M, [cap]) == {}
    assert (await store.match_prefix(M, [1]))[A].blocks == 1
    assert (await store.match_prefix(M, [cap + 50_000]))[A].blocks == 1


# -- the tokenizer's piece cache ---------------------------------------------------------------------------------


def test_the_piece_cache_is_bounded_in_bytes_and_keeps_no_huge_piece(smollm2_dir: Path) -> None:
    tok = ChatTokenizer(smollm2_dir / "tokenizer.json", cache_bytes=1 << 20)
    plain = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    for i in range(300):  # ~300 distinct 1,000-character pieces: far more than 1 MiB of entries
        text = f"<|im_start|>user\nquestion {i}: " + "lorem ipsum dolor " * 55 + "<|im_end|>"
        assert tok.encode(text) == plain.encode(text, add_special_tokens=False).ids
        assert tok.cached_bytes <= 1 << 20
    # A piece larger than a sixteenth of the cache is encoded exactly but not kept: it would flush the others.
    huge = "a " * 200_000
    assert tok.encode(huge) == plain.encode(huge, add_special_tokens=False).ids
    assert tok.uncached_chars(huge) == len(huge)
    # What is cached is found again: no characters left to tokenize.
    assert tok.uncached_chars(text) == 0
    assert tok.uncached_chars(text + "new words") == len("new words")


def test_a_long_text_is_encoded_without_holding_the_gil(smollm2_dir: Path) -> None:
    # HF Tokenizer.encode holds the GIL for the whole call (a thread running it froze the event loop with it); the
    # ChatTokenizer encodes long texts with encode_batch, which releases it. Measured: the other thread's longest
    # wait is a few ms of a call of ~0.5 s (the list of ids is built with the GIL held).
    tok = ChatTokenizer(smollm2_dir / "tokenizer.json")
    text = "a " * 150_000
    gaps: list[float] = []
    done = threading.Event()

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    thread = threading.Thread(target=ticker)
    thread.start()
    started = time.perf_counter()
    tok.encode(text)
    took = time.perf_counter() - started
    done.set()
    thread.join()
    assert max(gaps) < max(0.1, took / 3), (max(gaps), took)
