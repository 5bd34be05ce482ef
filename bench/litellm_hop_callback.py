"""A diagnostic LiteLLM callback that timestamps each request's hops inside the proxy (issue 45).

Loaded beside a target's own callbacks when ``COGNITORA_BENCH_HOPS`` names a directory (bench/targets.py copies it
next to the proxy's config, as LiteLLM imports callbacks from there). The load generator then stamps every request
with ``x-bench-id`` and ``x-bench-sent`` (its wall clock at send) and writes the client's first token
(bench/loadgen.py); this callback appends one JSON line per hop to ``DIR/proxy-PID.jsonl``, wall clock:

- ``pre``: the proxy's pre-call hook (the request parsed and authenticated);
- ``first``: the first chunk through the streaming-iterator hook (only with ``COGNITORA_BENCH_HOPS_ITER=1``: an
  iterator override makes LiteLLM wrap every stream and count its served output at the end, which is itself one of
  the suspects, so a target that has none keeps none unless asked);
- ``lag``: the event loop ran a 10 ms timer this late (over 20 ms; a sampler task started at the first request);
- ``stall``: while the loop has not run that timer for over 50 ms, a watchdog thread samples every thread's stack
  (every 50 ms at most): what the loop is doing or waiting for;
- ``gc``: a garbage collection that took over 5 ms (its generation, duration and thread);
- ``done``: at the success log, LiteLLM's ``api_call_start_time`` (the request leaves for the engine) and
  ``completion_start_time`` (the engine's first chunk is in).

``bench/litellm_hops.py`` joins the lines. Imports nothing of the project.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

_DIR = os.environ.get("COGNITORA_BENCH_HOPS", "")
_OUT = open(os.path.join(_DIR, f"proxy-{os.getpid()}.jsonl"), "a", buffering=1) if _DIR else None  # noqa: SIM115


def _write(record: dict[str, Any]) -> None:
    if _OUT is not None:
        _OUT.write(json.dumps(record) + "\n")


def _bench_id(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    psr = data.get("proxy_server_request")
    if not isinstance(psr, dict):
        params = data.get("litellm_params")
        psr = params.get("proxy_server_request") if isinstance(params, dict) else None
    headers = psr.get("headers") if isinstance(psr, dict) else None
    if not isinstance(headers, dict):
        return None
    for key, value in headers.items():
        if str(key).lower() == "x-bench-id":
            return str(value)
    return None


def _ts(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float):
        return float(value)
    return None


_beat = [0.0]


def _stack(frame: Any) -> list[str]:
    return [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}:{f.name}" for f in traceback.extract_stack(frame)]


def _watchdog() -> None:
    while True:
        time.sleep(0.05)
        stale = time.perf_counter() - _beat[0]
        if stale > 0.05:
            names = {t.ident: t.name for t in threading.enumerate()}
            stacks = {names.get(ident, str(ident)): _stack(f)[-12:] for ident, f in sys._current_frames().items()}
            _write({"ev": "stall", "t": time.time(), "stale": stale, "stacks": stacks})


async def _lag_sampler() -> None:
    threading.Thread(target=_watchdog, name="hop-watchdog", daemon=True).start()
    while True:
        start = _beat[0] = time.perf_counter()
        await asyncio.sleep(0.01)
        lag = time.perf_counter() - start - 0.01
        if lag > 0.02:
            _write({"ev": "lag", "t": time.time(), "lag": lag})


_gc_start: list[float] = []


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_start[:] = [time.perf_counter()]
    elif _gc_start:
        took = time.perf_counter() - _gc_start[0]
        if took > 0.005:
            gen, thread = info.get("generation"), threading.current_thread().name
            _write({"ev": "gc", "t": time.time(), "gen": gen, "dur": took, "thread": thread})


class HopTimes(CustomLogger):
    _sampler: asyncio.Task[None] | None = None

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        if HopTimes._sampler is None and _OUT is not None:
            HopTimes._sampler = asyncio.get_running_loop().create_task(_lag_sampler())
            gc.callbacks.append(_gc_timer)
        _write({"ev": "pre", "id": _bench_id(data), "call": data.get("litellm_call_id"), "t": time.time()})
        return None

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        kw = kwargs if isinstance(kwargs, dict) else {}
        _write(
            {
                "ev": "done",
                "id": _bench_id(kw),
                "call": kw.get("litellm_call_id"),
                "t": time.time(),
                "start": _ts(start_time),
                "api_call_start": _ts(kw.get("api_call_start_time")),
                "completion_start": _ts(kw.get("completion_start_time")),
            }
        )


class HopTimesWithIterator(HopTimes):
    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        first = True
        async for chunk in response:
            if first:
                first = False
                _write(
                    {
                        "ev": "first",
                        "id": _bench_id(request_data),
                        "call": request_data.get("litellm_call_id"),
                        "t": time.time(),
                    }
                )
            yield chunk


callbacks = HopTimesWithIterator() if os.environ.get("COGNITORA_BENCH_HOPS_ITER") == "1" else HopTimes()
