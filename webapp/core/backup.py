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
(rlhf.registry), so every version the snapshot names is complete on disk; a version or run
written after the snapshot is not in the backup at all. The folder is written as
``DEST.partial-*`` and renamed to ``DEST`` when complete.

Restore checks everything before it changes anything (manifest, every checksum, the schema
revision, the database kind, an empty target), then loads the database into a temporary file or
one PostgreSQL transaction, checks its row counts against the manifest, and only then moves it
and the files into place. Paths that named the old instance folder are rewritten to the new one,
and a backup from an older schema is upgraded.
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
from sqlalchemy.engine import URL, Connection, make_url

from webapp.core.extensions import db

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


def _sqlite_file(url: URL) -> Path | None:
    if url.get_backend_name() != "sqlite":
        return None
    if not url.database or url.database == ":memory:":
        raise BackupError("an in-memory SQLite database cannot be backed up or restored")
    return Path(url.database).resolve()


def _libpq(url: URL) -> tuple[str, dict[str, str]]:
    """A libpq connection string for pg_dump/pg_restore (no password on the command line: it goes
    in PGPASSWORD)."""
    env = dict(os.environ)
    if url.password:
        env["PGPASSWORD"] = str(url.password)
    plain = url.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def _pg_tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise BackupError(f"{name} is not installed (PostgreSQL's client tools; e.g. `apt-get install postgresql-client`)")


def _counts(connection: Connection) -> dict[str, int]:
    names = sorted(inspect(connection).get_table_names())
    quote = connection.dialect.identifier_preparer.quote
    return {t: int(connection.execute(text(f"SELECT COUNT(*) FROM {quote(t)}")).scalar_one()) for t in names}


def _revision(counts: dict[str, int], connection: Connection) -> str | None:
    if "alembic_version" not in counts:
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


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
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        progress("database snapshot")
        url = db.engine.url
        if url.get_backend_name() == "sqlite":
            database = _snapshot_sqlite(_sqlite_file(url), work / SQLITE_FILE)
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
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
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
            counts = _counts(connection)
            paths, runs = _named_paths(connection)
            revision = _revision(counts, connection)
    finally:
        engine.dispose()
    return {"dialect": "sqlite", "file": SQLITE_FILE, "counts": counts, "revision": revision,
            "model_paths": paths, "run_ids": runs}


