"""The learned intent classifier: TF-IDF features (words and character n-grams) and a logistic regression, fitted
at start-up on the policy's labeled examples, its probabilities calibrated. Offline, CPU only, well under a
millisecond a request (docs/intent.md has the measurements that chose it).

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
from cognitora.intent.policy import ClassifierSpec, FeatureSet

__all__ = [
    "ClassifierUnavailable",
    "ExamplesError",
    "LinearModel",
    "Prediction",
    "TfidfClassifier",
    "read_examples",
    "sklearn_or_explain",
    "two_labels_at_least",
]

EXTRA = install_hint("intent")


class ClassifierUnavailable(RuntimeError):
    """The policy asks for the classifier, and scikit-learn is not installed."""


class ExamplesError(ValueError):
    """The labeled examples cannot be read or do not fit the policy; the message says which and why."""


@dataclass(frozen=True)
class Prediction:
    intent: str
    score: float
    """The classifier's calibrated probability for ``intent`` (0..1)."""
    source: str = ""
    """Which classifier answered, when it is not the one configured (the embeddings kind's fallback says why)."""


def read_examples(path: Path, intents: set[str], label: str = "intent") -> list[tuple[str, str]]:
    """``(text, label)`` pairs from a JSON-lines file; every line's ``label`` must be one of ``intents``."""
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
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not isinstance(row.get(label), str):
            raise ExamplesError(f'{path}:{n}: expected {{"text": "...", "{label}": "..."}}, got {line[:80]!r}')
        if row[label] not in intents:
            what = "the policy's intents" if label == "intent" else "the accepted values"
            raise ExamplesError(
                f"{path}:{n}: {label} {row[label]!r} is not one of {what} ({', '.join(sorted(intents))}); "
                + ("add it under intent.intents or drop these lines" if label == "intent" else "fix these lines")
            )
        out.append((row["text"], row[label]))
    return out


WORDS = {"analyzer": "word", "ngram_range": (1, 1), "sublinear_tf": True}
"""scikit-learn's word features (``ClassifierSpec.features: [words]``); characters: ``cognitora.intent.ngrams``."""


def sklearn_or_explain() -> Any:
    """scikit-learn's modules the classifiers use, or ``ClassifierUnavailable`` saying what to install."""
    try:
        import sklearn  # noqa: F401  (first: a submodule imported earlier would mask the package missing)
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise ClassifierUnavailable(
            f"intent.classifier needs scikit-learn, which is not installed: {EXTRA} (or remove "
            "intent.classifier to use rules only)"
        ) from None
    return TfidfVectorizer, LogisticRegression


def two_labels_at_least(labels: Sequence[str], what: str = "intents") -> None:
    if len(set(labels)) < 2:
        raise ExamplesError(
            f"the classifier needs examples of at least two {what}, got {len(set(labels))} "
            f"({', '.join(sorted(set(labels)))}); add examples (intent.intents[].examples or "
            "intent.classifier.examples_file)"
        )


class LinearModel:
    """A fitted multinomial logistic regression read out (coefficients, intercepts, a temperature), so a prediction
    is one small matrix product instead of scikit-learn's per-call input checks (~2 ms, more than the arithmetic).
    """

    def __init__(self, x: Any, y: Sequence[str], c: float, calibrate: bool) -> None:
        import numpy as np

        from cognitora.intent.calibration import fit_temperature, held_out_logits

        _, logistic = sklearn_or_explain()
        self.labels: list[str] = sorted(set(y))
        index = {label: i for i, label in enumerate(self.labels)}
        codes = np.array([index[label] for label in y])

        def fit(rows: Any) -> Any:
            # saga at tol 1e-3: the same accuracy as lbfgs or saga at 1e-4 on these examples (eval.jsonl: 96.6% either
            # way) in 0.2 s instead of 2 to 8 s on a loaded machine; calibration refits it k more times.
            return logistic(C=c, solver="saga", max_iter=2000, tol=1e-3).fit(x[rows], codes[rows])

        self.model: Any = fit(np.arange(len(codes)))
        """The fitted scikit-learn model (what ``logits`` reproduces; tests compare)."""
        coef, intercept = _two_columns(np.asarray(self.model.coef_), np.asarray(self.model.intercept_))
        self.coef_t = np.ascontiguousarray(coef.T, dtype=np.float64)
        self.intercept = intercept.astype(np.float64)
        self.temperature = 1.0
        """Divides the logits: fitted on held-out predictions over the examples (``cognitora.intent.calibration``)."""
        if calibrate:
            held = held_out_logits(lambda train, test: _logits_of(fit(train), x[test]), codes)
            if held is not None:
                self.temperature = fit_temperature(held, codes)

    def probabilities(self, logits: Any) -> Any:
        from cognitora.intent.calibration import softmax

        return softmax(logits / self.temperature)


