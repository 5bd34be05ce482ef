"""LiteLLM's request kwargs, responses and errors <-> the core's ``RouteRequest``, ``Outcome`` and ``Rejection``.

Pure functions, no LiteLLM state, in three rooms:

- ``request``: what LiteLLM hands the strategy -> ``RouteRequest`` (the prompt, its limits, the caller's identity);
- ``outcome``: what LiteLLM hands a callback -> ``Outcome``, and a ``Rejection`` -> the LiteLLM error that answers it;
- ``metadata``: the call's kwargs beside the body (the metadata dict the strategy, hooks and callbacks pass notes
  through, upstream headers, trace ids).

Import from here: every public name of the three is re-exported.
"""

from litellm_plugin.translate.metadata import (
    PLACEMENT_KEY,
    REWRITE_KEY,
    callback_metadata,
    client_trace,
    metadata_of,
    note_rewrite,
    placement_id,
    rewrite_of,
    set_engine_headers,
    set_prefill_endpoint,
    trace_id,
    writable_metadata,
)
from litellm_plugin.translate.outcome import CONNECTION_ERROR_TEXT, failure_outcome, rejection_error, success_outcome
from litellm_plugin.translate.request import (
    ALLOW_PINNING_KEY,
    INTENT_KEY,
    PRIORITY_KEY,
    responses_holder,
    route_request,
    surface_path,
)

__all__ = [
    "ALLOW_PINNING_KEY",
    "CONNECTION_ERROR_TEXT",
    "INTENT_KEY",
    "PLACEMENT_KEY",
    "PRIORITY_KEY",
    "REWRITE_KEY",
    "callback_metadata",
    "client_trace",
    "failure_outcome",
    "metadata_of",
    "note_rewrite",
    "placement_id",
    "rejection_error",
    "responses_holder",
    "rewrite_of",
    "route_request",
    "set_engine_headers",
    "set_prefill_endpoint",
    "success_outcome",
    "surface_path",
    "trace_id",
    "writable_metadata",
]