def _snapshot_postgres(url: URL, target: Path) -> dict[str, Any]:
    pg_dump = _pg_tool("pg_dump")
    conninfo, env = _libpq(url)
    with db.engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection:
        with connection.begin():
            snapshot = connection.execute(text("SELECT pg_export_snapshot()")).scalar_one()
            counts = _counts(connection)
            paths, runs = _named_paths(connection)
            revision = _revision(counts, connection)
            # the transaction stays open (the snapshot with it) until pg_dump has read it
            done = subprocess.run([pg_dump, "--format=custom", "--no-owner", "--no-privileges",
                                   f"--snapshot={snapshot}", f"--file={target}", conninfo],
                                  env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise BackupError(f"pg_dump failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return {"dialect": "postgresql", "file": PGDUMP_FILE, "counts": counts, "revision": revision,
            "model_paths": paths, "run_ids": runs}


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a folder, tolerating files that vanish meanwhile (a run still writing its logs)."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part.startswith(".tmp-") for part in rel.parts):
            continue
        target = dst / rel
        try:
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif path.is_file():
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
        path = Path(raw)
        if not path.is_absolute():
            path = instance / path
        path = path.resolve()
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


# ---------------------------------------------------------------------------- restore

def read_manifest(src: Path) -> dict[str, Any]:
    """The backup's manifest after checking every file against it (raises BackupError)."""
    if not src.is_dir():
        raise BackupError(f"{src} is not a backup folder")
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except FileNotFoundError:
        raise BackupError(f"{src} is not a backup (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"the backup's {MANIFEST} is unreadable ({type(exc).__name__}): the backup is corrupt") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict) \
            or not isinstance(manifest.get("database"), dict):
        raise BackupError(f"the backup's {MANIFEST} is not a backup manifest of format {FORMAT}")
    for rel, meta in manifest["files"].items():
        path = (src / rel).resolve()
        if src.resolve() not in path.parents:
            raise BackupError(f"the manifest names a file outside the backup: {rel}")
        if not path.is_file():
            raise BackupError(f"the backup is incomplete: {rel} is missing")
        if path.stat().st_size != meta.get("bytes"):
            raise BackupError(f"the backup is damaged: {rel} has {path.stat().st_size} bytes, the manifest says "
                              f"{meta.get('bytes')} (truncated?)")
        if sha256(path) != meta.get("sha256"):
            raise BackupError(f"the backup is damaged: {rel} does not match its checksum")
    if manifest["database"].get("file") not in manifest["files"]:
        raise BackupError("the backup's manifest names no database file")
    return manifest


def _target_rows(connection: Connection) -> dict[str, int]:
    return {t: n for t, n in _counts(connection).items() if t not in NOT_DATA and n}


def check_restorable(src: Path, manifest: dict[str, Any]) -> None:
    """Refuse (BackupError) a backup this code or this instance cannot take."""
    from webapp.core.migrations import head_revision, known_revisions

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
        rows = _target_rows(connection)
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
    expected = manifest["database"].get("counts") or {}
    progress("database")
    if manifest["database"]["dialect"] == "sqlite":
        _restore_sqlite(src / manifest["database"]["file"], expected)
    else:
        _restore_postgres(src / manifest["database"]["file"], expected)
    progress("model versions and training runs")
    kept_config = _restore_files(src / FILES_DIR, instance)
    old = manifest.get("instance_dir") or str(instance)
    if old != str(instance):
        _rewrite_paths(old, str(instance))
    from webapp.core.migrations import prepare_schema, upgrade

    db.session.remove()
    before, after = upgrade()
    prepare_schema(current_app._get_current_object())
    return {"rows": sum(n for t, n in expected.items() if t not in NOT_DATA), "tables": len(expected),
            "files": len(manifest["files"]), "schema": {"backup": before, "now": after},
            "moved_from": old if old != str(instance) else None, "kept_config": kept_config}


def _check_counts(connection: Connection, expected: dict[str, int]) -> None:
    got = _counts(connection)
    wrong = {t: (got.get(t), n) for t, n in expected.items() if got.get(t) != n}
    if wrong:
        t, (have, want) = next(iter(wrong.items()))
        raise BackupError(f"the restored database does not match the manifest ({t}: {have} rows, manifest {want}); "
                          "nothing was restored")


def _restore_sqlite(snapshot: Path, expected: dict[str, int]) -> None:
    target = _sqlite_file(db.engine.url)
    assert target is not None
    tmp = target.with_name(f".{target.name}.restore-{uuid.uuid4().hex[:8]}")
    shutil.copyfile(snapshot, tmp)
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
    pg_restore = _pg_tool("pg_restore")
    url = db.engine.url
    conninfo, env = _libpq(url)
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


def _restore_files(root: Path, instance: Path) -> list[str]:
    """Copy the backup's instance files in; an instance's own config files are kept (they may
    name this instance's database). Returns the config files kept."""
    kept = []
    instance.mkdir(parents=True, exist_ok=True)
    if not root.is_dir():
        return kept
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        target = instance / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if len(rel.parts) == 1 and rel.name in ("config.py", "config.toml") and target.exists():
            kept.append(rel.name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return kept


def _replace_in(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {k: _replace_in(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_in(v, old, new) for v in value]
    return value


def _rewrite_paths(old: str, new: str) -> None:
    """Paths under the backup's instance folder, in the rows and files that hold them, now name
    the restored instance (model versions, reward models, adapters' bases)."""
    from webapp.core.models import AnswerScore, ModelVersion, TrainingRun

    for version in db.session.scalars(db.select(ModelVersion)):
        version.path = _replace_in(version.path, old, new)
        version.metrics = _replace_in(version.metrics, old, new)
        version.config = _replace_in(version.config, old, new)
        meta_file = Path(version.path) / "version.json"
        if meta_file.is_file():
            meta = json.loads(meta_file.read_text())
            meta_file.write_text(json.dumps(_replace_in(meta, old, new), indent=2))
    for run in db.session.scalars(db.select(TrainingRun)):
        run.metrics = _replace_in(run.metrics, old, new)
        run.config = _replace_in(run.config, old, new)
    for score in db.session.scalars(db.select(AnswerScore).filter(AnswerScore.reward_model.startswith(old + "/"))):
        score.reward_model = _replace_in(score.reward_model, old, new)
    db.session.commit()


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
