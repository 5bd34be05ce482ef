"""Routing by difficulty: is this request hard enough for the large model?

Between the rules and the intent (``cognitora.intent.rewrite``): a request judged hard goes to the policy's
``difficulty.hard_target``; an easy one goes on to the intent classifier and its targets. Small model for easy
requests, large for hard ones, as RouteLLM and the semantic routers do, from signals a gateway can read in well
under a millisecond:

- the text: a calibrated logistic regression over character n-grams (what the request asks: "prove", "find all",
  "design ... that scales", in any language) and the prompt's shape (length, lines, digits, mathematical symbols
  and LaTeX, code fences, enumerated requirements, questions), fitted on easy and hard examples (Cognitora ships
  some: ``cognitora/intent/data/difficulty.jsonl``; an operator adds their own);
- tool definitions (``tools_are_hard``): an agent's turn;
- the intent classifier's own uncertainty (``unsure_below``): a request it cannot place is not a routine one.

Measured against the obvious baseline, prompt length, in bench/results/intent_difficulty.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cognitora.intent.classifier import LinearModel, sklearn_or_explain, two_labels_at_least
from cognitora.intent.policy import DifficultySpec

__all__ = ["Difficulty", "DifficultyModel", "build"]

EASY, HARD = "easy", "hard"

_MATH = re.compile(r"[=<>≤≥≠±∑∫√∞^∈∀∃πθλ]|\\[a-z]+|\$")
_LATEX = re.compile(r"\\(?:frac|sum|int|sqrt|cdot|leq|geq|mathbb|binom|lim|prod)|\$[^$]+\$")
_LIST_ITEM = re.compile(r"(?m)^\s*(?:[-*•]|\d+[.)])\s+")
_DIGIT = re.compile(r"\d")

SHAPE = ("log_chars", "log_prompt_chars", "log_lines", "digits", "math", "latex", "code_fence", "items", "questions")
"""The prompt's shape, as numbers (``shape``); standardised over the examples before fitting."""


def shape(text: str, prompt_chars: int) -> list[float]:
    """The shape of the last user turn ``text`` in a prompt of ``prompt_chars`` characters."""
    n = max(len(text), 1)
    return [
        math.log1p(len(text)),
        math.log1p(prompt_chars),
        math.log1p(text.count("\n")),
        len(_DIGIT.findall(text)) / n * 10,
        math.log1p(len(_MATH.findall(text))),
        math.log1p(len(_LATEX.findall(text))),
        1.0 if "```" in text else 0.0,
        math.log1p(len(_LIST_ITEM.findall(text))),
        math.log1p(text.count("?") + text.count("\uff1f")),
    ]


@dataclass(frozen=True)
class Difficulty:
    score: float
    """The calibrated probability that the request is hard (the text's), or 1.0 when a signal made it hard."""
    hard: bool
    why: str
    """For the explanation: the score against the threshold, or the signal that decided."""


class DifficultyModel:
    """Fitted at start-up on easy and hard examples; ``judge`` decides for one request."""

    def __init__(self, spec: DifficultySpec, examples: Sequence[tuple[str, str]], max_chars: int = 2000) -> None:
        import numpy as np
        from scipy.sparse import csr_matrix, hstack

        from cognitora.intent.ngrams import CharVocabulary

        sklearn_or_explain()
        two_labels_at_least([d for _, d in examples], "difficulties (easy and hard)")
        self.spec = spec
        self.max_chars = max_chars
        self._np = np
        texts = [t[-max_chars:] for t, _ in examples]
        self._chars = CharVocabulary.fit(texts)
        raw = np.array([shape(t, len(full)) for t, (full, _) in zip(texts, examples, strict=True)])
        self._mean = raw.mean(axis=0)
        self._std = np.where(raw.std(axis=0) > 0, raw.std(axis=0), 1.0)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for i, text in enumerate(texts):
            c, v = self._chars.vector(text)
            rows += [i] * len(c)
            cols += c.tolist()
            vals += v.tolist()
        chars = csr_matrix((vals, (rows, cols)), shape=(len(texts), len(self._chars)))
        x = hstack([chars, csr_matrix((raw - self._mean) / self._std)]).tocsr()
        self.linear = LinearModel(x, [d for _, d in examples], c=1.0, calibrate=True)
        self._hard = self.linear.labels.index(HARD)

    def score(self, text: str, prompt_chars: int | None = None) -> float:
        """The calibrated probability that ``text`` (the last user turn) is hard."""
        np = self._np
        text = text[-self.max_chars :]
        columns, values = self._chars.vector(text)
        total = len(text) if prompt_chars is None else prompt_chars
        structure = (np.array(shape(text, total)) - self._mean) / self._std
        coef = self.linear.coef_t
        logits = self.linear.intercept + structure @ coef[len(self._chars) :]
        if len(columns):
            logits = logits + values @ coef[columns]
        return float(self.linear.probabilities(logits)[self._hard])

    def judge(self, text: str, prompt_chars: int, has_tools: bool, intent_score: float | None) -> Difficulty:
        spec = self.spec
        if spec.tools_are_hard and has_tools:
            return Difficulty(1.0, True, "tools present")
        if spec.unsure_below > 0 and intent_score is not None and intent_score < spec.unsure_below:
            return Difficulty(1.0, True, f"intent classifier unsure ({intent_score:.2f} < {spec.unsure_below:g})")
        p = self.score(text, prompt_chars)
        hard = p >= spec.threshold
        return Difficulty(p, hard, f"difficulty {p:.2f} {'>=' if hard else '<'} {spec.threshold:g}")


def labeled_examples(spec: DifficultySpec) -> list[tuple[str, str]]:
    """The spec's examples: its file's, then its inline ``easy`` and ``hard``."""
    from cognitora.intent.classifier import read_examples

    out: list[tuple[str, str]] = []
    if spec.examples_file is not None:
        out += read_examples(spec.examples_file, {EASY, HARD}, label="difficulty")
    out += [(t, EASY) for t in spec.easy] + [(t, HARD) for t in spec.hard]
    return out


def build(spec: DifficultySpec | None, max_chars: int) -> DifficultyModel | None:
    return None if spec is None else DifficultyModel(spec, labeled_examples(spec), max_chars)
