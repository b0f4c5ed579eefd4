"""Response security headers, the request size limit and the rate limits of chat, feedback and login.

Every response carries a Content-Security-Policy without inline scripts or styles (the pages
load their CSS/JS from /static and put all user text in with ``textContent`` or Jinja's
autoescaping), ``nosniff``, ``DENY`` framing and a same-origin referrer; with
``RLHF_COOKIE_SECURE`` (served over HTTPS) also HSTS. A request body over ``RLHF_MAX_REQUEST_MB``
(Flask's MAX_CONTENT_LENGTH) is refused with 413 before anything reads it; one without a
Content-Length (chunked) is read up to one byte past the limit first.

Rate limits (Flask-Limiter: the limiter in webapp/core/extensions.py, the limits are settings,
``RLHF_*_RATE_LIMIT`` in webapp/core/settings/fields.py) count per user (the signed session
cookie, or the logged-in admin) and per client address, so one user cannot flood the
model and one address cannot get around that with fresh cookies -- nor make more than
``RLHF_NEW_IDENTITIES_PER_HOUR`` fresh cookies an hour (:func:`check_new_identity_limit`, which
webapp/core/identity.py calls when it creates an anonymous identity). A breached limit answers 429
with a ``Retry-After`` header: JSON ``{"error": ...}`` for the API, a readable page elsewhere.
"""
from __future__ import annotations

import hashlib
import io
import math
import time
from typing import Callable

from flask import Flask, current_app, g, make_response, request, session
from flask_limiter import RateLimitExceeded
from flask_limiter.util import get_remote_address
from flask_login import current_user
from limits import RateLimitItemPerHour, parse_many
from werkzeug.exceptions import RequestEntityTooLarge, TooManyRequests

from webapp.core.errors import error_response
from webapp.core.extensions import limiter

CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}
HSTS = "max-age=31536000"  # a year; only with RLHF_COOKIE_SECURE (the app is served over HTTPS)


def user_key() -> str:
    """Rate-limit identity of the caller: the admin's id or a hash of the anonymous cookie id.
    Empty (the per-user limit is skipped; the per-address one still counts) for a caller
    without a session: such a request owns no conversation or message to act on."""
    if current_user.is_authenticated:
        return f"user:{current_user.get_id()}"
    anon_id = session.get("anon_id")
    if not anon_id:
        return ""
    return "anon:" + hashlib.sha256(str(anon_id).encode()).hexdigest()[:24]


def address_key() -> str:
    return "addr:" + get_remote_address()


def _setting(key: str) -> Callable[[], str]:
    return lambda: current_app.config[key]


def per_user_and_address(name: str, user_limit_key: str, address_limit_key: str, what: str) -> Callable:
    """A decorator applying two shared limits (one budget for every route that uses ``name``):
    ``user_limit_key`` per user and ``address_limit_key`` per client address."""
    by_user = limiter.shared_limit(_setting(user_limit_key), scope=f"{name}-user", key_func=user_key,
                                   error_message=f"Too many {what} from you.")
    by_address = limiter.shared_limit(_setting(address_limit_key), scope=f"{name}-address", key_func=address_key,
                                      error_message=f"Too many {what} from your network address.")

    def decorate(view: Callable) -> Callable:
        return by_user(by_address(view))
    return decorate


# posting messages, regenerate and compare share one budget; so do feedback and compare votes
chat_limit = per_user_and_address("chat", "RLHF_CHAT_RATE_LIMIT", "RLHF_CHAT_RATE_LIMIT_PER_ADDRESS", "messages")
feedback_limit = per_user_and_address("feedback", "RLHF_FEEDBACK_RATE_LIMIT", "RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS",
                                      "feedback requests")


# ---------------------------------------------------------------------------- new identities per address

def _wait_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} minutes"


def check_new_identity_limit(bucket: str | None = None, refusal: str | None = None) -> None:
    """Count one new anonymous identity against the caller's address (``RLHF_NEW_IDENTITIES_PER_HOUR``,
    in Flask-Limiter's storage like every other limit); 429 with ``Retry-After`` when the address
    has made that many within the hour. Off with the rate limits (``RLHF_RATELIMIT_ENABLED=0``)
    and with 0. Only creating an identity counts: existing cookies and signed-in users never do.
    ``bucket`` counts against something other than the client address (the /v1 API: an API key);
    ``refusal`` is then the 429's message, with ``{limit}`` and ``{wait}`` filled in."""
    cfg = current_app.config
    per_hour = int(cfg.get("RLHF_NEW_IDENTITIES_PER_HOUR") or 0)
    if per_hour <= 0 or not cfg.get("RATELIMIT_ENABLED", True) or not limiter.enabled:
        return
    item = RateLimitItemPerHour(per_hour)
    bucket = bucket or get_remote_address()
    if limiter.limiter.hit(item, "new-identity", bucket):
        return
    reset = limiter.limiter.get_window_stats(item, "new-identity", bucket).reset_time
    seconds = max(1, math.ceil(reset - time.time()))
    refusal = refusal or ("Too many new visitors from your network address in the last hour (the limit is "
                          "{limit} per hour). Sign in to your account, or try again in {wait}.")
    raise TooManyRequests(refusal.format(limit=per_hour, wait=_wait_text(seconds)), retry_after=seconds)


