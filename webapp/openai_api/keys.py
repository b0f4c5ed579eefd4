"""API keys of the /v1 API: created by an admin (CLI or dashboard) and shown once, stored as their
SHA-256 only (the key is a long random string, so a fast hash is enough), sent as
``Authorization: Bearer``, and looked up in the database on every request, so a revoked key is
refused at once by every process. A key is never logged and never shown again."""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

import click

from webapp.core.audit import audit
from webapp.core.extensions import db
from webapp.core.models import ApiKey, User, iso, utcnow
from webapp.core.settings.fields import rate_limit_problem

KEY_PREFIX = "rlhf-"
SHOWN_PREFIX_CHARS = 12  # "rlhf-" and 7 random characters: enough to tell keys apart in a list
MAX_NAME_CHARS = 80


class KeyProblem(ValueError):
    """A key cannot be created or found as asked; the message says why."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _checked_name(value: str, what: str) -> str:
    """A name as typed, without surrounding spaces: 1-80 printable characters."""
    value = value.strip() if isinstance(value, str) else ""
    if not value or len(value) > MAX_NAME_CHARS or not value.isprintable():
        raise KeyProblem(f"{what} must be 1-{MAX_NAME_CHARS} printable characters.")
    return value


def _checked_rate_limit(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 100:
        raise KeyProblem("The rate limit must be text such as '600 per minute' (at most 100 characters).")
    problem = rate_limit_problem(value)  # the settings' own check: '1 per 0 second' is refused, not read as 1/s
    if problem:
        raise KeyProblem(f"{value!r} {problem}.")
    return value


def create_api_key(name: str, client: str | None = None, forwards_user_headers: bool = False,
                   rate_limit: str | None = None, created_by: int | None = None) -> tuple[ApiKey, str]:
    """A new key: its row (committed) and the key itself, which exists nowhere else afterwards.
    ``client`` (default: ``name``) groups keys whose end users are the same people."""
    name = _checked_name(name, "The key's name")
    client = _checked_name(client if client is not None else name, "The client")
    rate_limit = _checked_rate_limit(rate_limit)
    if db.session.scalars(db.select(ApiKey.id).filter_by(name=name)).first() is not None:
        raise KeyProblem(f"An API key named {name!r} exists already (names are kept after revoking).")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(name=name, client=client, prefix=key[:SHOWN_PREFIX_CHARS], key_hash=hash_key(key),
                 forwards_user_headers=bool(forwards_user_headers), rate_limit=rate_limit, created_by=created_by,
                 request_count=0)
    db.session.add(row)
    db.session.flush()
    audit("api_key_create", name, actor="cli", key_id=row.id, client=client, prefix=row.prefix,
          forwards_user_headers=row.forwards_user_headers, rate_limit=rate_limit)
    db.session.commit()
    return row, key


def revoke_api_key(row: ApiKey) -> bool:
    """Revoke a key (at once, for every process); False when it was revoked already."""
    if row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    audit("api_key_revoke", row.name, actor="cli", key_id=row.id, client=row.client, prefix=row.prefix)
    db.session.commit()
    return True


def key_named(name: str) -> ApiKey:
    row = db.session.scalars(db.select(ApiKey).filter_by(name=name)).first()
    if row is None:
        raise KeyProblem(f"There is no API key named {name!r}.")
    return row


_BY_HASH = db.select(ApiKey).where(ApiKey.key_hash == db.bindparam("key_hash"))


def find_key(key: str) -> ApiKey | None:
    """The key's row (revoked or not), or None for a key this instance never made."""
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    return db.session.scalars(_BY_HASH, {"key_hash": hash_key(key)}).first()


def record_use(key_id: int) -> None:
    """Count an answered request of the key (committed with the caller's transaction)."""
    db.session.execute(db.update(ApiKey).where(ApiKey.id == key_id)
                       .values(request_count=ApiKey.request_count + 1, last_used_at=utcnow()))


def key_dict(row: ApiKey) -> dict[str, Any]:
    """A key as the dashboard and the admin API list it (never the key, nor its hash)."""
    creator = db.session.get(User, row.created_by) if row.created_by else None
    return {"id": row.id, "name": row.name, "client": row.client, "prefix": row.prefix,
            "forwards_user_headers": row.forwards_user_headers, "rate_limit": row.rate_limit,
            "created_at": iso(row.created_at), "created_by": creator.username if creator else None,
            "last_used_at": iso(row.last_used_at), "request_count": row.request_count,
            "revoked_at": iso(row.revoked_at), "revoked": row.revoked_at is not None}


def all_keys() -> list[ApiKey]:
    return list(db.session.scalars(db.select(ApiKey).order_by(ApiKey.revoked_at.isnot(None), ApiKey.id.desc())))


# ---------------------------------------------------------------------------- CLI

@click.command("create-api-key")
@click.argument("name")
@click.option("--client", default=None, help="The front end the key belongs to (default: NAME). Keys of one client "
                                             "share their end users (and so their A/B arms).")
@click.option("--forwards-user-headers", is_flag=True,
              help="Trust the X-OpenWebUI-User-Id header from this key (a front end that sets it itself).")
@click.option("--rate-limit", default=None,
              help="Requests allowed, e.g. '600 per minute' (default: RLHF_API_RATE_LIMIT).")
def create_api_key_command(name: str, client: str | None, forwards_user_headers: bool, rate_limit: str | None) -> None:
    """Create an API key for the /v1 API and print it (only the key, on stdout: it is shown once)."""
    try:
        row, key = create_api_key(name, client, forwards_user_headers, rate_limit)
    except KeyProblem as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"API key {row.name!r} (client {row.client!r}) created. It is shown only this once: store it now.",
               err=True)
    click.echo(key)


@click.command("revoke-api-key")
@click.argument("name")
def revoke_api_key_command(name: str) -> None:
    """Revoke an API key: refused from the next request on, by every process."""
    try:
        row = key_named(name)
    except KeyProblem as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Revoked API key {name!r}." if revoke_api_key(row) else f"API key {name!r} was revoked already.")


@click.command("list-api-keys")
def list_api_keys_command() -> None:
    """List the API keys: name, client, prefix, created, last used, requests, status (never the keys)."""
    rows = all_keys()
    if not rows:
        click.echo("No API keys yet (flask --app webapp create-api-key NAME).")
        return
    header = ("name", "client", "prefix", "created", "last used", "requests", "status")
    lines = [header] + [(r.name, r.client, r.prefix + "...", iso(r.created_at) or "-", iso(r.last_used_at) or "never",
                         str(r.request_count), "revoked " + iso(r.revoked_at) if r.revoked_at else "active")
                        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


COMMANDS = (create_api_key_command, revoke_api_key_command, list_api_keys_command)
