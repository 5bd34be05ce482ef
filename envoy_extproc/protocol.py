"""ext_proc messages (xds-protos bindings): every answer this service sends Envoy.

The answers that never vary are built once at import and reused: building a protobuf message is a visible share of
the per-request cost at a thousand requests per second.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2

from envoy_extproc import headers

__all__ = [
    "CONTINUE_REQUEST_BODY",
    "CONTINUE_REQUEST_HEADERS",
    "CONTINUE_REQUEST_TRAILERS",
    "CONTINUE_RESPONSE_BODY",
    "CONTINUE_RESPONSE_HEADERS",
    "CONTINUE_RESPONSE_TRAILERS",
    "BodySendMode",
    "HttpBody",
    "HttpHeaders",
    "ProcessingRequest",
    "ProcessingResponse",
    "extend_message_timeout",
    "openai_error",
    "remove_request_headers",
    "replace_response_chunk",
    "response_headers",
    "route_to",
    "route_to_cloud",
    "with_response_header",
]

# xds-protos ships no type stubs: to mypy every protobuf message is Any. These aliases say which one is meant.
ProcessingRequest: TypeAlias = Any
ProcessingResponse: TypeAlias = Any
HttpHeaders: TypeAlias = Any
HttpBody: TypeAlias = Any
BodySendMode = processing_mode_pb2.ProcessingMode.BodySendMode

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

CONTINUE_REQUEST_HEADERS = ep.ProcessingResponse(request_headers=ep.HeadersResponse())
CONTINUE_REQUEST_BODY = ep.ProcessingResponse(request_body=ep.BodyResponse())
CONTINUE_REQUEST_TRAILERS = ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
CONTINUE_RESPONSE_HEADERS = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
CONTINUE_RESPONSE_BODY = ep.ProcessingResponse(response_body=ep.BodyResponse())
CONTINUE_RESPONSE_TRAILERS = ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


def extend_message_timeout(seconds: float) -> ProcessingResponse:
    """Ask Envoy to wait up to ``seconds`` for the answer to the message it sent last (the request body, while the
    request waits in Cognitora's queue): honoured up to the filter's ``max_message_timeout``, once per message."""
    answer = ep.ProcessingResponse()
    answer.override_message_timeout.FromNanoseconds(int(seconds * 1e9))
    return answer


def set_header(key: str, value: str) -> base_pb2.HeaderValueOption:
    """A header to set, replacing any copy the client sent (OVERWRITE, never append)."""
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1")), append_action=_OVERWRITE
    )


def openai_error(
    status: int,
    message: str,
    *,
    error_type: str,
    param: str | None = None,
    code: str | None = None,
    retry_after_s: int | None = None,
    details: str = "cognitora",
) -> ProcessingResponse:
    """Answer the client directly (the request goes nowhere) with an OpenAI-style error JSON."""
    body = json.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}}).encode()
    set_headers = [set_header(headers.CONTENT_TYPE, headers.JSON_CONTENT_TYPE)]
    if retry_after_s is not None:
        set_headers.append(set_header(headers.RETRY_AFTER, str(retry_after_s)))
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=ep.HeaderMutation(set_headers=set_headers),
            body=body,
            details=details,
        )
    )


def remove_request_headers(names: Sequence[str]) -> ProcessingResponse:
    """The request-headers answer that drops ``names`` (copies a client must not set) and carries on."""
    response = ep.ProcessingResponse(request_headers=ep.HeadersResponse())
    response.request_headers.response.header_mutation.remove_headers.extend(names)
    return response


def route_to(
    endpoints: Sequence[str], new_body: bytes | None, extra_headers: Sequence[tuple[str, str]] = ()
) -> ProcessingResponse:
    """The request-body answer that sends the request to ``endpoints[0]`` (the rest are fallbacks for retries).

    Three carriers, for every way an Envoy may be configured: dynamic metadata ``envoy.lb`` with the pick alone
    (ORIGINAL_DST ``metadata_key``) and with the ordered list (``override_host`` policy), and the pick as a header
    (ORIGINAL_DST ``use_http_header``). A rewritten body comes with its exact content-length, in the same message:
    Envoy otherwise answers 500 (content-length mismatch).
    """
    common = ep.CommonResponse()
    set_headers = common.header_mutation.set_headers
    set_headers.append(set_header(headers.DESTINATION_ENDPOINT, endpoints[0]))
    for key, value in extra_headers:
        set_headers.append(set_header(key, value))
    if new_body is not None:
        common.body_mutation.body = new_body
        set_headers.append(set_header(headers.CONTENT_LENGTH, str(len(new_body))))
    response = ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
    lb = response.dynamic_metadata.fields[headers.LB_METADATA_NAMESPACE].struct_value.fields
    lb[headers.DESTINATION_ENDPOINT].string_value = endpoints[0]
    lb[headers.DESTINATION_ENDPOINTS].string_value = ",".join(endpoints)
    return response


def route_to_cloud(
    target: str, api_key: str | None, local_fallbacks: Sequence[str], new_body: bytes
) -> ProcessingResponse:
    """The request-body answer of a cloud decision: the ``x-cognitora-cloud`` key in ``envoy.lb`` metadata, which
    the cloud route matches (the route is chosen again: ``clear_route_cache``; a client can write no metadata), the
    target's credential when the service holds it, the body with the cloud's model name and its content-length, and
    the local engines (best first) for Envoy's retry of a cloud failure before the response (the cloud route's
    aggregate cluster falls back to them)."""
    common = ep.CommonResponse(clear_route_cache=True)
    set_headers = common.header_mutation.set_headers
    if api_key is not None:
        set_headers.append(set_header(headers.AUTHORIZATION, f"Bearer {api_key}"))
    common.body_mutation.body = new_body
    set_headers.append(set_header(headers.CONTENT_LENGTH, str(len(new_body))))
    response = ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
    lb = response.dynamic_metadata.fields[headers.LB_METADATA_NAMESPACE].struct_value.fields
    lb[headers.CLOUD_TARGET].string_value = target
    if local_fallbacks:
        lb[headers.DESTINATION_ENDPOINT].string_value = local_fallbacks[0]
        lb[headers.DESTINATION_ENDPOINTS].string_value = ",".join(local_fallbacks)
    return response


def response_headers(body_mode: int, remove: Sequence[str]) -> ProcessingResponse:
    """The response-headers answer: how much of the response body this service wants, and headers to drop.

    ``mode_override`` needs ``allow_mode_override: true`` on the filter.
    """
    response = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
    if remove:
        response.response_headers.response.header_mutation.remove_headers.extend(remove)
    response.mode_override.response_body_mode = body_mode
    return response


def with_response_header(answer: ProcessingResponse, key: str, value: str) -> ProcessingResponse:
    """A copy of a response-headers ``answer`` that also sets ``key: value`` on the response to the client (the
    shared, prebuilt answers are never mutated)."""
    out = ep.ProcessingResponse()
    out.CopyFrom(answer)
    out.response_headers.response.header_mutation.set_headers.append(set_header(key, value))
    return out


def replace_response_chunk(body: bytes) -> ProcessingResponse:
    """Forward ``body`` in place of the streamed chunk Envoy sent (empty: forward nothing for now)."""
    response = ep.ProcessingResponse(response_body=ep.BodyResponse())
    mutation = response.response_body.response.body_mutation
    if body:
        mutation.body = body
    else:
        mutation.clear_body = True
    return response
