"""``cognitora``: the name a proxy config gives LiteLLM for Cognitora's callback, and the ONE line that installs
the plugin before LiteLLM builds its Router::

    litellm_settings:
      callbacks: ["litellm_plugin.callbacks.cognitora"]

Importing this module changes nothing; the proxy then asks it for the name ``cognitora``, and that name is answered
by ``litellm_plugin.install()`` (which teaches LiteLLM the ``cognitora`` strategy) with the installed plugin's one
``CognitoraCallbacks`` (``litellm_plugin.hooks``: what each LiteLLM hook becomes). Strategies add the same instance
to ``litellm.callbacks`` themselves, so SDK users, who call ``litellm_plugin.install()``, need no callback line.

The class lives in ``hooks``, not here, because ``install()`` (``register``) builds it and this name calls
``install()``: one module holding both would import ``register`` and be imported by it.
"""

from __future__ import annotations

from litellm_plugin.hooks import SERVED_MODEL_HEADER, CognitoraCallbacks
from litellm_plugin.register import install

__all__ = ["SERVED_MODEL_HEADER", "CognitoraCallbacks"]  # not `cognitora`: naming it installs the plugin


def __getattr__(name: str) -> CognitoraCallbacks:
    """``litellm_plugin.callbacks.cognitora``, the name the proxy's callback line resolves (LiteLLM wants an
    instance, not a class): installs the plugin, then returns its callbacks. Any other name is missing."""
    if name == "cognitora":
        return install().callbacks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
