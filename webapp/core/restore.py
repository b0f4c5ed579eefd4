"""``flask --app webapp restore SRC``: a backup (webapp/core/backup.py) into a new instance.

Restore checks everything before it changes anything (every field of the manifest; that the
folder holds exactly the files it lists, no link, each with its checksum: webapp/core/backup_manifest.py;
the schema revision, the database kind, an empty target), then loads the database into a
temporary file or one PostgreSQL transaction, checks its row counts against the manifest, and only
then moves it and the files into place. Only the files the manifest lists are installed, each
0600 in folders 0700 (webapp/core/private_files.py). Rows store paths relative to the instance
folder (webapp.core.instance_paths), so they need no change; a backup whose rows still hold
absolute paths into its own instance folder has those made relative, and a backup from an older
schema is upgraded.
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Callable

import click
from flask import current_app
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from webapp.core.backup import (
    FILES_DIR,
    NOT_DATA,
    BackupError,
    data_rows,
    libpq_target,
    pg_tool,
    sqlite_file,
    table_counts,
)
from webapp.core.backup_manifest import read_manifest
from webapp.core.extensions import db
from webapp.core.private_files import copy_private, private_dir, private_dirs


def check_restorable(src: Path, manifest: dict[str, Any]) -> None:
    """Refuse (BackupError) a backup this code or this instance cannot take."""
    from webapp.core.schema_revision import head_revision, known_revisions

    revision = manifest.get("schema_revision")
    if revision and revision not in known_revisions():
        raise BackupError(f"the backup's schema revision {revision} is newer than this code (newest: "
                          f"{head_revision()}): restore it with the version that made it")
    dialect = db.engine.url.get_backend_name()
    if manifest["database"].get("dialect") != dialect:
        raise BackupError(f"the backup holds a {manifest['database'].get('dialect')} database and this instance uses "
                          f"{dialect}: restore it into a {manifest['database'].get('dialect')} instance, then copy "
                          "(docs: moving to PostgreSQL)")
    with db.engine.connect() as connection:
        rows = data_rows(connection)
    if rows:
        listed = ", ".join(f"{n} in {t}" for t, n in sorted(rows.items())[:4])
        raise BackupError(f"the instance is not empty ({listed}): restore into a new instance "
                          "(RLHF_INSTANCE_DIR naming an empty folder, and an empty database)")
    instance = Path(current_app.config["INSTANCE_DIR"])
    for folder in ("models", "runs"):
        if (instance / folder).is_dir() and any((instance / folder).iterdir()):
            raise BackupError(f"the instance is not empty ({instance / folder} has files): restore into a new instance")


def restore_instance(src: Path, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Restore the backup at ``src`` into the current app's (empty) instance; returns a summary."""
    src = Path(src).expanduser().resolve()
    progress("checking the backup")
    manifest = read_manifest(src)
    check_restorable(src, manifest)
    instance = Path(current_app.config["INSTANCE_DIR"]).resolve()
    expected = manifest["database"]["counts"]
    progress("database")
    if manifest["database"]["dialect"] == "sqlite":
        _restore_sqlite(src / manifest["database"]["file"], expected)
    else:
        _restore_postgres(src / manifest["database"]["file"], expected)
    progress("model versions and training runs")
    kept_config = _restore_files(src, manifest["files"], instance)
    old = manifest["instance_dir"]
    _relative_paths(old)
    from webapp.core.schema_revision import prepare_schema, upgrade

    db.session.remove()
    before, after = upgrade()
    prepare_schema(current_app._get_current_object())
    return {"rows": sum(n for t, n in expected.items() if t not in NOT_DATA), "tables": len(expected),
            "files": len(manifest["files"]), "schema": {"backup": before, "now": after},
            "moved_from": old if old != str(instance) else None, "kept_config": kept_config}


def _check_counts(connection: Connection, expected: dict[str, int]) -> None:
    got = table_counts(connection)
    wrong = {t: (got.get(t), n) for t, n in expected.items() if got.get(t) != n}
    if wrong:
        t, (have, want) = next(iter(wrong.items()))
        raise BackupError(f"the restored database does not match the manifest ({t}: {have} rows, manifest {want}); "
                          "nothing was restored")


