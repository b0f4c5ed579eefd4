"""The database schema's version: Alembic migrations (through Flask-Migrate) in webapp/migrations/.

Every schema change is a revision there; ``flask --app webapp db upgrade`` applies them (the
Flask-Migrate commands: ``db current``, ``db history``, ``db downgrade``, ``db migrate`` to write
a new revision from the models). At start-up :func:`prepare_schema` brings the database to the
code's revision:

- an empty database gets the whole schema at once (``create_all``, then stamped with the head
  revision: the same tables, since a test keeps the models and the head in step);
- a database behind the code (including one made by ``create_all`` before migrations existed,
  which has tables and no revision) is upgraded when ``RLHF_AUTO_UPGRADE`` is on (the default, for
  the single-process ``serve`` and the quickstart), under a lock so that processes starting
  together upgrade once;
- otherwise (auto-upgrade off, as deployments with several processes on one database set it, or a
  database newer than the code) the app starts but refuses to work on it: requests get a 503 and
  commands stop, each with the one-line reason and the command that fixes it.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import click
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from flask import Flask, current_app
from flask_migrate import Migrate
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from webapp.core.extensions import db

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"
VERSION_TABLE = "alembic_version"
# Tables that only the app creates: a database holding one of them is the app's (an empty one is new).
APP_TABLE = "users"
_PG_LOCK_KEY = 0x726C6866  # "rlhf": the advisory lock one upgrade holds on PostgreSQL

log = logging.getLogger(__name__)
migrate = Migrate()


class SchemaError(click.ClickException):
    """The database's schema is not the code's and will not be changed automatically, or an
    upgrade stopped; a ``flask`` command ends with this one line."""


def init_migrations(app: Flask) -> None:
    """Register Flask-Migrate (the ``flask db`` commands) on ``app``."""
    migrate.init_app(app, db, directory=str(MIGRATIONS_DIR), compare_type=True)


@lru_cache(maxsize=4)
def _script(directory: str) -> ScriptDirectory:
    return ScriptDirectory.from_config(_bare_config(directory))


def _bare_config(directory: str) -> Config:
    cfg = Config(str(Path(directory) / "alembic.ini"))
    cfg.set_main_option("script_location", directory)
    return cfg


def head_revision(directory: str | Path = MIGRATIONS_DIR) -> str:
    """The newest revision the code knows."""
    head = _script(str(directory)).get_current_head()
    assert head is not None, "webapp/migrations has no revision"
    return head


def known_revisions(directory: str | Path = MIGRATIONS_DIR) -> set[str]:
    return {rev.revision for rev in _script(str(directory)).walk_revisions()}


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands: its revision (None: none recorded), the code's head revision,
    and whether it holds the app's tables at all."""

    revision: str | None
    head: str
    has_tables: bool
    known: bool

    @property
    def status(self) -> str:
        """``empty``, ``current``, ``behind`` (including a database from before migrations) or
        ``ahead`` (a revision this code does not know: written by newer code)."""
        if self.revision is None:
            return "behind" if self.has_tables else "empty"
        if self.revision == self.head:
            return "current"
        return "behind" if self.known else "ahead"

    def problem(self) -> str | None:
        """The one-line reason the app will not use the database, or None."""
        if self.status == "ahead":
            return (f"the database schema is at revision {self.revision}, which this code does not know (newer "
                    f"code wrote it; this code's newest is {self.head}): run the newer code, or restore a backup "
                    "made by this version")
        if self.status == "behind":
            at = self.revision or "none (made before migrations)"
            return (f"the database schema is behind the code (revision {at}, the code needs {self.head}): run "
                    "`flask --app webapp db upgrade` once (RLHF_AUTO_UPGRADE=0 is set, as it should be where "
                    "several processes share the database)")
        return None


def schema_state(connection: Connection, directory: str | Path = MIGRATIONS_DIR) -> SchemaState:
    tables = set(inspect(connection).get_table_names())
    revision = MigrationContext.configure(connection).get_current_revision() if VERSION_TABLE in tables else None
    return SchemaState(revision=revision, head=head_revision(directory), has_tables=APP_TABLE in tables,
                       known=revision in known_revisions(directory) if revision else True)


def alembic_config(connection: Connection | None = None, directory: str | Path | None = None) -> Config:
    """Flask-Migrate's Alembic config for the current app, on ``connection`` when given (env.py
    uses it instead of opening its own)."""
    cfg = current_app.extensions["migrate"].migrate.get_config(str(directory or MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@contextmanager
def migration_lock() -> Iterator[Connection]:
    """A connection holding the instance's migration lock: a PostgreSQL advisory lock on a server
    database, an flock in the instance folder for SQLite (both die with the process)."""
    from webapp.core import locks

    with db.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            connection.commit()
            try:
                yield connection
            finally:
                connection.rollback()
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                connection.commit()
        else:
            with locks.held(locks.lock_path("migrate")):
                yield connection


def upgrade(revision: str = "head", directory: str | Path | None = None) -> tuple[str | None, str]:
    """Upgrade the current app's database to ``revision`` under the migration lock; returns
    (revision before, revision after)."""
    with migration_lock() as connection:
        before = schema_state(connection, directory or MIGRATIONS_DIR).revision
        command.upgrade(alembic_config(connection, directory), revision)
        connection.commit()
        after = schema_state(connection, directory or MIGRATIONS_DIR).revision
    return before, after or ""


def create_current_schema() -> list[str]:
    """An empty database: every table at once, stamped with the head revision. Returns the tables
    created (none when another process got there first)."""
    from webapp.core import models  # noqa: F401 - registers the tables on the metadata

    with migration_lock() as connection:
        if schema_state(connection).status != "empty":
            return []
        before = set(inspect(connection).get_table_names())
        db.metadata.create_all(connection)
        command.stamp(alembic_config(connection), "head")
        connection.commit()
        return sorted(set(inspect(connection).get_table_names()) - before - {VERSION_TABLE})


def prepare_schema(app: Flask) -> SchemaState:
    """Bring the database to the code's revision where that is allowed (see the module
    docstring); record the reason it is not in ``app.extensions["schema_problem"]``."""
    with app.app_context():
        with db.engine.connect() as connection:
            state = schema_state(connection)
        if state.status == "empty":
            create_current_schema()
        elif state.status == "behind" and app.config["RLHF_AUTO_UPGRADE"]:
            try:
                before, after = upgrade()
            except Exception as exc:
                raise SchemaError(f"upgrading the database schema from {state.revision or 'the create_all schema'} "
                                  f"to {state.head} stopped: {exc}") from exc
            if before != after:
                log.warning("Upgraded the database schema from %s to %s", before or "the create_all schema", after)
        with db.engine.connect() as connection:
            state = schema_state(connection)
    app.extensions["schema_state"] = state
    app.extensions["schema_problem"] = state.problem()
    return state


def schema_problem(app: Flask | None = None) -> str | None:
    return (app or current_app).extensions.get("schema_problem")


def require_current_schema(app: Flask | None = None) -> None:
    """Raise SchemaError when the app will not use its database (commands call this first)."""
    problem = schema_problem(app)
    if problem:
        raise SchemaError(problem)
