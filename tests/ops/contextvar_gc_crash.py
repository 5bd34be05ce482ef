"""The CPython crash ``cognitora.ops.gc_pacing`` exists for, as a program: ``python -m tests.ops.contextvar_gc_crash
plain`` segfaults (python/cpython#148891: a collection started inside ``ContextVar.set`` runs a finalizer that sets a
variable of the same context); ``... paced`` runs the same churn with a ``GcPacer`` and prints ``survived``."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import weakref

from cognitora.ops.gc_pacing import GcPacer

VAR: contextvars.ContextVar[int] = contextvars.ContextVar("contextvar_gc_crash", default=0)


class SettingCycle:
    """Garbage only the cycle collector frees, whose finalizer sets a context variable (as LiteLLM's abandoned
    coroutines reset theirs)."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        VAR.set(VAR.get() + 1)


async def churn(paced: bool, rounds: int = 400) -> None:
    pacer = GcPacer(0.01)
    if paced and not pacer.start(asyncio.get_running_loop()):
        raise SystemExit("the pacer did not start")
    refs = []
    for _ in range(rounds):
        for i in range(2_000):
            refs.append(weakref.ref(SettingCycle()))
            VAR.set(i)
        await asyncio.sleep(0)
    pacer.stop()


if __name__ == "__main__":
    asyncio.run(churn(sys.argv[1:] == ["paced"]))
    print("survived")
