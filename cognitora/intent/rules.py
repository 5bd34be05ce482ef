"""What the intent rules read of a request (``PromptFeatures``) and the compiled rules that read it.

Only the last user turn (truncated) and the system prompt are searched: the cost of a rule is bounded whatever the
length of the conversation, and the newest question is what the request is about.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cognitora.intent.policy import IntentPolicy, RuleSpec
from cognitora.request import RouteRequest

__all__ = ["CompiledRule", "PromptFeatures", "RuleMatch", "RuleSet", "features"]


@dataclass(frozen=True)
class PromptFeatures:
    """The parts of a request the intent rules and the classifier look at."""

    last_user: str
    """The last user turn's text (its last ``max_chars``); a completions prompt's text."""
    system: str
    """The system prompt's text (its first ``max_chars``); empty when there is none."""
    first_user: str
    """The first user turn's text (its first 512 characters): what names a conversation for a sticky split."""
    has_tools: bool
    prompt_chars: int
    """Characters of text in the whole prompt (every message)."""
    max_tokens: int | None
    hint: str | None


def _text(content: Any) -> str:
    """A message's ``content`` as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    return ""


def features(req: RouteRequest, max_chars: int) -> PromptFeatures:
    """The request's features, read once per request; the texts cut to ``max_chars`` (the policy's)."""
    last_user = system = first_user = ""
    total = 0
    if req.messages is not None:
        for message in req.messages:
            if not isinstance(message, Mapping):
                continue
            text = _text(message.get("content"))
            total += len(text)
            role = message.get("role")
            if role == "user":
                last_user = text
                if not first_user:
                    first_user = text[:512]
            elif role in ("system", "developer") and not system:
                system = text
    elif isinstance(req.prompt, str):
        last_user = first_user = req.prompt
        total = len(req.prompt)
    elif isinstance(req.prompt, Sequence) and req.prompt and all(isinstance(p, str) for p in req.prompt):
        texts = [str(p) for p in req.prompt]
        last_user, first_user, total = texts[-1], texts[0], sum(map(len, texts))
    return PromptFeatures(
        last_user=last_user[-max_chars:],
        system=system[:max_chars],
        first_user=first_user[:512],
        has_tools=bool(req.tools),
        prompt_chars=total,
        max_tokens=req.max_tokens,
        hint=req.identity.intent_hint,
    )


class CompiledRule:
    """A ``RuleSpec`` with its regular expressions compiled; ``describe`` says what it is for explanations."""

    def __init__(self, spec: RuleSpec, where: str) -> None:
        self.spec = spec
        self.where = where
        """Its place in the policy, e.g. ``intents[0].rules[1]``."""
        flags = re.IGNORECASE
        self._last_user = re.compile(spec.last_user_regex, flags) if spec.last_user_regex else None
        words = "|".join(re.escape(k) for k in spec.last_user_keywords)
        self._keywords = re.compile(rf"(?<!\w)(?:{words})(?!\w)", flags) if words else None
        self._system = re.compile(spec.system_regex, flags) if spec.system_regex else None
        self._hints = frozenset(spec.hint)

    def match(self, f: PromptFeatures) -> str | None:
        """What matched (for the explanation), or None when any condition fails."""
        s = self.spec
        said: list[str] = []
        if self._last_user is not None:
            m = self._last_user.search(f.last_user)
            if m is None:
                return None
            said.append(f"last user turn matches {s.last_user_regex!r} ({m.group(0)[:40]!r})")
        if self._keywords is not None:
            m = self._keywords.search(f.last_user)
            if m is None:
                return None
            said.append(f"keyword {m.group(0)!r}")
        if self._system is not None:
            if self._system.search(f.system) is None:
                return None
            said.append(f"system prompt matches {s.system_regex!r}")
        if s.tools is not None:
            if f.has_tools != s.tools:
                return None
            said.append("tools present" if s.tools else "no tools")
        if s.min_prompt_chars is not None:
            if f.prompt_chars < s.min_prompt_chars:
                return None
            said.append(f"prompt >= {s.min_prompt_chars} chars")
        if s.max_prompt_chars is not None:
            if f.prompt_chars > s.max_prompt_chars:
                return None
            said.append(f"prompt <= {s.max_prompt_chars} chars")
        if s.min_max_tokens is not None:
            if f.max_tokens is None or f.max_tokens < s.min_max_tokens:
                return None
            said.append(f"max_tokens >= {s.min_max_tokens}")
        if s.max_max_tokens is not None:
            if f.max_tokens is None or f.max_tokens > s.max_max_tokens:
                return None
            said.append(f"max_tokens <= {s.max_max_tokens}")
        if self._hints:
            if f.hint not in self._hints:
                return None
            said.append(f"trusted hint {f.hint!r}")
        return ", ".join(said)


@dataclass(frozen=True)
class RuleMatch:
    intent: str
    rule: str
    """Where the rule is written (``intents[0].rules[1]``) and what matched."""


class RuleSet:
    """Every intent's rules, in policy order: the first that matches decides."""

    def __init__(self, policy: IntentPolicy) -> None:
        self._rules = [
            (intent.name, CompiledRule(rule, f"intents[{i}].rules[{j}]"))
            for i, intent in enumerate(policy.intents)
            for j, rule in enumerate(intent.rules)
        ]

    def match(self, f: PromptFeatures) -> RuleMatch | None:
        for intent, rule in self._rules:
            said = rule.match(f)
            if said is not None:
                return RuleMatch(intent, f"{rule.where}: {said}")
        return None
