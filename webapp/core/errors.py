"""Errors as JSON ``{"error": "..."}`` for the API, readable pages elsewhere; never a bare 500
page for bad user input. A feature may claim a path prefix for an error shape of its own
(:func:`register_error_shape`: the /v1 API answers in OpenAI's shape), routing errors included."""
from __future__ import annotations

from typing import Any, Callable

from flask import Flask, current_app, jsonify, make_response, render_template_string, request
from flask_wtf.csrf import CSRFError
from sqlalchemy.exc import DataError
from werkzeug.exceptions import HTTPException

from webapp.core.extensions import db

_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{{ code }} {{ name }}</title>
<link rel="stylesheet" href="{{ url_for('static', filename='css/app.css') }}"></head>
<body class="error-page"><main><h1>{{ code }} {{ name }}</h1><p>{{ message }}</p>
<p><a href="/">Back to the chat</a></p></main></body></html>"""


def wants_json() -> bool:
    return request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json"


def register_error_shape(app: Flask, prefix: str, shape: Callable[[int, str], Any]) -> None:
    """Errors of requests under ``prefix`` are answered by ``shape(code, message)``, a ``(body,
    code)`` pair, instead of ``{"error": "..."}``."""
    app.extensions.setdefault("error_shapes", []).append((prefix, shape))


def error_response(code: int, message: str, name: str = "Error"):
    for prefix, shape in current_app.extensions.get("error_shapes", ()):
        if request.path.startswith(prefix):
            return shape(code, message)
    if wants_json():
        return jsonify(error=message), code
    return render_template_string(_PAGE, code=code, name=name, message=message), code


def init_app(app: Flask) -> None:
    @app.before_request
    def schema_not_current():
        # the database is behind (auto-upgrade off) or ahead of the code: say so instead of failing
        from webapp.core.schema_revision import schema_problem

        problem = schema_problem(app)
        if problem and request.endpoint != "static":
            body, code = error_response(503, f"Unavailable: {problem}.", "Service Unavailable")
            response = make_response(body, code)
            response.headers["Retry-After"] = "60"
            return response
        return None

    @app.errorhandler(CSRFError)
    def csrf_error(exc: CSRFError):
        return error_response(400, f"CSRF token missing or invalid: {exc.description} "
                                   "Fetch one from GET /api/session and send it in the X-CSRFToken header.",
                              "Bad Request")

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        body, code = error_response(exc.code or 500, exc.description or exc.name, exc.name)
        response = make_response(body, code)
        for key, value in exc.get_headers():  # keep Allow, Retry-After, WWW-Authenticate...
            if key.lower() != "content-type":
                response.headers[key] = value
        return response

    @app.errorhandler(DataError)
    def data_error(exc: DataError):
        # A value the database cannot take, which SQLite stores without complaint but PostgreSQL
        # refuses: a NUL character in a text (login name, search term), a number beyond the
        # column's range. The request's input is at fault, not the server.
        db.session.rollback()
        reason = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        app.logger.warning("database refused a value on %s %s: %s", request.method, request.path, reason)
        return error_response(400, "A value in the request cannot be stored or searched for "
                                   "(for example a NUL character or a number out of range).", "Bad Request")

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "Internal error; it has been logged.", "Internal Server Error")
