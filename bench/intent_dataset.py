"""Build the intent data sets from public sources: a training set shipped with the package
(``cognitora/intent/data/examples.jsonl``, what the learned classifier is fitted on) and an evaluation set
(``bench/intent_eval/eval.jsonl``, held out: drawn from the sources' test splits only).

    python bench/intent_dataset.py --clinc PATH/oos-eval --gsm8k PATH/grade-school-math --humaneval PATH/human-eval

Each PATH is a checkout of the source's public repository (provenance, commits and licenses:
bench/intent_eval/PROVENANCE.md). Sampling is seeded, so the same checkouts give the same files.

Intents: ``code`` (HumanEval prompts), ``math`` (GSM8K word problems), ``small_talk``, ``travel`` and ``finance``
(CLINC150's small_talk, travel, and banking + credit_cards domains).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN_OUT = ROOT / "cognitora" / "intent" / "data" / "examples.jsonl"
EVAL_OUT = ROOT / "bench" / "intent_eval" / "eval.jsonl"
CLINC_DOMAINS = {"small_talk": ("small_talk",), "travel": ("travel",), "finance": ("banking", "credit_cards")}
TRAIN_PER_INTENT = 150
EVAL_PER_INTENT = 100
HUMANEVAL_TRAIN = 64
"""HumanEval has no training split: its first 64 tasks train, 100 of the other 100 evaluate."""


def _clinc(path: Path) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    data = json.loads((path / "data" / "data_full.json").read_text())
    domains = json.loads((path / "data" / "domains.json").read_text())
    label_of = {name: intent for intent, ds in CLINC_DOMAINS.items() for d in ds for name in domains[d]}
    train: dict[str, list[str]] = {i: [] for i in CLINC_DOMAINS}
    test: dict[str, list[str]] = {i: [] for i in CLINC_DOMAINS}
    for split, out in (("train", train), ("test", test)):
        for text, name in data[split]:
            if name in label_of:
                out[label_of[name]].append(text)
    return train, test


def _gsm8k(path: Path) -> tuple[list[str], list[str]]:
    base = path / "grade_school_math" / "data"
    read = lambda name: [json.loads(line)["question"] for line in (base / name).read_text().splitlines() if line]  # noqa: E731
    return read("train.jsonl"), read("test.jsonl")


def _humaneval(path: Path) -> tuple[list[str], list[str]]:
    with gzip.open(path / "data" / "HumanEval.jsonl.gz", "rt") as f:
        prompts = [json.loads(line)["prompt"].strip() for line in f if line.strip()]
    return prompts[:HUMANEVAL_TRAIN], prompts[HUMANEVAL_TRAIN:]


def build(clinc: Path, gsm8k: Path, humaneval: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    rng = random.Random(16)
    clinc_train, clinc_test = _clinc(clinc)
    math_train, math_test = _gsm8k(gsm8k)
    code_train, code_test = _humaneval(humaneval)
    by_intent_train = {"code": code_train, "math": math_train, **clinc_train}
    by_intent_test = {"code": code_test, "math": math_test, **clinc_test}
    train = [
        {"text": t, "intent": i}
        for i, texts in by_intent_train.items()
        for t in rng.sample(texts, min(TRAIN_PER_INTENT, len(texts)))
    ]
    test = [
        {"text": t, "intent": i}
        for i, texts in by_intent_test.items()
        for t in rng.sample(texts, min(EVAL_PER_INTENT, len(texts)))
    ]
    return train, test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clinc", type=Path, required=True, help="checkout of clinc/oos-eval")
    parser.add_argument("--gsm8k", type=Path, required=True, help="checkout of openai/grade-school-math")
    parser.add_argument("--humaneval", type=Path, required=True, help="checkout of openai/human-eval")
    args = parser.parse_args()
    train, test = build(args.clinc, args.gsm8k, args.humaneval)
    for path, rows in ((TRAIN_OUT, train), (EVAL_OUT, test)):
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"{path.relative_to(ROOT)}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