def _restore_sqlite(snapshot: Path, expected: dict[str, int]) -> None:
    target = sqlite_file(db.engine.url)
    assert target is not None
    tmp = target.with_name(f".{target.name}.restore-{uuid.uuid4().hex[:8]}")
    copy_private(snapshot, tmp)  # 0600, as the database it becomes
    try:
        conn = sqlite3.connect(tmp)
        try:
            ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise BackupError(f"the backup's database is not a valid SQLite database ({exc})") from None
        finally:
            conn.close()
        if ok != "ok":
            raise BackupError(f"the backup's database fails SQLite's integrity check: {ok}")
        engine = create_engine(f"sqlite:///{tmp}")
        try:
            with engine.connect() as connection:
                _check_counts(connection, expected)
        finally:
            engine.dispose()
        db.session.remove()
        db.engine.dispose()  # this process's connections to the empty database it replaces
        for suffix in ("-wal", "-shm", "-journal"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _restore_postgres(dump: Path, expected: dict[str, int]) -> None:
    pg_restore = pg_tool("pg_restore")
    url = db.engine.url
    conninfo, env = libpq_target(url)
    db.session.remove()
    db.engine.dispose()
    # one transaction: the empty tables the app created are replaced, or nothing changes
    done = subprocess.run([pg_restore, "--clean", "--if-exists", "--no-owner", "--no-privileges",
                           "--single-transaction", "--exit-on-error", f"--dbname={conninfo}", str(dump)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise BackupError(f"pg_restore failed, nothing was restored: {lines[-1] if lines else done.returncode}")
    with db.engine.connect() as connection:
        _check_counts(connection, expected)


def _restore_files(src: Path, files: dict[str, Any], instance: Path) -> list[str]:
    """Copy the instance files the manifest lists (and nothing else) in, each 0600 in folders 0700;
    an instance's own config files are kept (they may name this instance's database). Returns the
    config files kept."""
    kept = []
    private_dir(instance)
    for rel in sorted(files):
        parts = PurePosixPath(rel).parts
        if parts[0] != FILES_DIR:
            continue  # the database snapshot, restored already
        target = instance.joinpath(*parts[1:])
        if len(parts) == 2 and parts[1] in ("config.py", "config.toml") and target.exists():
            kept.append(parts[1])
            continue
        private_dirs(target.parent, instance)
        copy_private(src / rel, target)
    return kept


def _relative_in(value: Any, old: str) -> Any:
    """``value`` (JSON-like) with every path under the folder ``old`` made relative to it."""
    if isinstance(value, str):
        return value[len(old) + 1:] if value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {k: _relative_in(v, old) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative_in(v, old) for v in value]
    return value


def _relative_paths(old: str) -> None:
    """Rows of a backup written before paths were stored relative: the absolute paths into its
    instance folder ``old`` (model versions, reward models, the scores cached per reward model)
    become relative, as this code writes them. Such a path could otherwise still name the old
    instance's files, where that folder exists on this host."""
    from webapp.core.models import AnswerScore, ModelVersion, TrainingRun

    old = old.rstrip("/")
    for version in db.session.scalars(db.select(ModelVersion)):
        version.path = _relative_in(version.path, old)
        version.metrics = _relative_in(version.metrics, old)
    for run in db.session.scalars(db.select(TrainingRun)):
        run.metrics = _relative_in(run.metrics, old)
    for score in db.session.scalars(db.select(AnswerScore).filter(AnswerScore.reward_model.startswith(old + "/"))):
        score.reward_model = _relative_in(score.reward_model, old)
    db.session.commit()


@click.command("restore")
@click.argument("src", type=click.Path(file_okay=False, path_type=Path))
def restore_command(src: Path) -> None:
    """Restore the backup folder SRC into this instance (RLHF_INSTANCE_DIR), which must be new:
    empty, or holding only the empty database the app makes on start. Stop the app first."""
    summary = restore_instance(src, progress=lambda m: click.echo(f"  {m}...", err=True))
    click.echo(f"Restored {summary['rows']} rows in {summary['tables']} tables and {summary['files']} files into "
               f"{current_app.config['INSTANCE_DIR']}"
               + (f" (paths moved from {summary['moved_from']})" if summary["moved_from"] else ""))
    if summary["kept_config"]:
        click.echo(f"  kept this instance's own {', '.join(summary['kept_config'])} (the backup's copy is in "
                   f"{Path(src) / FILES_DIR})", err=True)
