"""``flask --app webapp copy-database URL``: copy every row of the instance's database into another
database (typically SQLite -> PostgreSQL), keeping every id, so feedback, conversations,
experiments and versions arrive exactly as they were.

The target gets the code's schema through the migrations first and must be empty. Rows go in
table by table in foreign-key order, each table in id order (a message's parent, a version's
parent come before it), in one transaction: a failure leaves the target as it was. The one
foreign-key cycle (``model_versions.training_run_id`` <-> ``training_runs.version_id``) is
closed after both tables are in. PostgreSQL's id sequences are moved past the copied ids.

An SQLite target holds everything the instance does: its file (and SQLite's side files, which
take its mode) is created 0600 whatever the umask, and an existing one is made owner-only
(webapp/core/private_files.py).
"""
from __future__ import annotations

from typing import Callable

import click
from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.engine import make_url

from webapp.core.extensions import db
from webapp.core.private_files import create_private, sqlite_files, sqlite_path, tighten

_CYCLE = ("model_versions", "training_run_id")


def copy_database(target_url: str, progress: Callable[[str, int], None] = lambda _t, _n: None) -> dict[str, int]:
    """Copy the current app's rows into ``target_url``; returns rows per table."""
    from alembic import command

    from webapp.core import models  # noqa: F401 - the tables
    from webapp.core.backup import NOT_DATA, BackupError, data_rows
    from webapp.core.schema_revision import alembic_config

    try:
        url = make_url(target_url)
    except Exception:
        raise BackupError(f"{target_url!r} is not a database URL (e.g. postgresql+psycopg://user:pw@host/db)") from None
    if url.render_as_string(hide_password=False) == db.engine.url.render_as_string(hide_password=False):
        raise BackupError("the target is this instance's own database")
    target_file = sqlite_path(url.render_as_string(hide_password=False))
    if target_file is not None and target_file.parent.is_dir():
        create_private(target_file)
        for path in sqlite_files(target_file):
            tighten(path)
    engine = create_engine(url)
    copied: dict[str, int] = {}
    try:
        with engine.connect() as target:
            rows = data_rows(target)
            if rows:
                raise BackupError(f"the target database is not empty ({', '.join(sorted(rows))[:200]})")
            command.upgrade(alembic_config(target), "head")
            target.commit()
        with db.engine.connect() as source, engine.begin() as target:
            closing = []
            for table in db.metadata.sorted_tables:
                if table.name in NOT_DATA:
                    continue
                order = [c for c in table.primary_key.columns]
                result = source.execute(select(table).order_by(*order))
                batch, n = [], 0
                for row in result.mappings():
                    values = dict(row)
                    if (table.name, _CYCLE[1]) == _CYCLE and values.get(_CYCLE[1]) is not None:
                        closing.append((values["id"], values[_CYCLE[1]]))
                        values[_CYCLE[1]] = None
                    batch.append(values)
                    if len(batch) >= 1000:
                        target.execute(table.insert(), batch)
                        n += len(batch)
                        batch = []
                if batch:
                    target.execute(table.insert(), batch)
                    n += len(batch)
                copied[table.name] = n
                progress(table.name, n)
            versions = db.metadata.tables[_CYCLE[0]]
            for version_id, run_id in closing:
                target.execute(update(versions).where(versions.c.id == version_id).values({_CYCLE[1]: run_id}))
            if target.dialect.name == "postgresql":
                for table in db.metadata.sorted_tables:
                    if "id" in table.c and table.c.id.autoincrement and table.c.id.primary_key:
                        top = target.execute(select(func.max(table.c.id))).scalar()
                        if top is not None:
                            target.execute(text("SELECT setval(pg_get_serial_sequence(:t, 'id'), :v)"),
                                           {"t": table.name, "v": top})
    finally:
        engine.dispose()
    return copied


@click.command("copy-database")
@click.argument("target_url")
def copy_database_command(target_url: str) -> None:
    """Copy every row of this instance's database into the empty database TARGET_URL (e.g. SQLite
    to PostgreSQL), keeping ids. Stop the app first; then point DATABASE_URL at the target."""
    copied = copy_database(target_url, progress=lambda t, n: click.echo(f"  {t}: {n} rows", err=True))
    click.echo(f"Copied {sum(copied.values())} rows in {len(copied)} tables ({copied.get('feedback', 0)} feedback) "
               f"to {make_url(target_url).render_as_string(hide_password=True)}")
