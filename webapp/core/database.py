"""Engine set-up (the schema and its revisions: webapp/core/schema_revision.py).

SQLite gets WAL mode (readers never block the writer), a busy timeout (a writer waits for the
lock instead of failing with "database is locked") and enforced foreign keys. Server databases
(PostgreSQL, ...) get ``pool_pre_ping``: a pooled connection is tested before it is handed out,
so the app keeps working after the database server restarts.
"""
from __future__ import annotations

from typing import Any

from flask import Flask
from sqlalchemy import event, inspect
from sqlalchemy.engine import Engine

from webapp.core.extensions import db
from webapp.core.group_commit import GroupCommitWriter


def engine_options(config: dict[str, Any]) -> dict[str, Any]:
    url = str(config["SQLALCHEMY_DATABASE_URI"])
    options: dict[str, Any] = dict(config.get("SQLALCHEMY_ENGINE_OPTIONS") or {})
    if url.startswith("sqlite"):
        connect_args = dict(options.get("connect_args") or {})
        connect_args.setdefault("timeout", config["SQLITE_BUSY_TIMEOUT_MS"] / 1000)
        connect_args.setdefault("check_same_thread", False)
        options["connect_args"] = connect_args
        if ":memory:" not in url and url.rstrip("/") not in ("sqlite:", "sqlite+pysqlite:"):
            # A connection per request thread, kept: with SQLAlchemy's default (5 + 10 overflow) the
            # server's request threads (`serve --threads`, 32 by default) kept opening and closing
            # overflow connections (each running the pragmas) or waited for one. Idle SQLite
            # connections cost next to nothing; they are only opened when needed.
            options.setdefault("pool_size", 64)
    else:
        # Survive a database server restart: test connections before handing them out.
        options.setdefault("pool_pre_ping", True)
    return options


def _sqlite_pragmas(busy_timeout_ms: int):
    def on_connect(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; fsync at checkpoints
        cur.close()
    return on_connect


def init_database(app: Flask) -> None:
    """Bind the extension and install per-connection settings (no schema changes)."""
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = engine_options(app.config)
    db.init_app(app)
    with app.app_context():
        engine: Engine = db.engine
        if engine.dialect.name == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas(app.config["SQLITE_BUSY_TIMEOUT_MS"]))
            app.extensions["sqlite_group_commit"] = GroupCommitWriter(engine)


def group_commit_writer(app: Flask) -> GroupCommitWriter | None:
    """The app's group-commit writer when its database is SQLite (see webapp/core/group_commit.py)."""
    return app.extensions.get("sqlite_group_commit")


def create_schema() -> list[str]:
    """Bring the database to the code's schema revision (idempotent): an empty one gets every
    table, an older one is upgraded. Returns the names of the tables created."""
    from webapp.core.schema_revision import VERSION_TABLE, create_current_schema, upgrade

    created = create_current_schema()
    if created:
        return created
    before = set(inspect(db.engine).get_table_names())
    upgrade()
    return sorted(set(inspect(db.engine).get_table_names()) - before - {VERSION_TABLE})
