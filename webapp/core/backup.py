"""Online backup and restore of an instance: ``flask --app webapp backup DEST`` / ``restore SRC``.

A backup is a folder: ``manifest.json`` (format, time, schema revision, database kind, rows per
table, every file's size and SHA-256, the instance folder it came from), the database snapshot
(``database.sqlite``, or ``database.pgdump`` from ``pg_dump -Fc``), and ``instance/`` with the
model versions and training runs the snapshot names, the instance's config files and its secret
key (so the restored instance keeps its users' cookies; a backup is as secret as the instance).

Consistency while the app serves and trains: the database is copied first as one snapshot
(SQLite's online backup API, which copies a consistent state while writers go on; on PostgreSQL a
``REPEATABLE READ`` transaction exports its snapshot, counts the rows in it, and ``pg_dump
--snapshot`` dumps exactly that). Files are copied afterwards, only those the snapshot names: a
model version is written under a temporary name and renamed into place before its row exists
(rlhf.models.registry), so every version the snapshot names is complete on disk; a version or run
written after the snapshot is not in the backup at all. The folder is written as
``DEST.partial-*`` and renamed to ``DEST`` when complete.

A backup holds every conversation, all feedback, the password and key hashes and the secret key:
its folders are 0700 and its files 0600 whatever the umask (webapp/core/private_files.py), and a
folder it creates to hold backups (``<instance>/backups``) is 0700. Only folders that hold a file
are copied, so the manifest's files describe the whole backup.

Restoring one: webapp/core/restore.py (the manifest and folder checked by webapp/core/backup_manifest.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

import click
from flask import current_app
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL, Connection

from webapp.core.extensions import db
from webapp.core.instance_paths import resolve
from webapp.core.private_files import PRIVATE_DIR, create_private, private_dir, tighten_tree, write_private

FORMAT = 1
MANIFEST = "manifest.json"
SQLITE_FILE = "database.sqlite"
PGDUMP_FILE = "database.pgdump"
FILES_DIR = "instance"
# Instance files a backup carries besides the model store and runs: the config and the cookie key.
INSTANCE_FILES = ("config.py", "config.toml", "secret_key")
# Tables whose rows are not the instance's data: the revision and APScheduler's persisted jobs
# (rewritten at every start). An instance holding rows only there is still empty.
NOT_DATA = {"alembic_version", "apscheduler_jobs"}


class BackupError(click.ClickException):
    """A backup or restore cannot go on; the message is one line and nothing was changed."""


# ---------------------------------------------------------------------------- helpers

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sqlite_file(url: URL) -> Path | None:
    if url.get_backend_name() != "sqlite":
        return None
    if not url.database or url.database == ":memory:":
        raise BackupError("an in-memory SQLite database cannot be backed up or restored")
    return Path(url.database).resolve()


def libpq_target(url: URL) -> tuple[str, dict[str, str]]:
    """A libpq connection string for pg_dump/pg_restore (no password on the command line: it goes
    in PGPASSWORD)."""
    env = dict(os.environ)
    if url.password:
        env["PGPASSWORD"] = str(url.password)
    plain = url.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def pg_tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise BackupError(f"{name} is not installed (PostgreSQL's client tools; e.g. `apt-get install postgresql-client`)")


def table_counts(connection: Connection) -> dict[str, int]:
    names = sorted(inspect(connection).get_table_names())
    quote = connection.dialect.identifier_preparer.quote
    return {t: int(connection.execute(text(f"SELECT COUNT(*) FROM {quote(t)}")).scalar_one()) for t in names}


def _revision(counts: dict[str, int], connection: Connection) -> str | None:
    if "alembic_version" not in counts:
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def data_rows(connection: Connection) -> dict[str, int]:
    """Rows per table of the instance's own data (tables holding none left out)."""
    return {t: n for t, n in table_counts(connection).items() if t not in NOT_DATA and n}


def _named_paths(connection: Connection) -> tuple[list[str], list[int]]:
    """Model version folders and training run ids the snapshot names."""
    paths = [row[0] for row in connection.execute(text("SELECT path FROM model_versions"))]
    runs = [int(row[0]) for row in connection.execute(text("SELECT id FROM training_runs"))]
    return paths, runs


# ---------------------------------------------------------------------------- backup

