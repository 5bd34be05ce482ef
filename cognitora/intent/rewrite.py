"""The rewrite decision: which model serves a request, and why (``Rewrite``), made once, in the core, before
placement (``Router.place`` and, in LiteLLM, the proxy's pre-call hook through ``Router.rewrite``).

Order: is the requested name one the policy rewrites? Then the rules (first match), else the difficulty (a hard
request goes to ``difficulty.hard_target``), else the classifier (when its score reaches ``min_score``), else the
``default``; then the team's allow list; then a weighted split of the chosen name. A name the policy does not
rewrite is kept, though a weighted split of it still applies (a canary of an explicit model).
"""

from __future__ import annotations

from cognitora.intent.build import Classifier, build_classifier, build_difficulty_model
from cognitora.intent.classifier import Prediction
from cognitora.intent.difficulty import DifficultyModel
from cognitora.intent.policy import ANY_MODEL, IntentPolicy
from cognitora.intent.rules import PromptFeatures, RuleMatch, RuleSet, features
from cognitora.intent.split import pick_version
from cognitora.intent.verdict import How, Rewrite
from cognitora.request import RouteRequest

__all__ = ["How", "Rewrite", "Rewriter"]


class Rewriter:
    """A policy compiled: rules, the fitted classifier. Immutable; a reload builds a new one."""

    def __init__(
        self, policy: IntentPolicy, classifier: Classifier | None = None, difficulty: DifficultyModel | None = None
    ) -> None:
        self.policy = policy
        self._rules = RuleSet(policy)
        self._classifier = classifier
        self._difficulty = difficulty
        self._targets = {i.name: i.target for i in policy.intents}
        self._names = frozenset(policy.rewrite)
        self._any = ANY_MODEL in self._names
        self._teams = {team: list(models) for team, models in policy.teams.items()}

    @classmethod
    def build(cls, policy: IntentPolicy) -> Rewriter:
        """Compile and fit (raises ``ClassifierUnavailable``/``ExamplesError`` for the operator)."""
        return cls(policy, build_classifier(policy), build_difficulty_model(policy))

    @property
    def classifier(self) -> Classifier | None:
        """The fitted intent classifier (what the bench scores); None when the policy has no ``classifier``."""
        return self._classifier

    @property
    def difficulty(self) -> DifficultyModel | None:
        """The fitted difficulty model (what the bench scores); None when the policy has no ``difficulty``."""
        return self._difficulty

    def rewrites(self, model: str) -> bool:
        return self._any or model in self._names

    def decide(self, req: RouteRequest) -> Rewrite:
        """The decision, synchronously: an ``embeddings`` classifier answers from its cache, else its local
        fallback (no call is made); ``decide_async`` is what the gateways use."""
        if self._untouched(req.model):
            return Rewrite(req.model, req.model, How.KEPT)
        f = features(req, self.policy.max_chars)
        hit = self._rules.match(f) if self.rewrites(req.model) else None
        return self._decide(req, f, hit, None)

    async def decide_async(self, req: RouteRequest) -> Rewrite:
        """The decision, the ``embeddings`` classifier's call awaited (within its budget) when one is needed."""
        if self._untouched(req.model):
            return Rewrite(req.model, req.model, How.KEPT)
        f = features(req, self.policy.max_chars)
        hit = self._rules.match(f) if self.rewrites(req.model) else None
        predicted = None
        if hit is None and self._classifier is not None and self.rewrites(req.model) and f.last_user:
            predicted = await self._classifier.predict_async(f.last_user)
        return self._decide(req, f, hit, predicted)

    def _untouched(self, model: str) -> bool:
        """Neither rewritten nor split: nothing to read of the request."""
        return not self.rewrites(model) and model not in self.policy.weighted

    def _decide(self, req: RouteRequest, f: PromptFeatures, hit: RuleMatch | None, p: Prediction | None) -> Rewrite:
        requested = req.model
        if self.rewrites(requested):
            chosen = self._by_intent(requested, f, hit, p)
            chosen = self._allowed(chosen, req.identity.team)
        else:
            chosen = Rewrite(requested, requested, How.KEPT, detail="an explicit model")
        split = self.policy.weighted.get(chosen.model)
        if split is None:
            return chosen
        version = pick_version(split, self._sticky_key(req, f))
        return Rewrite(
            requested, version, chosen.how, chosen.intent, chosen.detail, chosen.score, version_of=chosen.model
        )

    def _by_intent(self, requested: str, f: PromptFeatures, hit: RuleMatch | None, p: Prediction | None) -> Rewrite:
        if hit is not None:
            return Rewrite(requested, self._targets[hit.intent], How.RULE, hit.intent, hit.rule)
        fallback = self.policy.default or requested
        if p is None and self._classifier is not None and f.last_user:
            p = self._classifier.predict(f.last_user)
        spec = self._classifier.spec if self._classifier is not None else None
        sure = p is not None and spec is not None and p.score >= spec.min_score
        if self._difficulty is not None:
            d = self._difficulty.judge(f.last_user, f.prompt_chars, f.has_tools, None if p is None else p.score)
            if d.hard:
                target = self._difficulty.spec.hard_target
                intent = p.intent if sure and p is not None else None
                return Rewrite(requested, target, How.DIFFICULTY, intent, d.why, None if p is None else p.score)
        if p is not None and spec is not None:
            source = f"; {p.source}" if p.source else ""
            if sure:
                detail = f"score {p.score:.2f}{source}"
                return Rewrite(requested, self._targets[p.intent], How.CLASSIFIER, p.intent, detail, p.score)
            detail = f"classifier unsure: {p.intent!r} at {p.score:.2f} < min_score {spec.min_score:g}{source}"
            return Rewrite(requested, fallback, How.DEFAULT, None, detail, p.score)
        return Rewrite(requested, fallback, How.DEFAULT, None, "no rule matched")

    def _allowed(self, chosen: Rewrite, team: str | None) -> Rewrite:
        allowed = self._teams.get(team) if team is not None else None
        if allowed is None or chosen.model in allowed:
            return chosen
        default = self.policy.default
        model = default if default is not None and default in allowed else allowed[0]
        note = f"team {team!r} may not use {chosen.model!r}; its allow list gives {model!r}"
        detail = f"{chosen.detail}; {note}" if chosen.detail else note
        return Rewrite(chosen.requested, model, chosen.how, chosen.intent, detail, chosen.score)

    def _sticky_key(self, req: RouteRequest, f: PromptFeatures) -> str:
        if self.policy.sticky_by == "user":
            if req.identity.user:
                return f"user:{req.identity.user}"
            if req.identity.key:
                return f"key:{req.identity.key}"
        return f"conversation:{f.first_user}"
