"""LiteLLM adapter: the ``cognitora`` routing strategy. Translates; never decides. Importing it changes nothing.

An SDK script calls ``litellm_plugin.install()`` before ``litellm.Router(..., routing_strategy="cognitora")``; a
proxy config installs it with one line, ``litellm_settings: {callbacks: ["litellm_plugin.callbacks.cognitora"]}``.
``install()`` returns the plugin's state (``Plugin``); ``strategy_for(router)`` the strategy a Router routes with.
"""

from litellm_plugin.register import (
    STRATEGY_NAME,
    LiteLLMIncompatible,
    Plugin,
    install,
    installed,
    strategy_for,
    uninstall,
)

__all__ = ["STRATEGY_NAME", "LiteLLMIncompatible", "Plugin", "install", "installed", "strategy_for", "uninstall"]
