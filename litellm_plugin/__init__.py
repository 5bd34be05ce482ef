"""LiteLLM adapter: registers the ``cognitora`` routing strategy. Translates; never decides."""
