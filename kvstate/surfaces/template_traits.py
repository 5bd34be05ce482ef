"""What vLLM's Anthropic Messages endpoint learns about a chat template at start-up, learned the same way.

``AnthropicServingMessages`` (``vllm/entrypoints/anthropic/serving.py``) probes the model's template twice, and the
answers change the prompt of every ``/v1/messages`` request:

- **merge_inline_system** (``_detect_merge_inline_system``): render ``[system, user, system, user]`` (no generation
  prompt) with a plain Jinja sandbox (``trim_blocks``, ``lstrip_blocks``, loop controls; none of transformers'
  globals, so a template that calls ``raise_exception`` fails here); if either the tool or the plain template
  fails, or there is no template, system messages inside ``messages`` are merged into the leading system prompt.
- **disabled thinking effort** (``_probe_disabled_thinking_effort``): ``thinking: {"type": "disabled"}`` becomes
  ``reasoning_effort: "none"`` unless the template ignores or refuses ``none`` (it renders ``Hi`` with
  ``none`` the same as with some effort, or fails): then ``"low"``.

``template_traits`` answers both for a ``ChatTemplate``, once per template object.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Literal

import jinja2
import jinja2.ext
import jinja2.sandbox

from kvstate.chat_template import ChatTemplate, PromptError

__all__ = ["ANTHROPIC_EFFORTS", "DEFAULT_TRAITS", "TemplateTraits", "template_traits"]

ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")
"""vLLM's ``AnthropicEffort`` values, in its order (the probe tries each)."""

DisabledEffort = Literal["none", "low"]


@dataclass(frozen=True)
class TemplateTraits:
    merge_inline_system: bool
    """System messages inside ``messages`` are merged into the top-level system prompt."""
    disabled_thinking_effort: DisabledEffort
    """The ``reasoning_effort`` a ``thinking: {"type": "disabled"}`` request renders with."""


DEFAULT_TRAITS = TemplateTraits(merge_inline_system=False, disabled_thinking_effort="none")
"""Without a template (no tokenizer configured: keys are text-approximate, and no template variable is read)."""

_NO_TEMPLATE = TemplateTraits(merge_inline_system=True, disabled_thinking_effort="low")
"""A tokenizer without any chat template: vLLM merges (nothing to probe) and cannot render ``none``."""

_CACHE: weakref.WeakKeyDictionary[ChatTemplate, TemplateTraits] = weakref.WeakKeyDictionary()


def template_traits(template: ChatTemplate | None) -> TemplateTraits:
    """The traits of ``template`` (see the module docstring); None: a tokenizer without a template."""
    if template is None:
        return _NO_TEMPLATE
    found = _CACHE.get(template)
    if found is None:
        merge = any(_needs_merge(template.source(tools)) for tools in (None, ()))
        found = _CACHE[template] = TemplateTraits(merge, _disabled_effort(template))
    return found


def _needs_merge(source: str | None) -> bool:
    if not source:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    probe = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
    try:
        env.from_string(source).render(messages=probe, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def _render_effort(template: ChatTemplate, effort: str) -> str | None:
    kwargs = {"reasoning_effort": effort, "enable_thinking": effort != "none"}
    try:
        return template.render([{"role": "user", "content": "Hi"}], template_kwargs=kwargs)
    except PromptError:
        return None


def _disabled_effort(template: ChatTemplate) -> DisabledEffort:
    none = _render_effort(template, "none")
    if none is None:
        return "low"
    if any(_render_effort(template, effort) == none for effort in ANTHROPIC_EFFORTS):
        return "low"
    return "none"
