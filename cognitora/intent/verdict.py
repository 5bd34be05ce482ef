"""The rewrite's verdict (``Rewrite``: which model serves a request, and why) and its ``How`` labels: a leaf, so that
``RouteRequest`` and ``Decision`` can carry a verdict without importing the rules that reach it
(``cognitora.intent.rewrite``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["How", "Rewrite"]


class How:
    """How the model was chosen: the ``how`` label of ``cognitora_rewrites_total``."""

    RULE = "rule"
    DIFFICULTY = "difficulty"
    CLASSIFIER = "classifier"
    DEFAULT = "default"
    KEPT = "kept"


@dataclass(frozen=True)
class Rewrite:
    """Which model serves a request, and why."""

    requested: str
    """The model the client asked for."""
    model: str
    """The model that serves it (equal to ``requested`` when nothing was rewritten)."""
    how: str
    """``rule``, ``difficulty``, ``classifier``, ``default`` or ``kept`` (a ``How``)."""
    intent: str | None = None
    detail: str = ""
    """The rule that matched, or the difficulty, or the classifier's score, or why the default or the allow list
    applied."""
    score: float | None = None
    """The classifier's probability for ``intent``, when it was consulted."""
    version_of: str | None = None
    """The weighted name ``model`` is a version of (``small`` for ``small-v2``), when a split chose it."""

    @property
    def changed(self) -> bool:
        return self.model != self.requested

    def explain(self) -> str:
        """One line for ``cognitora explain`` and the decision's reason."""
        if self.how == How.KEPT and not self.changed:
            text = f"model {self.requested!r} kept ({self.detail or 'not a rewritten name'})"
        else:
            text = f"model {self.requested!r} -> {self.model!r}: "
            text += f"intent {self.intent!r} by {self.how}" if self.intent else self.how
            if self.detail:
                text += f" ({self.detail})"
        if self.version_of is not None:
            text += f"; weighted split of {self.version_of!r} chose {self.model!r}"
        return text
