"""docs/benchmarks.md stays readable and true to bench/results/: short, every result it names exists, and
bench/results/ holds only what some doc names (older runs live in git, at the commit the doc's History gives)."""

from __future__ import annotations

import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 300

# A result named in prose or a link: `bench/results/NAME`, possibly with a glob or a {a,b} group. Not one read from
# history (`git show <commit>:bench/results/...`), not where a command writes (`--out bench/results/...`, `--sim-out
# bench/results/...`: a prefix) and not a template a reader fills in (`node-agent-<gpu>.prom`).
_CITED = re.compile(r"(?<!:)(?<!--out )(?<!--sim-out )bench/results/([\w.*{},/-]+)(?![\w.*{},/<-])")
_EXTENSIONS = (".requests.jsonl.gz", ".json", ".md", ".png")
_SEED_FILE = re.compile(r"^(?P<run>.+)_seed\d+\.(json|md|png|requests\.jsonl\.gz)$")
_MERGED = re.compile(r"--merge (?:\S*/)?(?P<run>[\w.-]+)")


def _stem(name: str) -> str:
    """``X.md``, ``X.json``, ``X.png`` and ``X.requests.jsonl.gz`` are one result, ``X``."""
    return next((name.removesuffix(ext) for ext in _EXTENSIONS if name.endswith(ext)), name)


def _docs() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "bench" / "README.md"]


def _expand(pattern: str) -> list[str]:
    """``{a,b}`` groups expanded (glob does not), then each pattern globbed inside bench/results."""
    pattern = pattern.rstrip(".,")
    group = re.search(r"\{([^{}]*)\}", pattern)
    if group is not None:
        return [
            name
            for alt in group.group(1).split(",")
            for name in _expand(pattern[: group.start()] + alt + pattern[group.end() :])
        ]
    return sorted(Path(p).name for p in glob.glob(str(RESULTS / pattern)))


def _cited() -> dict[str, list[str]]:
    """Every result pattern each doc names, with the files it matches (none: a broken reference)."""
    out: dict[str, list[str]] = {}
    for doc in _docs():
        for m in _CITED.finditer(doc.read_text()):
            out[f"{doc.relative_to(ROOT)}: bench/results/{m.group(1)}"] = _expand(m.group(1))
    return out


def test_benchmarks_md_stays_short() -> None:
    lines = BENCHMARKS.read_text().count("\n")
    assert lines < MAX_LINES, f"docs/benchmarks.md has {lines} lines: keep it under {MAX_LINES}, history is in git"


def test_benchmarks_md_opens_with_the_comparison_table() -> None:
    """The first section a reader meets is the one table, a row per workload and gateway, each naming its file."""
    text = BENCHMARKS.read_text()
    first = text.split("\n## ", 2)[1]
    assert first.startswith("The current comparison")
    table = first[first.index("\n| ") :].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 10
    named = [row for row in rows if "bench/results/" in row]
    assert named and all(row.startswith("| |") for row in rows if row not in named)


def test_every_result_a_doc_names_exists() -> None:
    cited = _cited()
    assert any(key.startswith("docs/benchmarks.md") for key in cited)
    broken = sorted(key for key, files in cited.items() if not files)
    assert not broken, f"docs name results that bench/results/ does not hold (cite `git show <commit>:...`): {broken}"


def test_bench_results_holds_only_what_a_doc_names() -> None:
    """One current result per workload: a file no doc names, nor a named result's ``--merge`` reads, is a superseded
    run to delete (git keeps it)."""
    named = {_stem(name) for files in _cited().values() for name in files}
    # A named aggregate (PREFIX.md) names its seeds' files, and the seeds' JSON of every run it merges.
    runs = {name for name in named if not _SEED_FILE.match(name + ".md")}
    runs |= {m.group("run") for name in named if (m := _SEED_FILE.match(name + ".md"))}
    merged = {
        m.group("run")
        for run in runs
        if (RESULTS / f"{run}.md").exists()
        for m in _MERGED.finditer((RESULTS / f"{run}.md").read_text())
    }
    unnamed = []
    for path in sorted(RESULTS.iterdir()):
        seed = _SEED_FILE.match(path.name)
        if _stem(path.name) in named or (seed and seed.group("run") in runs):
            continue
        if seed and seed.group("run") in merged and path.suffix == ".json":
            continue
        unnamed.append(path.name)
    assert not unnamed, f"results no doc names (delete them, or name them in the doc they support): {unnamed}"
