"""What keying one long chat prompt holds the GIL for, and what that costs an event loop beside the keying thread.

    python -m bench.keying_gil [--prompts 12] [--rounds 3] [--tokens 22000] [--before REV] \\
        [--out bench/results/keying_gil.md]

The prompt is the flow bench's noisy team A's (``bench.flow_bench``): one user message of ``--tokens`` words of
``bench.workloads``' one-token vocabulary, unique each, keyed for the shipped SmolLM2 tokenizer and chat template
(``HuggingFaceTB/SmolLM2-135M-Instruct``) in 16-token blocks, on a fresh keyer (nothing cached, as for A).

1. **Stages**, each timed alone in this thread by ``time.thread_time`` (CPU, not wall): the chat's rendering, its
   split on special tokens with the piece cache's lookups (``uncached_chars``), the tokenizer (Rust: the GIL is
   released, ``allow_threads``), the token-ids list, dropping the tokenizer's ``Encoding``, the block keys, and
   ``PromptKeyer.keys`` whole. Every stage but the tokenizer holds the GIL throughout, so the GIL held per prompt is
   the whole's CPU less the tokenizer's; what follows the tokenizer (ids, drop, the cache's bookkeeping, keys) is
   one stretch the GIL is never released in.
2. **The loop**: an asyncio loop doing 5 ms sleeps records each sleep's overshoot while a keying thread (one, as
   ``cognitora.core.keying``'s) keys the prompts back to back; the same loop with no keying runs in the same round.
   Figures per arm: overshoot p50/p99/max, and the seconds per second spent in sleeps that overshot by > 3 ms (the
   overshoot beyond 5 ms summed over them, over the arm's wall time), as docs/flow_control.md measured it.

``--before REV`` (default: the commit this work started from) loads ``kvstate/{keys,key_memo,prompt}.py`` as they
were at ``REV`` from git beside today's, so before and after run in one process, on the same prompts, in rounds
that interleave the arms; the keys of both are compared (they must be equal). Wall figures depend on the machine's
load and are only compared within a round; CPU figures are the thread's own.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workloads import TextBank  # noqa: E402
from cognitora.core.keying import let_the_loop_in  # noqa: E402
from cognitora.shipped_tokenizers import SMOLLM2_ID, shipped_tokenizer  # noqa: E402
from kvstate import prompt as after_prompt  # noqa: E402

BEFORE_REV = "c6e3b33"
"""main when this work began: ``encode_batch`` (character offsets), keys converted block by block."""
INLINE_CHARS = 8192
"""``limits.inline_tokenize_max_chars``' default."""
SLEEP_S = 0.005
OVER_S = 0.003
BLOCK = 16
SPECIAL = re.compile(r"<\|im_start\|>|<\|im_end\|>")


def load_before(rev: str) -> types.ModuleType:
    """``kvstate.prompt`` as it was at ``rev``, with its ``kvstate.keys`` and ``kvstate.key_memo``, as private modules
    beside today's (``kvstate.chat_template`` is shared: unchanged)."""
    module = None
    for name in ("keys", "key_memo", "prompt"):
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:kvstate/{name}.py"], check=True, capture_output=True, text=True
        ).stdout
        for dep in ("keys", "key_memo"):
            source = source.replace(f"from kvstate.{dep} import", f"from _before_kvstate_{dep} import")
        module = types.ModuleType(f"_before_kvstate_{name}")
        sys.modules[module.__name__] = module  # dataclasses look their module up
        exec(compile(source, f"{rev}:kvstate/{name}.py", "exec"), module.__dict__)
    assert module is not None
    return module


def _sleep_zero() -> None:
    time.sleep(0)  # releases the GIL and asks for it back at once


def texts(n: int, tokens: int, seed: int = 20251130) -> list[str]:
    bank = TextBank(seed)
    return [" ".join(bank.words(f"{seed}:A{i}", tokens)) for i in range(n)]


