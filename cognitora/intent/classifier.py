"""The learned intent classifier: TF-IDF features and a logistic regression, fitted at start-up on the policy's
labeled examples. Offline, CPU only, well under a millisecond a request (docs/intent.md has the measurements that
chose it).

It needs scikit-learn, the optional extra ``intent`` (``cognitora.distribution.install_hint``). Without it, a policy
that asks for the classifier is refused at start-up with ``ClassifierUnavailable`` saying what to install; rules keep
working without it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cognitora.distribution import install_hint
from cognitora.intent.policy import ClassifierSpec, FeatureSet, IntentPolicy

EXTRA = install_hint("intent")


class ClassifierUnavailable(RuntimeError):
    """The policy asks for the classifier, and scikit-learn is not installed."""


class ExamplesError(ValueError):
    """The labeled examples cannot be read or do not fit the policy; the message says which and why."""


@dataclass(frozen=True)
class Prediction:
    intent: str
    score: float
    """The classifier's probability for ``intent`` (0..1)."""


def read_examples(path: Path, intents: set[str]) -> list[tuple[str, str]]:
    """``(text, intent)`` pairs from a JSON-lines file; every line must name an intent of the policy."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ExamplesError(f"{path}: cannot read the examples file ({exc.strerror or exc})") from None
    out: list[tuple[str, str]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ExamplesError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not isinstance(row.get("intent"), str):
            raise ExamplesError(f'{path}:{n}: expected {{"text": "...", "intent": "..."}}, got {line[:80]!r}')
        if row["intent"] not in intents:
            raise ExamplesError(
                f"{path}:{n}: intent {row['intent']!r} is not one of the policy's intents "
                f"({', '.join(sorted(intents))}); add it under intent.intents or drop these lines"
            )
        out.append((row["text"], row["intent"]))
    return out


FEATURES: dict[FeatureSet, dict[str, Any]] = {
    FeatureSet.WORDS: {"analyzer": "word", "ngram_range": (1, 1), "sublinear_tf": True},
    FeatureSet.CHARS: {"analyzer": "char_wb", "ngram_range": (2, 5), "sublinear_tf": True, "min_df": 2},
}
"""The TF-IDF feature sets a classifier may use (``ClassifierSpec.features``); measured in docs/intent.md."""


class TfidfClassifier:
    """TF-IDF features and a multinomial logistic regression, fitted once on the examples.

    ``predict`` does not go through scikit-learn: its per-call input checks cost ~2 ms a request, more than the
    arithmetic. The fitted vocabulary, IDF weights and coefficients are read out once, and a prediction is the
    analyzer (scikit-learn's own, so the features are the same), a dictionary look-up per term and one small
    matrix product: the same probabilities (tests/test_intent.py checks them against ``predict_proba``).
    """

    def __init__(self, spec: ClassifierSpec, examples: Sequence[tuple[str, str]], max_chars: int = 2000) -> None:
        try:
            import numpy as np
            from sklearn.feature_extraction.text import TfidfVectorizer
            from sklearn.linear_model import LogisticRegression
            from sklearn.pipeline import FeatureUnion, make_pipeline
        except ImportError:
            raise ClassifierUnavailable(
                f"intent.classifier needs scikit-learn, which is not installed: {EXTRA} (or remove "
                "intent.classifier to use rules only)"
            ) from None
        labels = sorted({intent for _, intent in examples})
        if len(labels) < 2:
            raise ExamplesError(
                f"the classifier needs examples of at least two intents, got {len(labels)} ({', '.join(labels)}); "
                "add examples (intent.intents[].examples or intent.classifier.examples_file)"
            )
        self.spec = spec
        self.max_chars = max_chars
        self._np = np
        # saga: the same fit as lbfgs on these examples (same accuracy) in ~0.1 s instead of seconds.
        union = FeatureUnion([(str(name), TfidfVectorizer(**FEATURES[name])) for name in spec.features])
        self.pipeline: Any = make_pipeline(union, LogisticRegression(C=spec.c, solver="saga", max_iter=2000))
        """The fitted scikit-learn pipeline (what ``predict`` reproduces; benchmarks and tests compare)."""
        self.pipeline.fit([self.clip(t) for t, _ in examples], [i for _, i in examples])
        self.labels: list[str] = [str(c) for c in self.pipeline.classes_]
        model = self.pipeline[-1]
        coef = np.asarray(model.coef_, dtype=np.float64)
        intercept = np.asarray(model.intercept_, dtype=np.float64)
        if coef.shape[0] == 1:  # two classes: scikit-learn keeps one row (the second class's logit)
            coef, intercept = np.vstack([-coef / 2, coef / 2]), np.array([-intercept[0] / 2, intercept[0] / 2])
        self._coef_t = np.ascontiguousarray(coef.T)
        self._intercept = intercept
        self._parts: list[tuple[Any, dict[str, int], Any, int]] = []
        offset = 0
        for _, vectorizer in union.transformer_list:
            vocab = {str(k): int(v) for k, v in vectorizer.vocabulary_.items()}
            self._parts.append((vectorizer.build_analyzer(), vocab, vectorizer.idf_, offset))
            offset += len(vocab)

    def clip(self, text: str) -> str:
        """What is classified of ``text``: its last ``max_chars`` characters (the policy's; the request path has
        cut the turn already, the examples are cut here the same way)."""
        return text[-self.max_chars :]

    def scores(self, text: str) -> Any:
        """Class probabilities for ``text`` (in ``labels`` order), as ``predict_proba`` gives them."""
        np = self._np
        clipped = self.clip(text)
        columns: list[int] = []
        values: list[float] = []
        for analyze, vocab, idf, offset in self._parts:
            counts: dict[int, int] = {}
            for term in analyze(clipped):
                j = vocab.get(term)
                if j is not None:
                    counts[j] = counts.get(j, 0) + 1
            if not counts:
                continue
            idx = np.fromiter(counts, dtype=np.int64, count=len(counts))
            tf = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            w = (np.log(tf) + 1.0) * idf[idx]  # sublinear tf, as fitted
            w /= np.sqrt(w @ w)
            columns.extend((idx + offset).tolist())
            values.extend(w.tolist())
        logits = self._intercept.copy()
        if columns:
            logits += np.asarray(values) @ self._coef_t[columns]
        logits -= logits.max()
        e = np.exp(logits)
        return e / e.sum()

    def predict(self, text: str) -> Prediction:
        probs = self.scores(text)
        best = int(probs.argmax())
        return Prediction(self.labels[best], float(probs[best]))


def build_classifier(policy: IntentPolicy) -> TfidfClassifier | None:
    """The policy's classifier, fitted; None when the policy has none. Raises ``ClassifierUnavailable`` or
    ``ExamplesError`` with a message for the operator."""
    spec = policy.classifier
    if spec is None:
        return None
    names = {i.name for i in policy.intents}
    examples = [(text, i.name) for i in policy.intents for text in i.examples]
    if spec.examples_file is not None:
        examples += read_examples(spec.examples_file, names)
    return TfidfClassifier(spec, examples, policy.max_chars)
