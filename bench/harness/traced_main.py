"""Run a module's ``__main__`` with tracemalloc on and a snapshot every ``TRACED_EVERY_S`` seconds, each compared
with the first one after the warm-up: the sites (by traceback) that grew most, as JSON lines to ``TRACED_OUT``.

    TRACED_OUT=/tmp/c.jsonl python -m bench.harness.traced_main cognitora.cli collector --config c.yaml

Used by ``bench/litellm_rss.py --trace-collector`` to tell which of the collector's allocations grow. Frames kept
per allocation: ``TRACED_FRAMES`` (default 12). Only for benchmarks: tracing slows the process down.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
import tracemalloc

TOP = 20


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def _sampler(out: str, every_s: float) -> None:
    base: tracemalloc.Snapshot | None = None
    started = time.time()
    while True:
        time.sleep(every_s)
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if base is None:
            base = snap
        diffs = snap.compare_to(base, "traceback")
        top = [
            {
                "size_diff": d.size_diff,
                "count_diff": d.count_diff,
                "size": d.size,
                "traceback": [f"{f.filename}:{f.lineno}" for f in d.traceback],
            }
            for d in diffs[:TOP]
        ]
        line = {
            "t": round(time.time() - started, 1),
            "rss": _rss_bytes(),
            "traced": tracemalloc.get_traced_memory()[0],
            "tracemalloc_own": tracemalloc.get_tracemalloc_memory(),
            "top": top,
        }
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")


def main() -> None:
    module, sys.argv = sys.argv[1], sys.argv[1:]
    tracemalloc.start(int(os.environ.get("TRACED_FRAMES", "12")))
    every = float(os.environ.get("TRACED_EVERY_S", "60"))
    threading.Thread(target=_sampler, args=(os.environ["TRACED_OUT"], every), daemon=True, name="traced").start()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