class TimedTokenizer:
    """A ``tokenizers.Tokenizer`` whose batch encodings (the calls that release the GIL) note their thread CPU and
    when they started and returned, so a keying's GIL-held CPU is read off the same call, not subtracted across runs."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.free_s = 0.0
        self.first_start = self.last_end = 0.0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)  # AttributeError where the inner lacks it (encode_batch_fast < 0.20)
        if name not in ("encode_batch", "encode_batch_fast"):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            out = attr(*args, **kwargs)
            end = time.thread_time()
            self.free_s += end - start
            self.first_start = self.first_start or start
            self.last_end = end
            return out

        return timed


class Arm:
    """One implementation of the keying path: a fresh keyer per run, so every prompt is new to its caches.
    ``deferred``: the keying thread gets the chat as the loop rendered it (``PromptKeyer.keys_inline``'s
    ``Deferred``, made before the run as the loop makes it); ``pause``: what it passes ``PromptKeyer.keys`` to call
    between slices of the hashing."""

    def __init__(
        self,
        name: str,
        module: types.ModuleType,
        *,
        deferred: bool = False,
        pause: Callable[[], None] | None = None,
        switch_s: float | None = None,
    ) -> None:
        self.name = name
        self.module = module
        self.deferred = deferred
        self.pause = pause
        self.switch_s = switch_s
        """``sys.setswitchinterval`` while this arm runs; None: Python's default."""

    def keyer(self) -> Any:
        m = self.module
        keyer = m.PromptKeyer("bench", BLOCK, m.ChatTokenizer(shipped_tokenizer(SMOLLM2_ID)))
        keyer.tokenizer.tokenizer = TimedTokenizer(keyer.tokenizer.tokenizer)
        return keyer

    def prompt(self, text: str) -> Any:
        return self.module.read_prompt(messages=[{"role": "user", "content": text}])

    def inputs(self, keyer: Any, corpus: list[str]) -> list[Any]:
        """What the keying thread is handed for each text."""
        prompts = [self.prompt(t) for t in corpus]
        if not self.deferred:
            return prompts
        deferred = [keyer.keys_inline(p, None, INLINE_CHARS) for p in prompts]
        assert all(isinstance(d, after_prompt.Deferred) for d in deferred)
        return deferred


def key_one(arm: Arm, keyer: Any, prompt: Any) -> tuple[list[int], dict[str, float]]:
    """``keyer.keys(prompt)`` as the keying thread calls it, and its CPU, ms: whole, in the tokenizer (GIL released),
    GIL held, and the longest stretch holding it: before the tokenizer's call, from its return to the first pause,
    between pauses, or from the last one to the end."""
    timer: TimedTokenizer = keyer.tokenizer.tokenizer
    timer.free_s = timer.first_start = timer.last_end = 0.0
    marks: list[float] = []
    pause = arm.pause
    start = time.thread_time()
    if pause is None:
        keys = keyer.keys(prompt).keys
    else:

        def marked() -> None:
            marks.append(time.thread_time())
            pause()
            marks.append(time.thread_time())

        keys = keyer.keys(prompt, None, marked).keys
    end = time.thread_time()
    edges = [start, timer.first_start, timer.last_end, *marks, end] if timer.last_end else [start, *marks, end]
    stretch = max(edges[i + 1] - edges[i] for i in range(0, len(edges) - 1, 2))  # held, released, held, ...
    whole = end - start
    cpu = {"whole": whole, "free": timer.free_s, "held": whole - timer.free_s, "stretch": stretch}
    return keys, {k: 1000 * v for k, v in cpu.items()}


