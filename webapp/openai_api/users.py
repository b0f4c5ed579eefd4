"""Who the end user of a /v1 request is, as a user of this app.

A front end names its user in the ``user`` field (a string, or Open WebUI's ``{id, name, ...}``
object), in ``safety_identifier``, or -- only for keys marked as a front end that forwards user
headers -- in ``X-OpenWebUI-User-Id``; a request that names nobody is the key's own user. Each
maps to one stable ``users`` row, ``anon_id = "api-" + sha256(client NUL external id)[:56]``, the
same for every key of one client: A/B assignment stays hash-consistent per person across requests
and keys; no end user's id can name a key's own user (``key:<id>``, webapp/core/identity.py). A
new API user counts against the new-identity limit of its key (not of an address), so one key
cannot mint unlimited raters; its origin records the key the same way."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import request
from sqlalchemy.exc import IntegrityError

from webapp.core.extensions import db
from webapp.core.identity import address_hash, api_anon_id, api_key_anon_id
from webapp.core.models import IdentityOrigin, User
from webapp.core.security import check_new_identity_limit
from webapp.openai_api.errors import ApiError
from webapp.openai_api.params import header_text

USER_HEADER = "X-OpenWebUI-User-Id"
MAX_USER_CHARS = 256


@dataclass(frozen=True)
class KeyInfo:
    """The calling key as plain values (a streamed answer outlives the request's database session)."""

    id: int
    name: str
    client: str
    forwards_user_headers: bool
    rate_limit: str | None


def _user_value(value: Any, param: str, objects: bool = False) -> str | None:
    """An end user's id as given (None: not given); 400 for a wrong type or length."""
    if objects and isinstance(value, dict):  # Open WebUI's user object
        value, param = value.get("id"), param + ".id"
        if not isinstance(value, str):
            raise ApiError(400, f"'{param}' must be a string (the end user's id).", param)
    if value is None:
        return None
    if not isinstance(value, str):
        allowed = "a string or an object with a string 'id'" if objects else "a string"
        raise ApiError(400, f"'{param}' must be {allowed} (the end user's id).", param)
    if len(value) > MAX_USER_CHARS:
        raise ApiError(400, f"'{param}' is too long ({len(value)} characters; the limit is {MAX_USER_CHARS}).", param)
    if "\x00" in value:  # never in an id: the escape of ids that look like a key's own identity (core.identity)
        raise ApiError(400, f"'{param}' must not contain NUL characters.", param)
    return value.strip() or None


def external_user(key: KeyInfo, body: dict[str, Any], fields: tuple[str, ...] = ("user", "safety_identifier")
                  ) -> str | None:
    """The end user a request names (None: nobody, the key itself): the forwarded header for a key
    trusted to send it (ignored otherwise), else the first of ``fields`` that is given."""
    named = [_user_value(body.get(field), field, objects=field == "user") for field in fields]
    if key.forwards_user_headers:
        header = _user_value(header_text(request.headers.get(USER_HEADER), USER_HEADER), USER_HEADER)
        if header:
            return header
    return next((value for value in named if value), None)


anon_id_for = api_anon_id


_BY_ANON_ID = db.select(User).where(User.anon_id == db.bindparam("anon_id"))


def api_user(key: KeyInfo, external_id: str | None, create: bool = True) -> User | None:
    """The app user behind a request: found, or (``create``) made now -- 429 when the key made
    ``RLHF_NEW_IDENTITIES_PER_HOUR`` new users within the hour."""
    anon_id = anon_id_for(key.client, external_id) if external_id is not None else api_key_anon_id(key.client, key.id)
    user = db.session.scalars(_BY_ANON_ID, {"anon_id": anon_id}).first()
    if user is not None or not create:
        return user
    origin = address_hash(f"api-key:{key.id}")
    check_new_identity_limit(origin, "Too many new end users through this API key in the last hour (the limit is "
                                     "{limit} per hour). Try again in {wait}.")
    user = User(anon_id=anon_id)
    db.session.add(user)
    try:
        db.session.flush()
        db.session.add(IdentityOrigin(user_id=user.id, address_hash=origin))
        db.session.commit()
    except IntegrityError:  # a simultaneous first request of the same person made it first
        db.session.rollback()
        user = db.session.scalars(_BY_ANON_ID, {"anon_id": anon_id}).one()
    return user
