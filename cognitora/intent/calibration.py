"""Calibrated probabilities, so that ``min_score: 0.7`` means "right about 70% of the time or more".

A logistic regression fitted on a few examples per intent is not calibrated: its probabilities say more about the
regularisation strength and the number of intents than about how often it is right (measured in
bench/results/intent_eval_operator.md). One number fixes most of that: a temperature ``T`` dividing the logits
(Guo et al. 2017, "On Calibration of Modern Neural Networks"), chosen to minimise the log-loss of predictions the
model made on examples it was not fitted on (k-fold over the operator's examples). It never changes which intent
wins, only how sure the score says it is.

``expected_calibration_error`` and ``reliability`` measure it (the benchmark reports both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["expected_calibration_error", "fit_temperature", "held_out_logits", "reliability", "softmax"]

MIN_PER_INTENT = 2
"""Cross-validation needs at least this many examples of every intent; fewer: no temperature (T = 1)."""


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    probabilities: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return probabilities


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The ``T`` in [0.05, 20] minimising the log-loss of ``softmax(logits / T)`` for ``labels`` (column indices)."""
    from scipy.optimize import minimize_scalar

    rows = np.arange(len(labels))

    def loss(log_t: float) -> float:
        p = softmax(logits / np.exp(log_t))
        return float(-np.log(np.clip(p[rows, labels], 1e-12, None)).mean())

    found = minimize_scalar(loss, bounds=(np.log(0.05), np.log(20.0)), method="bounded")
    return float(np.exp(found.x))


def held_out_logits(
    fit_logits: Callable[[np.ndarray, np.ndarray], Any], labels: np.ndarray, folds: int = 5, seed: int = 0
) -> np.ndarray | None:
    """Logits for every example from a model fitted without it (stratified k-fold). ``fit_logits(train, test)``
    fits on the example indices ``train`` and returns the logits of ``test``. None when an intent has fewer than
    ``MIN_PER_INTENT`` examples (nothing to hold out)."""
    from sklearn.model_selection import StratifiedKFold

    counts = np.bincount(labels)
    smallest = int(counts[counts > 0].min()) if len(counts) else 0
    if smallest < MIN_PER_INTENT:
        return None
    k = min(folds, smallest)
    out: np.ndarray | None = None
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    for train, test in splitter.split(np.zeros(len(labels)), labels):
        logits = np.asarray(fit_logits(train, test), dtype=np.float64)
        if out is None:
            out = np.zeros((len(labels), logits.shape[1]))
        out[test] = logits
    return out


def reliability(confidence: Sequence[float], correct: Sequence[bool], bins: int = 10) -> list[dict[str, float]]:
    """Per confidence bin (equal widths over [0, 1]): how many predictions, their mean confidence, how many right."""
    conf = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(conf, edges[1:-1]), 0, bins - 1)
    out = []
    for b in range(bins):
        sel = which == b
        if sel.any():
            out.append(
                {
                    "lo": float(edges[b]),
                    "hi": float(edges[b + 1]),
                    "n": int(sel.sum()),
                    "confidence": float(conf[sel].mean()),
                    "accuracy": float(ok[sel].mean()),
                }
            )
    return out


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """The mean gap between confidence and accuracy over the bins, weighted by how many predictions each holds."""
    table = reliability(confidence, correct, bins)
    total = sum(b["n"] for b in table)
    return sum(b["n"] * abs(b["confidence"] - b["accuracy"]) for b in table) / total if total else 0.0
