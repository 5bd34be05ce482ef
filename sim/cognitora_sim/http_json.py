"""The simulated engine's JSON plumbing: reading a request body, and vLLM's OpenAI-style error answer."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

__all__ = ["cut_connection", "error_response", "read_json"]


def error_response(status: int, message: str, type_: str = "BadRequestError", param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return web.json_response(body, status=status)


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise web.HTTPBadRequest(
            text=json.dumps(
                {
                    "error": {
                        "message": f"request body is not valid JSON: {exc}",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                }
            ),
            content_type="application/json",
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps(
                {
                    "error": {
                        "message": "request body must be a JSON object",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                }
            ),
            content_type="application/json",
        )
    return body


def cut_connection(request: web.Request, resp: web.StreamResponse | None = None) -> web.StreamResponse:
    """The engine went away mid-request: drop the TCP connection, as a crashed process would."""
    if request.transport is not None:
        request.transport.abort()
    return resp if resp is not None else web.Response(status=503)