def stages(arm: Arm, corpus: list[str]) -> dict[str, float]:
    """Mean CPU ms per prompt of each stage alone, one after another on a fresh keyer."""
    rows: dict[str, list[float]] = {}

    def timed(row: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.thread_time()
        out = fn(*args)
        rows.setdefault(row, []).append(1000 * (time.thread_time() - start))
        return out

    keyer = arm.keyer()
    tok = keyer.tokenizer
    inner = tok.tokenizer._inner
    # What each arm's ChatTokenizer calls for a long piece.
    encode = inner.encode_batch if arm.module is not after_prompt else inner.encode_batch_fast
    for text in corpus:
        prompt = arm.prompt(text)
        rendered = timed("render the chat", tok.render_chat, prompt)
        timed("split on special tokens + cache lookups", tok.uncached_chars, rendered)
        piece = max(SPECIAL.split(rendered), key=len)  # the user message's piece: all but ~100 characters
        encodings = timed("tokenize (GIL released)", functools.partial(encode, add_special_tokens=False), [piece])
        ids = timed("token-ids list", getattr, encodings[0], "ids")
        timed("drop the Encoding", encodings.clear)
        memo = type(keyer.key_memo)(keyer.key_memo.max_bytes)
        timed("block keys (a new prefix)", memo.chain, keyer.root(None), ids, BLOCK)
    return {row: statistics.mean(ms) for row, ms in rows.items()}


def _run_delay_reader() -> Callable[[], float]:
    """This thread's time waiting for a CPU so far, in seconds (``/proc/thread-self/schedstat``): a sleep's overshoot
    less what it adds while the thread waits is what the thread waited for other than a CPU: the GIL."""
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)  # resolved now: this thread's
    return lambda: int(os.pread(fd, 128, 0).split()[1]) / 1e9


async def _probe(stop: asyncio.Event) -> list[tuple[float, float]]:
    """The loop's 5 ms sleeps until ``stop``: each one's (overshoot, overshoot not spent waiting for a CPU), s."""
    queued = _run_delay_reader()
    out: list[tuple[float, float]] = []
    while not stop.is_set():
        start, waited = time.perf_counter(), queued()
        await asyncio.sleep(SLEEP_S)
        over = time.perf_counter() - start - SLEEP_S
        out.append((over, max(0.0, over - (queued() - waited))))
    return out


def _key_all(arm: Arm, keyer: Any, prompts: list[Any]) -> list[tuple[list[int], dict[str, float]]]:
    return [key_one(arm, keyer, p) for p in prompts]