def backup_instance(dest: Path, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Write a backup of the current app's instance to ``dest`` (must not exist, or be empty);
    returns the manifest."""
    dest = Path(dest).expanduser().resolve()
    instance = Path(current_app.config["INSTANCE_DIR"]).resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} already exists and is not an empty folder")
    if dest == instance or instance in dest.parents and dest.parts[len(instance.parts)] in ("models", "runs"):
        raise BackupError(f"{dest} is inside the instance's model store or runs")
    private_dir(dest.parent)
    work = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
    work.mkdir(mode=PRIVATE_DIR)
    try:
        os.chmod(work, PRIVATE_DIR)  # mkdir's mode went through the umask
        progress("database snapshot")
        url = db.engine.url
        if url.get_backend_name() == "sqlite":
            database = _snapshot_sqlite(sqlite_file(url), work / SQLITE_FILE)
        elif url.get_backend_name() == "postgresql":
            database = _snapshot_postgres(url, work / PGDUMP_FILE)
        else:
            raise BackupError(f"backups support SQLite and PostgreSQL, not {url.get_backend_name()}")
        progress("model versions and training runs")
        files_root = work / FILES_DIR
        missing = _copy_instance_files(instance, files_root, database.pop("model_paths"), database.pop("run_ids"))
        files = {str(p.relative_to(work)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
                 for p in sorted(work.rglob("*")) if p.is_file()}
        manifest = {"format": FORMAT, "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "schema_revision": database.pop("revision"), "instance_dir": str(instance),
                    "database": database, "files": files, "models_missing_at_backup": missing}
        write_private(work / MANIFEST, json.dumps(manifest, indent=2))
        tighten_tree(work, exact=True)  # copied files kept their modes: every folder 0700, every file 0600
        if dest.exists():
            dest.rmdir()
        os.rename(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def _snapshot_sqlite(source: Path | None, target: Path) -> dict[str, Any]:
    assert source is not None
    if not source.is_file():
        raise BackupError(f"the database file {source} does not exist")
    create_private(target)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=60)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)  # one step: a consistent copy even while other connections write
    finally:
        src.close()
        dst.close()
    engine = create_engine(f"sqlite:///{target}")
    try:
        with engine.connect() as connection:
            counts = table_counts(connection)
            paths, runs = _named_paths(connection)
            revision = _revision(counts, connection)
    finally:
        engine.dispose()
    return {"dialect": "sqlite", "file": SQLITE_FILE, "counts": counts, "revision": revision,
            "model_paths": paths, "run_ids": runs}


def _snapshot_postgres(url: URL, target: Path) -> dict[str, Any]:
    pg_dump = pg_tool("pg_dump")
    conninfo, env = libpq_target(url)
    with db.engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection:
        with connection.begin():
            snapshot = connection.execute(text("SELECT pg_export_snapshot()")).scalar_one()
            counts = table_counts(connection)
            paths, runs = _named_paths(connection)
            revision = _revision(counts, connection)
            # the transaction stays open (the snapshot with it) until pg_dump has read it
            done = subprocess.run([pg_dump, "--format=custom", "--no-owner", "--no-privileges",
                                   f"--snapshot={snapshot}", f"--file={target}", conninfo],
                                  env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise BackupError("pg_dump failed: "
                          f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return {"dialect": "postgresql", "file": PGDUMP_FILE, "counts": counts, "revision": revision,
            "model_paths": paths, "run_ids": runs}


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a folder's files (not its empty folders), tolerating files that vanish meanwhile (a run
    still writing its logs)."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part.startswith(".tmp-") for part in rel.parts):
            continue
        target = dst / rel
        try:
            if path.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        except FileNotFoundError:
            continue


def _copy_instance_files(instance: Path, root: Path, model_paths: Iterable[str], run_ids: Iterable[int]) -> list[str]:
    """Copy what the snapshot names into ``root`` (paths relative to the instance); returns the
    model folders inside the instance that were already gone (pruned retired versions)."""
    root.mkdir()
    missing = []
    for raw in sorted(set(model_paths)):
        path = resolve(raw).resolve()
        if instance not in path.parents:
            continue  # a model outside the instance (a local directory given as the base model)
        if not path.is_dir():
            missing.append(str(path.relative_to(instance)))
            continue
        _copy_tree(path, root / path.relative_to(instance))
    for run_id in sorted(set(run_ids)):
        folder = instance / "runs" / f"run-{run_id}"
        if folder.is_dir():
            _copy_tree(folder, root / "runs" / folder.name)
    for name in INSTANCE_FILES:
        if (instance / name).is_file():
            shutil.copy2(instance / name, root / name)
    return missing


# ---------------------------------------------------------------------------- scheduled backups

def scheduled_backup() -> dict[str, Any]:
    """The scheduler's backup job: a new backup in ``RLHF_BACKUP_DIR`` (default
    ``<instance>/backups``) named by time, then the oldest beyond ``RLHF_BACKUP_KEEP`` deleted."""
    cfg = current_app.config
    folder = Path(cfg["RLHF_BACKUP_DIR"] or Path(cfg["INSTANCE_DIR"]) / "backups")
    name = datetime.now(timezone.utc).strftime("backup-%Y%m%dT%H%M%S-%fZ")
    manifest = backup_instance(folder / name)
    done = sorted(p for p in folder.glob("backup-*") if (p / MANIFEST).is_file())
    removed = [p.name for p in done[: max(0, len(done) - int(cfg["RLHF_BACKUP_KEEP"]))]]
    for old in removed:
        shutil.rmtree(folder / old, ignore_errors=True)
    rows = sum(n for t, n in manifest["database"]["counts"].items() if t not in NOT_DATA)
    return {"action": "backup", "path": str(folder / name), "rows": rows, "removed": removed}


# ---------------------------------------------------------------------------- commands

@click.command("backup")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
def backup_command(dest: Path) -> None:
    """Write a consistent backup of the instance (database, model versions, training runs, config,
    secret key) to the folder DEST, while the app keeps serving and training."""
    manifest = backup_instance(dest, progress=lambda m: click.echo(f"  {m}...", err=True))
    counts = manifest["database"]["counts"]
    rows = sum(n for t, n in counts.items() if t not in NOT_DATA)
    click.echo(f"Backup written to {Path(dest).resolve()}: {rows} rows in {len(counts)} tables "
               f"({counts.get('feedback', 0)} feedback), {len(manifest['files'])} files, schema "
               f"{manifest['schema_revision']}")
    if manifest["models_missing_at_backup"]:
        click.echo(f"  model folders already gone from the instance (pruned): "
                   f"{', '.join(manifest['models_missing_at_backup'])}", err=True)
