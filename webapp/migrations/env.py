"""Alembic's environment for ``flask --app webapp db ...`` and the app's own upgrade at start-up
(webapp.core.migrations). The target metadata is the app's models; SQLite runs in batch mode
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
    connection = config.attributes.get("connection")  # given by webapp.core.migrations (under its lock)
    if connection is not None:
        _run(connection, conf_args)
        return
    with target_db.engine.connect() as connection:
        _run(connection, conf_args)


def _run(connection, conf_args: dict) -> None:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # Batch mode copies a table and drops the old one: with foreign keys enforced, that drop
        # would cascade to every row referencing it (feedback, scores...). Off for the migration
        # (only outside a transaction), checked afterwards, on again.
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
    try:
        context.configure(connection=connection, target_metadata=target_db.metadata, render_as_batch=sqlite,
                          **conf_args)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()  # the PRAGMA above began the connection's transaction: alembic leaves it open
    finally:
        if sqlite:
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            if broken:
                raise RuntimeError(f"the migration left {len(broken)} rows whose foreign keys point nowhere, "
                                   f"e.g. {broken[0]}")


if context.is_offline_mode():
    context.configure(url=str(target_db.engine.url), target_metadata=target_db.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