def loop_run(arm: Arm | None, corpus: list[str], idle_s: float) -> dict[str, Any]:
    """The loop's sleeps while ``arm``'s keying thread keys ``corpus`` back to back (``None``: no keying, for
    ``idle_s``)."""
    keyer = arm.keyer() if arm is not None else None
    prompts = arm.inputs(keyer, corpus) if arm is not None else []
    switch_s = arm.switch_s if arm is not None else None
    default_switch = sys.getswitchinterval()

    async def main() -> tuple[list[tuple[float, float]], float, list[tuple[list[int], dict[str, float]]]]:
        stop = asyncio.Event()
        probe = asyncio.create_task(_probe(stop))
        started = time.perf_counter()
        keyed: list[tuple[list[int], dict[str, float]]] = []
        if arm is None:
            await asyncio.sleep(idle_s)
        else:
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bench-keys") as pool:
                keyed = await asyncio.get_running_loop().run_in_executor(pool, _key_all, arm, keyer, prompts)
        wall = time.perf_counter() - started
        stop.set()
        return await probe, wall, keyed

    if switch_s is not None:
        sys.setswitchinterval(switch_s)
    try:
        sleeps, wall, keyed = asyncio.run(main())
    finally:
        sys.setswitchinterval(default_switch)
    return {
        "over": [o for o, _ in sleeps],
        "gil": [g for _, g in sleeps],
        "wall_s": wall,
        "keys": [k for k, _ in keyed],
        "cpu": [c for _, c in keyed],
    }


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report(
    args: argparse.Namespace, rev: str, stage_rows: dict[str, dict[str, float]], runs: dict[str, list[dict]]
) -> str:
    names = list(stage_rows)
    lines = [
        "# Keying a long chat prompt: the GIL it holds, and the event loop beside the keying thread",
        "",
        f"Command: `python -m bench.keying_gil --prompts {args.prompts} --rounds {args.rounds} --tokens {args.tokens}"
        f" --before {rev}`  ",
        f"Python {platform.python_version()}, tokenizers {args.tokenizers_version}, {os.cpu_count()} CPUs; load average"
        f" (1 min) at start / end {args.load[0]:.1f} / {os.getloadavg()[0]:.1f}. One user message of {args.tokens:,}"
        f" one-token words ({args.token_count:,} tokens once rendered), unique, SmolLM2's tokenizer and template, "
        f"{BLOCK}-token blocks: the flow bench's team A prompt. `before` is `kvstate/{{keys,key_memo,prompt}}.py` at "
        f"{rev}, loaded beside today's in the same process; the keys of both were compared on every prompt: "
        f"{args.keys_checked}.",
        "",
        "## 1. CPU per prompt by stage (`time.thread_time`, ms, mean over the prompts)",
        "",
        "Each stage timed alone, one after another, on a fresh keyer. Every stage but the tokenizer holds the GIL "
        "throughout; in `PromptKeyer.keys`, what follows the tokenizer (the ids, the drop, the piece cache's "
        "bookkeeping, the keys) is one stretch that never releases it unless the keying thread's pauses slice the "
        "hashing (section 2).",
        "",
        "| stage | " + " | ".join(names) + " | after / before |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for row in stage_rows[names[0]]:
        values = [stage_rows[n][row] for n in names]
        ratio = f"{values[-1] / values[0]:.2f}" if values[0] else "-"
        lines.append(f"| {row} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {ratio} |")
    lines += [
        "",
        f"## 2. An asyncio loop's 5 ms sleeps while one thread keys {args.prompts} such prompts back to back",
        "",
        "Arms, each adding to the one above: `before`; today's `kvstate` keying the prompt as before (the "
        "keying thread renders the chat again); the keying thread handed the chat as the loop rendered it "
        "(`PromptKeyer.keys_inline`'s `Deferred`); and pausing 100 us every 256 blocks it hashes "
        "(`cognitora.core.keying.let_the_loop_in`), as `Keying` runs it. Two alternatives to the last step: pauses "
        "of `time.sleep(0)`, and no pauses but `sys.setswitchinterval(0.001)` (process-wide).",
        "",
        f"{args.rounds} rounds; each runs every arm once on the same prompts (the keyed arms in turn, in reverse "
        "order every other round, then the loop alone for as long as they took on average). **Overshoot**: each "
        "sleep's time beyond 5 ms, ms, over all rounds' sleeps (wall); `late s/s`: the overshoot of the sleeps late "
        "by > 3 ms, summed, per second of the arm (median of the rounds). **GIL wait**: the overshoot less the time "
        "the loop's thread spent waiting for a CPU meanwhile (its `run_delay` in `/proc/thread-self/schedstat`), so "
        "what it waited for otherwise, the GIL, less the loop alone's median in the same round (its floor: epoll's "
        "1 ms rounding, timer slack), over all rounds' sleeps; `per prompt`: their sum over the prompts keyed, "
        "the median of the rounds (and over all rounds: one stall while the keying thread is descheduled holding "
        "the GIL weighs there). "
        "**Keying CPU**: the "
        "keying thread's own, per prompt, median: whole, GIL held (whole less the tokenizer's call), and the "
        "longest stretch it held the GIL without a release. The machine was shared (2 cores, other sessions' "
        "benchmarks beside it at nice 0 while this ran at nice 19): the wall figures and the waits carry its "
        "CPU contention (the keying thread, descheduled while it holds the GIL, holds up the loop); compare arms "
        "within this run only.",
        "",
        "| arm | sleeps | overshoot p50 / p99 / max | late s/s | GIL wait p99 / max | GIL waits > 1 / > 3 ms "
        "| GIL wait ms per prompt | keying CPU ms: whole / GIL held / longest stretch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    alone = runs["loop alone"]
    bases = [statistics.median(r["gil"]) for r in alone]  # the loop's own floor: epoll's 1 ms rounding, timer slack
    for name, rs in runs.items():
        over = [o for r in rs for o in r["over"]]
        gil = [max(0.0, g - base) for r, base in zip(rs, bases, strict=True) for g in r["gil"]]
        late = statistics.median(sum(o for o in r["over"] if o > OVER_S) / r["wall_s"] for r in rs)
        cpu = [c for r in rs for c in r["cpu"]]
        prompts = sum(len(r["cpu"]) for r in rs)
        if cpu:
            per_round = [
                1000 * sum(max(0.0, g - base) for g in r["gil"]) / len(r["cpu"])
                for r, base in zip(rs, bases, strict=True)
            ]
            per_prompt = f"{statistics.median(per_round):.2f} ({1000 * sum(gil) / prompts:.2f})"
            keying = " / ".join(f"{statistics.median(c[k] for c in cpu):.2f}" for k in ("whole", "held", "stretch"))
        else:
            per_prompt = f"({1000 * sum(gil) / sum(r['wall_s'] for r in rs):.2f} per s)"
            keying = "-"
        waits = f"{sum(g > 0.001 for g in gil)} / {sum(g > OVER_S for g in gil)}"
        lines.append(
            f"| {name} | {len(over)} | {1000 * _pct(over, 0.5):.2f} / {1000 * _pct(over, 0.99):.2f} / "
            f"{1000 * max(over):.1f} | {late:.3f} | {1000 * _pct(gil, 0.99):.2f} / {1000 * max(gil):.2f} | {waits} | "
            f"{per_prompt} | {keying} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.keying_gil", description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=22_000)
    p.add_argument("--before", default=BEFORE_REV, help="the git revision to compare against")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "keying_gil.md")
    args = p.parse_args(argv)
    args.load = os.getloadavg()
    import tokenizers

    args.tokenizers_version = tokenizers.__version__
    before = Arm("before", load_before(args.before))
    after = Arm("after", after_prompt)
    corpus = texts(args.prompts, args.tokens)
    args.token_count = after.keyer().keys(after.prompt(corpus[0])).prompt_tokens
    stage_rows = {arm.name: stages(arm, corpus) for arm in (before, after)}
    arms = [
        before,
        Arm("+ `encode_batch_fast`, keys chained as digests", after_prompt),
        Arm("+ the loop's rendering reused", after_prompt, deferred=True),
        Arm("**+ pauses: as shipped**", after_prompt, deferred=True, pause=let_the_loop_in),
        Arm("shipped, with pauses of `sleep(0)`", after_prompt, deferred=True, pause=_sleep_zero),
        Arm("rendering reused, no pauses, switch interval 1 ms", after_prompt, deferred=True, switch_s=0.001),
    ]
    runs: dict[str, list[dict]] = {arm.name: [] for arm in arms} | {"loop alone": []}
    checked = 0
    for r in range(args.rounds):
        walls = []
        for arm in arms if r % 2 == 0 else arms[::-1]:
            result = loop_run(arm, corpus, 0.0)
            runs[arm.name].append(result)
            walls.append(result["wall_s"])
        runs["loop alone"].append(loop_run(None, corpus, statistics.mean(walls)))
        reference = runs[before.name][-1]["keys"]
        for arm in arms:
            if runs[arm.name][-1]["keys"] != reference:
                raise SystemExit(f"the keys differ between {before.name!r} and {arm.name!r}")
            checked += sum(len(k) for k in reference)
        print(f"round {r + 1}: " + ", ".join(f"{n} {1000 * sum(runs[n][-1]['gil']):.1f} ms" for n in runs), flush=True)
    args.keys_checked = f"equal ({checked:,} keys over {args.rounds} rounds and {len(arms)} arms)"
    for rs in runs.values():
        for result in rs:
            del result["keys"]
    text = report(args, args.before, stage_rows, runs)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
