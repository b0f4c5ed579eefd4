"""Alembic's environment for ``flask --app webapp db ...`` and the app's own upgrade at start-up
(webapp.core.schema_revision). The target metadata is the app's models; SQLite runs in batch mode
(ALTERs become copy-and-move), so one revision works on SQLite and PostgreSQL alike."""
from __future__ import annotations

import logging

from alembic import context
from flask import current_app

logger = logging.getLogger("alembic.env")
config = context.config
target_db = current_app.extensions["migrate"].db


# Tables in the same database that are not the app's models: APScheduler's job store.
NOT_MODELS = {"apscheduler_jobs"}


def include_object(obj, name, type_, reflected, compare_to) -> bool:
    return not (type_ == "table" and name in NOT_MODELS)


def process_revision_directives(ctx, revision, directives) -> None:
    # `flask db migrate` with no schema change writes no empty revision
    if getattr(config.cmd_opts, "autogenerate", False) and directives[0].upgrade_ops.is_empty():
        directives[:] = []
        logger.info("No changes in schema detected.")


def run_migrations_online() -> None:
    conf_args = dict(current_app.extensions["migrate"].configure_args)
    conf_args.pop("render_as_batch", None)  # batch mode on SQLite only (below)
    conf_args.setdefault("process_revision_directives", process_revision_directives)
    conf_args.setdefault("include_object", include_object)
    connection = config.attributes.get("connection")  # given by webapp.core.schema_revision (under its lock)
    if connection is not None:
        _run(connection, conf_args)
        return
    with target_db.engine.connect() as connection:
        _run(connection, conf_args)


def _run(connection, conf_args: dict) -> None:
    if connection.dialect.name == "sqlite":
        _run_sqlite(connection, conf_args)
        return
    context.configure(connection=connection, target_metadata=target_db.metadata, render_as_batch=False, **conf_args)
    with context.begin_transaction():  # PostgreSQL: one transaction, DDL included
        context.run_migrations()
    connection.commit()


def _run_sqlite(connection, conf_args: dict) -> None:
    """All pending revisions in ONE transaction, so a revision that stops leaves the database as it
    was. SQLite's DDL is transactional, but Python's sqlite3 only opens transactions before DML
    (a CREATE TABLE before the first INSERT commits at once): its implicit transactions are
    switched off and this BEGINs and COMMITs itself. Foreign keys are off meanwhile (batch mode
    copies a table and drops the old one; enforced, the drop would cascade to every row
    referencing it), which SQLite only allows outside a transaction; they are checked before the
    commit and on again after."""
    raw = connection.connection.driver_connection
    if raw.in_transaction:
        raw.commit()  # nothing of ours: reads only
    saved = raw.isolation_level
    raw.isolation_level = None
    try:
        raw.execute("PRAGMA foreign_keys=OFF")
        if not connection.in_transaction():
            connection.begin()  # so Alembic sees an outer transaction and leaves committing to us
        raw.execute("BEGIN IMMEDIATE")
        try:
            context.configure(connection=connection, target_metadata=target_db.metadata, render_as_batch=True,
                              **conf_args)
            with context.begin_transaction():
                context.run_migrations()
            broken = raw.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"the migration would leave {len(broken)} rows whose foreign keys point nowhere, "
                                   f"e.g. {broken[0]}")
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
    finally:
        raw.execute("PRAGMA foreign_keys=ON")
        raw.isolation_level = saved


if context.is_offline_mode():
    context.configure(url=str(target_db.engine.url), target_metadata=target_db.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