def check_limit(limit: str, scope: str, key: str, refusal: str) -> None:
    """Count one request against ``limit`` (e.g. "600 per minute; 10000 per day") for ``key`` in
    ``scope``, outside any route decorator (the limit depends on who is calling: an API key's own);
    429 with ``Retry-After`` and ``refusal`` plus the limit when it is used up."""
    if not current_app.config.get("RATELIMIT_ENABLED", True) or not limiter.enabled:
        return
    for item in parse_many(limit):
        if not limiter.limiter.hit(item, scope, key):
            reset = limiter.limiter.get_window_stats(item, scope, key).reset_time
            seconds = max(1, math.ceil(reset - time.time()))
            raise TooManyRequests(f"{refusal} The limit is {item}. Try again in {_wait_text(seconds)}.",
                                  retry_after=seconds)


def _retry_after_seconds() -> int | None:
    current = limiter.current_limit
    if current is None or not current.breached:
        return None
    return max(1, int(current.reset_at - time.time()))  # Flask-Limiter's own Retry-After rounding


def _size(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.4g} MiB"
    return f"{n / 1024:.4g} KiB" if n >= 1024 else f"{n} bytes"


def init_app(app: Flask) -> None:
    @app.after_request
    def security_headers(response):
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if app.config.get("SESSION_COOKIE_SECURE"):
            response.headers.setdefault("Strict-Transport-Security", HSTS)
        return response

    def refuse_large_bodies():
        limit = app.config.get("MAX_CONTENT_LENGTH")
        if limit is None:
            return
        if request.content_length is not None:
            if request.content_length > limit:
                raise RequestEntityTooLarge()
            return
        environ = request.environ
        if environ.get("wsgi.input_terminated") and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            # A body without a Content-Length (chunked; gunicorn ends the stream): werkzeug would stop
            # reading it at the limit without a word, and the cut JSON would be a 400. Read it here,
            # one byte past the limit at most, and put back what was read.
            stream, body = environ["wsgi.input"], bytearray()
            while len(body) <= limit:
                data = stream.read(limit + 1 - len(body))  # a raw stream may return less than asked
                if not data:
                    break
                body += data
            if len(body) > limit:
                g.body_too_large = True
                raise RequestEntityTooLarge()
            environ["wsgi.input"] = io.BytesIO(bytes(body))

    # first of all: before the CSRF check or a rate limit could read the body
    app.before_request_funcs.setdefault(None, []).insert(0, refuse_large_bodies)

    @app.errorhandler(413)
    def too_large(exc: RequestEntityTooLarge):
        # also raised by werkzeug while reading: a body without a Content-Length that grows past the
        # limit, or a form field over MAX_FORM_MEMORY_SIZE
        limit = app.config.get("MAX_CONTENT_LENGTH")
        if limit is not None and ((request.content_length or 0) > limit or g.get("body_too_large")):
            message = f"The request body is too large (the limit is {_size(limit)})."
        else:
            message = "The request body, or a form field in it, is too large."
        body, code = error_response(413, message, "Content Too Large")
        return make_response(body, code)

    @app.errorhandler(429)
    def too_many_requests(exc: TooManyRequests):
        message = exc.description or "Too many requests."
        if isinstance(exc, RateLimitExceeded):
            message = f"{message} The limit is {exc.limit.limit}."
        seconds = _retry_after_seconds()
        if seconds is not None:
            message += f" Try again in {seconds} second{'s' if seconds != 1 else ''}."
        elif isinstance(exc.retry_after, int):  # a limit checked outside a route's decorators (new identities)
            seconds = max(1, exc.retry_after)
        body, code = error_response(429, message, "Too Many Requests")
        response = make_response(body, code)
        if seconds is not None:  # Flask-Limiter sets it too (after_request); never answer 429 without it
            response.headers["Retry-After"] = str(seconds)
        return response
