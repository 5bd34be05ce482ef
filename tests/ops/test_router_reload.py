"""A config reload (``cognitora.ops.reload.LiveRouter``) leaves nothing of the Router it replaced behind: the model's
keyer (tokenizer, chat template, caches) is the one in force when its settings and files are unchanged, the old
Router is freed once its last attempt ends, its keying thread stops, and an attempt no gateway ever reported the end
of expires (``placement.inflight_ttl_s``) instead of keeping the old Router alive. The LiteLLM proxy's RSS grew
~40 MiB a reload while each reload loaded the tokenizer again (docs/operations.md, "Soak"). Real tokenizer, real
Router over the in-process store; the assertions are on objects, not on RSS."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cognitora.config import load_config
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.ops.reload import ConfigSource, LiveRouter
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore

DEADLINE_S = 10.0
RELOADS = 20


def write_config(path: Path, tokenizer: Path, interval_s: float, **extra: Any) -> None:
    config = {
        "scrape": {"interval_s": interval_s},
        # A prompt over 64 characters is keyed on the Router's keying thread: each Router starts its own.
        "limits": {"inline_tokenize_max_chars": 64},
        "models": [
            {
                "name": "m",
                "tokenizer": str(tokenizer),
                "endpoints": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}],
            }
        ],
        **extra,
    }
    path.write_text(yaml.safe_dump(config))


def live_router(tmp_path: Path, smollm2_dir: Path, **extra: Any) -> tuple[LiveRouter, Path, Path]:
    models = tmp_path / "model"
    shutil.copytree(smollm2_dir, models)  # a copy: a test touches the tokenizer file
    tokenizer = models / "tokenizer.json"
    path = tmp_path / "cognitora.yaml"
    write_config(path, tokenizer, 1.0, **extra)
    return LiveRouter(Router(load_config(path), MemoryStore()), ConfigSource.file(path)), path, tokenizer


def request(rng: random.Random) -> RouteRequest:
    words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(40))  # unseen pieces: tokenized on the thread
    return RouteRequest(model="m", messages=[{"role": "user", "content": words}])


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        gc.collect()
        await asyncio.sleep(0.02)


def keying_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("cognitora-keys")]


async def test_reloads_keep_the_keyer_and_release_every_replaced_router(tmp_path: Path, smollm2_dir: Path) -> None:
    live, path, tokenizer = live_router(tmp_path, smollm2_dir)
    keyer = live.current.prompt_keyer("m")
    rng = random.Random(7)
    replaced: list[weakref.ref[Router]] = []
    threads_before = set(keying_threads())
    for i in range(RELOADS):
        decision, attempt = await live.admit(request(rng))
        assert attempt is not None, decision
        attempt.finish(Outcome(OutcomeKind.COMPLETED, 200, prompt_tokens=50, completion_tokens=5))
        del decision, attempt
        write_config(path, tokenizer, 1.5 if i % 2 == 0 else 1.0)  # a change: a new Router each time
        replaced.append(weakref.ref(live.current))
        outcome = await live.reload("test")
        assert outcome.ok and outcome.changed == ("scrape",), outcome
        assert live.current.prompt_keyer("m") is keyer  # the tokenizer was not loaded again
    assert live.reloads == RELOADS
    assert live.stats.offloaded_prompts >= RELOADS  # every Router started its keying thread
    await until(lambda: all(ref() is None for ref in replaced), "every replaced Router freed")
    await until(lambda: len(set(keying_threads()) - threads_before) <= 1, "only the Router in force keys")
    await live.close()


async def test_a_changed_tokenizer_file_or_block_size_loads_a_new_keyer(tmp_path: Path, smollm2_dir: Path) -> None:
    live, path, tokenizer = live_router(tmp_path, smollm2_dir)
    first = live.current.prompt_keyer("m")
    stat = tokenizer.stat()
    os.utime(tokenizer, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # the same bytes, saved again
    write_config(path, tokenizer, 1.5)
    assert (await live.reload("test")).ok
    second = live.current.prompt_keyer("m")
    assert second is not first and second.tokenizer is not None and second.tokenizer is not first.tokenizer
    write_config(path, tokenizer, 1.5, placement={"inflight_ttl_s": 60.0})  # a change that is not the model's
    assert (await live.reload("test")).ok
    assert live.current.prompt_keyer("m") is second
    config = yaml.safe_load(path.read_text())
    config["models"][0]["block_size"] = 32
    path.write_text(yaml.safe_dump(config))
    assert (await live.reload("test")).ok
    third = live.current.prompt_keyer("m")
    assert third is not second and third.block_size == 32
    await live.close()


async def test_an_attempt_never_reported_does_not_keep_the_replaced_router(tmp_path: Path, smollm2_dir: Path) -> None:
    ttl_s = 0.5
    live, path, tokenizer = live_router(tmp_path, smollm2_dir, placement={"inflight_ttl_s": ttl_s})
    decision, attempt = await live.admit(request(random.Random(3)))
    assert attempt is not None, decision
    request_id = decision.request_id
    del decision, attempt  # the gateway forgot it: only the old Router's registry holds it
    old = weakref.ref(live.current)
    write_config(path, tokenizer, 1.5, placement={"inflight_ttl_s": ttl_s})
    assert (await live.reload("test")).ok
    await live.retire_idle()
    gc.collect()
    assert old() is not None and live.attempt(request_id) is not None  # its attempt is open: it stays

    async def look() -> None:
        await live.retire_idle()  # what ConfigWatch does on each look

    deadline = time.monotonic() + ttl_s + DEADLINE_S
    while old() is not None:
        assert time.monotonic() < deadline, "the replaced Router outlived its unreported attempt's ttl"
        await look()
        gc.collect()
        await asyncio.sleep(0.05)
    assert live.attempt(request_id) is None
    await live.close()