def _two_columns(coef: Any, intercept: Any) -> tuple[Any, Any]:
    """Two classes: scikit-learn keeps one row (the second class's logit); make it one row per class."""
    import numpy as np

    if coef.shape[0] == 1:
        return np.vstack([-coef / 2, coef / 2]), np.array([-intercept[0] / 2, intercept[0] / 2])
    return coef, intercept


def _logits_of(model: Any, x: Any) -> Any:
    import numpy as np

    d = np.asarray(model.decision_function(x))
    return np.column_stack([-d / 2, d / 2]) if d.ndim == 1 else d


class TfidfClassifier:
    """TF-IDF features (word unigrams and/or character 1-4-grams) and a calibrated logistic regression.

    ``scores`` does not go through scikit-learn: the word vocabulary and IDF weights, the character n-gram
    vocabulary (``cognitora.intent.ngrams``) and the coefficients are read out once, and a prediction is the
    analyzers, a look-up per term and one small matrix product: the probabilities of the fitted model
    (tests/intent/test_intent.py checks them against scikit-learn's ``decision_function``).
    """

    def __init__(self, spec: ClassifierSpec, examples: Sequence[tuple[str, str]], max_chars: int = 2000) -> None:
        import numpy as np

        from cognitora.intent.ngrams import CharVocabulary

        tfidf, _ = sklearn_or_explain()
        two_labels_at_least([i for _, i in examples])
        self.spec = spec
        self.max_chars = max_chars
        self._np = np
        texts = [self.clip(t) for t, _ in examples]
        self._words: Any = tfidf(**WORDS).fit(texts) if FeatureSet.WORDS in spec.features else None
        self._word_vocab: dict[str, int] = {}
        if self._words is not None:
            self._word_vocab = {str(k): int(v) for k, v in self._words.vocabulary_.items()}
            self._analyze = self._words.build_analyzer()
        self._chars = CharVocabulary.fit(texts) if FeatureSet.CHARS in spec.features else None
        self._char_offset = len(self._word_vocab)
        self.linear = LinearModel(self.matrix(texts), [i for _, i in examples], spec.c, spec.calibrate)
        self.labels = self.linear.labels

    def clip(self, text: str) -> str:
        """What is classified of ``text``: its last ``max_chars`` characters (the policy's; the request path has
        cut the turn already, the examples are cut here the same way)."""
        return text[-self.max_chars :]

    def matrix(self, texts: Sequence[str]) -> Any:
        """The feature matrix of ``texts`` (rows), as the model was fitted on (scikit-learn's sparse format)."""
        from scipy.sparse import csr_matrix

        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for i, text in enumerate(texts):
            c, v = self._features(text)
            rows += [i] * len(c)
            cols += c.tolist()
            vals += v.tolist()
        width = self._char_offset + (len(self._chars) if self._chars is not None else 0)
        return csr_matrix((vals, (rows, cols)), shape=(len(texts), width))

    def _features(self, text: str) -> tuple[Any, Any]:
        np = self._np
        clipped = self.clip(text)
        columns: list[Any] = []
        values: list[Any] = []
        if self._words is not None:
            counts: dict[int, int] = {}
            for term in self._analyze(clipped):
                j = self._word_vocab.get(term)
                if j is not None:
                    counts[j] = counts.get(j, 0) + 1
            if counts:
                idx = np.fromiter(counts, dtype=np.int64, count=len(counts))
                tf = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
                w = (np.log(tf) + 1.0) * self._words.idf_[idx]  # sublinear tf, as fitted
                columns.append(idx)
                values.append(w / np.sqrt(w @ w))
        if self._chars is not None:
            idx, w = self._chars.vector(clipped)
            columns.append(idx + self._char_offset)
            values.append(w)
        if not columns:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return np.concatenate(columns), np.concatenate(values)

    def logits(self, text: str) -> Any:
        columns, values = self._features(text)
        out = self.linear.intercept.copy()
        if len(columns):
            out += values @ self.linear.coef_t[columns]
        return out

    def scores(self, text: str) -> Any:
        """Calibrated class probabilities for ``text``, in ``labels`` order."""
        return self.linear.probabilities(self.logits(text))

    def predict(self, text: str) -> Prediction:
        probs = self.scores(text)
        best = int(probs.argmax())
        return Prediction(self.labels[best], float(probs[best]))

    async def predict_async(self, text: str) -> Prediction:
        return self.predict(text)
