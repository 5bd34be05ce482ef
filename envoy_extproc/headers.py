"""Every wire name at the Envoy boundary, in one place (header names, metadata keys, body fields).

``examples/envoy.yaml`` and ``docs/envoy.md`` use the same names; change them here and there together.
Header names are lowercase: Envoy hands ext_proc lowercase header keys (HTTP/2 rules, also for HTTP/1.1 clients).
"""

from __future__ import annotations

from cognitora.disagg.wire import PREFILL_ENDPOINT_HEADER

__all__ = [
    "ATTEMPT_COUNT",
    "AUTHORIZATION",
    "CHAT_SUFFIX",
    "CLIENT_FORBIDDEN",
    "CLOUD_TARGET",
    "COMPLETIONS_SUFFIX",
    "CONTENT_LENGTH",
    "CONTENT_TYPE",
    "DEFAULT_INTENT_HEADER",
    "DEFAULT_KEY_HEADER",
    "DEFAULT_PRIORITY_HEADER",
    "DEFAULT_TEAM_HEADER",
    "DEFAULT_USER_HEADER",
    "DESTINATION_ENDPOINT",
    "DESTINATION_ENDPOINTS",
    "EMBEDDINGS_PATH",
    "JSON_CONTENT_TYPE",
    "LB_METADATA_NAMESPACE",
    "MESSAGES_PATH",
    "METHOD",
    "PATH",
    "PLACED_PATHS",
    "PREFILL_ENDPOINT",
    "RESPONSES_PATH",
    "RESPONSE_FLAGS",
    "RETRY_AFTER",
    "SERVED_MODEL",
    "SSE_CONTENT_TYPE",
    "STATUS",
    "SURFACE_SUFFIXES",
    "UPSTREAM_FAILURE_FLAGS",
    "UPSTREAM_HOST",
]

# -- where the pick goes (the Gateway API Inference Extension convention) ----------------------------------------
LB_METADATA_NAMESPACE = "envoy.lb"
"""Dynamic-metadata namespace the pick is written to; the ext_proc filter must list it in
``metadata_options.receiving_namespaces.untyped`` or Envoy drops it."""

DESTINATION_ENDPOINT = "x-gateway-destination-endpoint"
"""The picked endpoint, one ``IP:port``: a metadata key in ``envoy.lb`` AND a request header (OVERWRITE), so both
ORIGINAL_DST variants (``metadata_key`` or ``use_http_header``) work."""

DESTINATION_ENDPOINTS = "x-cognitora-destination-endpoints"
"""The pick followed by the fallbacks, ``IP:port,IP:port,...`` (metadata key in ``envoy.lb``): read by the
``override_host`` load-balancing policy, which moves to the next address on each retry."""

# -- identity, set by the operator's auth filter (never trusted from the client: Envoy strips client copies) ----------
CLOUD_TARGET = "x-cognitora-cloud"
"""A metadata key in ``envoy.lb``, set by the service on a cloud decision: the target's name, which the cloud route
matches (examples/envoy_burst.yaml ``dynamic_metadata``). Never a request header the route reads: a client's copy
of the header is dropped by Envoy (examples/envoy.yaml) and by the service, and selects nothing."""
AUTHORIZATION = "authorization"

DEFAULT_TEAM_HEADER = "x-cognitora-team"
DEFAULT_KEY_HEADER = "x-cognitora-key-id"
DEFAULT_PRIORITY_HEADER = "x-cognitora-priority"
DEFAULT_USER_HEADER = "x-cognitora-user"
DEFAULT_INTENT_HEADER = "x-cognitora-intent"
"""An intent hint for the rewrite rules (``intent.intents[].rules[].hint``): set by the operator's Envoy config
(a route, a JWT claim) after authentication, like the identity headers."""

# -- what the service adds to the response ------------------------------------------------------------------------
SERVED_MODEL = "x-cognitora-model"
"""The model that served the request, on every response to a request the ``intent`` policy rewrote or kept: the
client sees which model answered (the engine's own ``model`` field says the same). A burst answer names the
cloud's model; a cloud failure Envoy retried on an engine, the local one."""

# -- prefill/decode pairs (cognitora.disagg.wire; the decode endpoint's pd-sidecar reads it) ------------------------
PREFILL_ENDPOINT = PREFILL_ENDPOINT_HEADER
"""The prefill endpoint of a split request, its base URL from cognitora.yaml: set (OVERWRITE) with the pick. A copy
the client sent is removed in the request-headers phase of every request: only placement names a prefill endpoint."""

CLIENT_FORBIDDEN = frozenset({PREFILL_ENDPOINT, CLOUD_TARGET})
"""Request headers only placement may name, removed from every request in its headers phase (a client's copy
would otherwise reach an upstream that reads it: a decode sidecar, a cloud provider)."""

# -- what Envoy adds to the response for us (route ``response_headers_to_add`` / ``include_attempt_count_in_response``)
UPSTREAM_HOST = "x-cognitora-upstream-host"
"""``%UPSTREAM_REMOTE_ADDRESS%``: the engine that actually answered (after retries)."""
RESPONSE_FLAGS = "x-cognitora-response-flags"
"""``%RESPONSE_FLAGS%``: ``UF`` upstream connect failure, ``URX`` retries exhausted, ``UH`` no healthy host."""
ATTEMPT_COUNT = "x-envoy-attempt-count"
"""How many upstream attempts Envoy made (virtual host ``include_attempt_count_in_response: true``)."""

UPSTREAM_FAILURE_FLAGS = frozenset({"UF", "URX", "UH", "UO", "UMSDR", "NC"})
"""Response flags that mean "the engine could not be reached", as opposed to an answer from the engine.
(``UR``, a reset after connect, is not here: a slow or overloaded engine may reset one stream and be healthy.)"""

# -- HTTP pseudo and ordinary headers we read or write ------------------------------------------------------------
METHOD = ":method"
PATH = ":path"
STATUS = ":status"
CONTENT_TYPE = "content-type"
CONTENT_LENGTH = "content-length"
RETRY_AFTER = "retry-after"

SSE_CONTENT_TYPE = "text/event-stream"
JSON_CONTENT_TYPE = "application/json"

# -- the request paths that are placed (everything else passes through untouched) -----------------------------------
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MESSAGES_PATH = "/v1/messages"
"""Anthropic Messages. Its ``/v1/messages/count_tokens`` is not placed: an engine counts, nothing is generated."""
RESPONSES_PATH = "/v1/responses"
EMBEDDINGS_PATH = "/v1/embeddings"
PLACED_PATHS = frozenset({CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, MESSAGES_PATH, RESPONSES_PATH, EMBEDDINGS_PATH})
"""The default ``--placed-path`` list. A request is placed when its path is one of them or ends with one under a
prefix (``/api/v1/chat/completions``): ``ExtprocSettings.placed``."""
CHAT_SUFFIX = "/chat/completions"
"""A placed path ending so carries a chat body (``messages``); any other placed path ends in ``/completions`` and
carries a completions body (``prompt``)."""
COMPLETIONS_SUFFIX = "/completions"
SURFACE_SUFFIXES = (CHAT_SUFFIX, COMPLETIONS_SUFFIX, "/messages", "/responses", "/embeddings")
"""What a placed path may end with: the body's surface is read from the path (``cognitora.surface_entry``)."""
