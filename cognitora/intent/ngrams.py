"""Character n-grams of a text, hashed, in numpy: the classifier's language-independent features.

Words are a poor unit across languages (Chinese has no spaces, German glues nouns together, French and Spanish
inflect), and an operator writes a handful of examples: a paraphrase or an inflected form shares few words with
them, but many character n-grams. scikit-learn's ``char_wb`` analyzer gives the same features but builds every
n-gram as a Python string (~5 ms of CPU for a 2,000-character turn, docs/intent.md); here the text becomes an array
of code points and the n-grams of each length are rolling 64-bit hashes over it, a few numpy operations whatever the
length (~0.1 ms). The fitted vocabulary is a sorted array of those hashes, looked up with ``searchsorted``.

Like ``char_wb``: lower-cased, whitespace collapsed, n-grams within words (an n-gram may start or end on the space
that pads a word, never straddle one), lengths ``lo`` to ``hi``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CharVocabulary", "char_ngrams"]

_SPACES = re.compile(r"\s+")
_PRIME = np.uint64(1099511628211)  # FNV-64's: odd, and mixes a code point into the high bits
_SPACE = 32

LO, HI = 1, 4
"""Character 1- to 4-grams: on the operator evaluation set (bench/results/intent_eval_operator.md) 1-4 is a little
ahead of 2-5 (the length scikit-learn users reach for) and cheaper; a single CJK character is a word."""


_last: tuple[str, int, int, np.ndarray] | None = None
"""The last text's n-grams: the intent classifier and the difficulty signal read the same turn of the same request
(one comparison of the text, instead of its n-grams twice)."""


def char_ngrams(text: str, lo: int = LO, hi: int = HI) -> np.ndarray:
    """The hashes (uint64) of ``text``'s character ``lo``- to ``hi``-grams within words, one per occurrence (read
    only: the array may be the one the previous call returned)."""
    global _last
    last = _last
    if last is not None and last[1] == lo and last[2] == hi and last[0] == text:
        return last[3]
    grams = _char_ngrams(text, lo, hi)
    grams.flags.writeable = False
    _last = (text, lo, hi, grams)
    return grams


def _char_ngrams(text: str, lo: int, hi: int) -> np.ndarray:
    padded = " " + _SPACES.sub(" ", text.lower()).strip() + " "
    points = np.frombuffer(padded.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    n_points = len(points)
    space = points == _SPACE
    spaces_before = np.concatenate([[0], np.cumsum(space)])
    out: list[np.ndarray] = []
    rolling = np.zeros(n_points, dtype=np.uint64)
    with np.errstate(over="ignore"):  # the hash wraps modulo 2**64 by design
        for n in range(1, hi + 1):
            count = n_points - n + 1
            if count <= 0:
                break
            rolling = rolling[:count] * _PRIME + points[n - 1 : n - 1 + count] + np.uint64(n)
            if n < lo:
                continue
            if n == 1:
                out.append(rolling[~space[:count]])
            elif n == 2:
                out.append(rolling[~(space[:count] & space[1 : 1 + count])])
            else:  # no space strictly inside: positions i+1 .. i+n-2
                inside = spaces_before[n - 1 : n - 1 + count] - spaces_before[1 : 1 + count]
                out.append(rolling[inside == 0])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


@dataclass(frozen=True)
class CharVocabulary:
    """The n-grams seen in the examples (sorted hashes) and their inverse document frequencies (scikit-learn's
    smoothed idf), so a text's TF-IDF vector (sublinear tf, L2-normalised) is what ``TfidfVectorizer`` would give."""

    hashes: np.ndarray
    idf: np.ndarray

    @classmethod
    def fit(cls, texts: Sequence[str], min_df: int = 1) -> CharVocabulary:
        per_text = [np.unique(char_ngrams(t)) for t in texts]
        found = np.concatenate(per_text) if per_text else np.zeros(0, dtype=np.uint64)
        hashes, df = np.unique(found, return_counts=True)
        keep = df >= min_df
        idf = np.log((1 + len(texts)) / (1 + df[keep])) + 1.0
        return cls(hashes[keep], idf)

    def __len__(self) -> int:
        return len(self.hashes)

    def vector(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """``(columns, weights)``: the text's non-zero TF-IDF entries, L2-normalised."""
        grams = char_ngrams(text)
        if not len(self.hashes) or not len(grams):
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        at = np.searchsorted(self.hashes, grams)
        at[at >= len(self.hashes)] = 0
        known = at[self.hashes[at] == grams]
        per_column = np.bincount(known, minlength=len(self.hashes))  # no sort: linear in the vocabulary
        columns = np.flatnonzero(per_column)
        weights = (np.log(per_column[columns]) + 1.0) * self.idf[columns]
        norm = float(np.sqrt(weights @ weights))
        return columns, (weights / norm if norm > 0 else weights)
