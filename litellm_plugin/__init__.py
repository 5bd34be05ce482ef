"""LiteLLM adapter: registers the ``cognitora`` routing strategy. Translates; never decides.

``import litellm_plugin`` is all an SDK user needs before ``litellm.Router(..., routing_strategy="cognitora")``;
a proxy config loads it with one line, ``litellm_settings: {callbacks: ["litellm_plugin.callbacks.cognitora"]}``.
"""

from litellm_plugin.register import STRATEGY_NAME, LiteLLMIncompatible, register

__all__ = ["STRATEGY_NAME", "LiteLLMIncompatible", "register"]

register()
