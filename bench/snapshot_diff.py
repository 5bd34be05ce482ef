"""What a fault leaves in a process's Python heap: compare the tracemalloc snapshots that ``bench.litellm_rss
--snapshot-dir`` has the proxy dump before each fault (``before-NN.snap``) and some seconds after it
(``after-NN.snap``).

    python -m bench.snapshot_diff /tmp/snaps [--top 15] [--frames 6] [--from 1]

Prints the traced total at each snapshot, then the sites (the innermost ``--frames`` frames of each allocation's
traceback) that grew most from ``before-FROM`` to the last ``before``: what stays after the faults. A high-water
mark is reached at the first faults and is flat after; a leak grows by about the same at every fault. Then the same
for the last fault alone, before to after: what one fault allocates while it is fresh.
"""

from __future__ import annotations

import argparse
import tracemalloc
from pathlib import Path

IGNORED = (tracemalloc.__file__, "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def load(path: Path) -> tracemalloc.Snapshot:
    return tracemalloc.Snapshot.load(str(path)).filter_traces([tracemalloc.Filter(False, name) for name in IGNORED])


def top(old: tracemalloc.Snapshot, new: tracemalloc.Snapshot, frames: int, n: int, root: str) -> list[str]:
    """The ``n`` tracebacks that grew most from ``old`` to ``new``, innermost frame first."""
    diffs = new.compare_to(old, "traceback")
    diffs.sort(key=lambda d: -d.size_diff)
    out = [f"total {sum(d.size_diff for d in diffs) / 2**20:+.3f} MiB, {sum(d.count_diff for d in diffs):+d} blocks"]
    for d in diffs[:n]:
        out.append(f"{d.size_diff / 1024:+9.1f} KiB {d.count_diff:+7d} blocks")
        for frame in list(reversed(d.traceback))[:frames]:
            out.append(f"      {frame.filename.replace(root, '')}:{frame.lineno}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("where", type=Path)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--frames", type=int, default=6, help="frames of each traceback printed, innermost first")
    p.add_argument("--from", dest="start", type=int, default=1, help="the before-NN snapshot to compare from")
    p.add_argument("--root", default="", help="a path prefix to drop from file names")
    args = p.parse_args(argv)
    befores = sorted(args.where.glob("before-*.snap"))
    afters = sorted(args.where.glob("after-*.snap"))
    print("traced MiB before each fault (after it):")
    for b in befores:
        a = args.where / b.name.replace("before-", "after-")
        traced = sum(t.size for t in load(b).traces) / 2**20
        line = f"  {b.stem}: {traced:.3f}"
        if a.exists():
            line += f" ({sum(t.size for t in load(a).traces) / 2**20:.3f})"
        print(line, flush=True)
    first = args.where / f"before-{args.start:02d}.snap"
    print(f"\ngrew from {first.stem} to {befores[-1].stem}:")
    print("\n".join(top(load(first), load(befores[-1]), args.frames, args.top, args.root)))
    if afters:
        last = afters[-1]
        before = args.where / last.name.replace("after-", "before-")
        print(f"\ngrew from {before.stem} to {last.stem} (the last fault, while fresh):")
        print("\n".join(top(load(before), load(last), args.frames, args.top, args.root)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
