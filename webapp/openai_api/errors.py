"""Errors of the /v1 API in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
with the status OpenAI would answer (400, 401, 404, 429 with ``Retry-After``, 503), so that OpenAI's
SDKs raise their own exception types. Routing errors (an unknown path, a wrong method), rate
limits and unexpected failures under /v1 get the same shape (webapp.core.errors' hook)."""
from __future__ import annotations

from typing import Any

from flask import Flask, jsonify, make_response
from werkzeug.exceptions import HTTPException

from webapp.core.errors import register_error_shape

PREFIX = "/v1"

# status -> (type, code) as OpenAI's API answers them
_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None), 401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None), 404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"), 413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", None), 429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None), 503: ("server_error", "service_unavailable"),
}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind, default_code = _KINDS.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    return {"error": {"message": message, "type": kind, "param": param, "code": code or default_code}}


class ApiError(HTTPException):
    """An error with OpenAI's ``param`` (the request field at fault) and ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.code = status
        self.param = param
        self.error_code = code


def api_error_response(exc: ApiError):
    """The answer to an :class:`ApiError` (the /v1 blueprint's error handler)."""
    response = make_response(jsonify(error_body(exc.code or 400, exc.description or "", exc.param, exc.error_code)),
                             exc.code)
    if exc.code == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def init_app(app: Flask) -> None:
    register_error_shape(app, PREFIX, lambda status, message: (jsonify(error_body(status, message)), status))
