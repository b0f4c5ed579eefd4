"""A backup folder and its manifest, checked before a restore (webapp/core/restore.py) changes
anything; every refusal is one line (BackupError).

The manifest is the whole truth about a backup. Every field is checked for its type and value
(:func:`check_fields`): a field of the wrong kind must stop the restore before it starts, not
half-way through it. The folder must hold exactly what the manifest lists (:func:`check_contents`):
the listed files, the folders above them and ``manifest.json``; no other file or folder, no
symbolic link anywhere (followed, a link copies a file from outside the backup into the
instance), nothing that is not a plain file or folder. Each listed file must sit where a backup
puts files (the database snapshot at the top; the instance's files under ``instance/``: its config
files and secret key at the top of it, everything else in a subfolder, so never a file the
instance itself keeps there, such as its database) and have its size and SHA-256. A backup holding
a secret key that was published is refused too: no instance may use one.
"""
from __future__ import annotations

import json
import os
import re
import stat
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from webapp.core.backup import (
    FILES_DIR,
    FORMAT,
    INSTANCE_FILES,
    MANIFEST,
    PGDUMP_FILE,
    SQLITE_FILE,
    BackupError,
    sha256,
)
from webapp.core.settings.secret_key import is_published

FIELDS = ("format", "created_at", "schema_revision", "instance_dir", "database", "files", "models_missing_at_backup")
DATABASE_FIELDS = ("dialect", "file", "counts")
FILE_FIELDS = ("bytes", "sha256")
DATABASE_FILES = {"sqlite": SQLITE_FILE, "postgresql": PGDUMP_FILE}
REVISION = re.compile(r"[0-9A-Za-z_]{1,64}")  # Alembic revision ids (webapp/migrations/versions/)
TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
SHA256 = re.compile(r"[0-9a-f]{64}")


def read_manifest(src: Path) -> dict[str, Any]:
    """The backup's manifest, after checking every field and every file against it."""
    if not src.is_dir():
        raise BackupError(f"{src} is not a backup folder")
    try:
        info = os.lstat(src / MANIFEST)
    except FileNotFoundError:
        raise BackupError(f"{src} is not a backup (no {MANIFEST})") from None
    if stat.S_ISLNK(info.st_mode):
        raise BackupError(f"the backup holds a symbolic link: {MANIFEST} (a backup holds plain files and folders only)")
    if not stat.S_ISREG(info.st_mode):
        raise BackupError(f"the backup's {MANIFEST} is not a plain file")
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"the backup's {MANIFEST} is unreadable ({type(exc).__name__}): "
                          "the backup is corrupt") from None
    check_fields(manifest)
    check_contents(src, manifest)
    return manifest


# ---------------------------------------------------------------------------- the fields

def _malformed(what: str) -> BackupError:
    return BackupError(f"the backup's {MANIFEST} is malformed: {what}")


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, list, dict, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _relative(path: Any) -> bool:
    """A plain relative path inside the backup: no absolute path, no empty, ``.`` or ``..`` part."""
    return (isinstance(path, str) and bool(path) and "\0" not in path and not path.startswith("/")
            and all(part not in ("", ".", "..") for part in path.split("/")))


def check_fields(manifest: Any) -> None:
    """Every field of the manifest, its type and its value (BackupError naming the first bad one)."""
    if not isinstance(manifest, dict) or not _whole(manifest.get("format")) or manifest["format"] != FORMAT:
        raise BackupError(f"the backup's {MANIFEST} is not a backup manifest of format {FORMAT}")
    for field in FIELDS:
        if field not in manifest:
            raise _malformed(f"the field {field} is missing")
    for field in manifest:
        if field not in FIELDS:
            raise _malformed(f"{_shown(field)} is not a field of a backup manifest")
    created = manifest["created_at"]
    try:
        is_time = isinstance(created, str) and datetime.fromisoformat(created) is not None
    except ValueError:
        is_time = False
    if not is_time:
        raise _malformed(f"created_at must be a time (ISO 8601), not {_shown(created)}")
    revision = manifest["schema_revision"]
    if revision is not None and not (isinstance(revision, str) and REVISION.fullmatch(revision)):
        raise _malformed(f"schema_revision must be a revision id or null, not {_shown(revision)}")
    folder = manifest["instance_dir"]
    if not (isinstance(folder, str) and folder.startswith("/") and folder != "/" and "\0" not in folder
            and os.path.normpath(folder) == folder):
        raise _malformed(f"instance_dir must be the absolute path of a folder, not {_shown(folder)}")
    missing = manifest["models_missing_at_backup"]
    if not isinstance(missing, list) or not all(_relative(p) for p in missing):
        raise _malformed(f"models_missing_at_backup must be a list of relative paths, not {_shown(missing)}")
    _check_database(manifest["database"])
    _check_files(manifest["files"], manifest["database"]["file"])


def _check_database(database: Any) -> None:
    if not isinstance(database, dict) or sorted(database) != sorted(DATABASE_FIELDS):
        raise _malformed(f"database must be an object of {', '.join(DATABASE_FIELDS)}, not {_shown(database)}")
    dialect = database["dialect"]
    if dialect not in DATABASE_FILES:
        raise _malformed(f"database.dialect must be {' or '.join(DATABASE_FILES)}, not {_shown(dialect)}")
    if database["file"] != DATABASE_FILES[dialect]:
        raise _malformed(f"database.file of a {dialect} backup is {DATABASE_FILES[dialect]}, not "
                         f"{_shown(database['file'])}")
    counts = database["counts"]
    if not isinstance(counts, dict):
        raise _malformed(f"database.counts must map table names to row counts, not {_shown(counts)}")
    for table, rows in counts.items():
        if not TABLE.fullmatch(table):
            raise _malformed(f"database.counts names {_shown(table)}, which is not a table name")
        if not _whole(rows) or rows < 0:
            raise _malformed(f"database.counts[{table}] must be a whole number >= 0, not {_shown(rows)}")


def _check_files(files: Any, database_file: str) -> None:
    if not isinstance(files, dict) or not files:
        raise _malformed(f"files must be an object of the backup's files, not {_shown(files)}")
    if database_file not in files:
        raise BackupError("the backup's manifest names no database file")
    for rel, meta in files.items():
        if not _relative(rel):
            raise _malformed(f"files names {_shown(rel)}, which is not a plain path inside the backup")
        parts = PurePosixPath(rel).parts
        if not (rel == database_file or parts[0] == FILES_DIR
                and (len(parts) > 2 or len(parts) == 2 and parts[1] in INSTANCE_FILES)):
            raise _malformed(f"files names {rel}, which a backup never holds (only {database_file}, "
                             f"{FILES_DIR}/{{{','.join(INSTANCE_FILES)}}} and {FILES_DIR}/<folder>/...)")
        if not isinstance(meta, dict) or sorted(meta) != sorted(FILE_FIELDS):
            raise _malformed(f"files[{rel}] must be an object of {', '.join(FILE_FIELDS)}, not {_shown(meta)}")
        if not _whole(meta["bytes"]) or meta["bytes"] < 0:
            raise _malformed(f"files[{rel}].bytes must be a whole number >= 0, not {_shown(meta['bytes'])}")
        if not (isinstance(meta["sha256"], str) and SHA256.fullmatch(meta["sha256"])):
            raise _malformed(f"files[{rel}].sha256 must be 64 lower-case hex digits, not {_shown(meta['sha256'])}")


# ---------------------------------------------------------------------------- the folder

def check_contents(src: Path, manifest: dict[str, Any]) -> None:
    """The folder holds exactly what the manifest lists, each file with its size and checksum."""
    files: dict[str, dict[str, Any]] = manifest["files"]
    folders = {str(parent) for rel in files for parent in PurePosixPath(rel).parents if str(parent) != "."}

    def unreadable(exc: OSError) -> None:
        raise BackupError(f"the backup cannot be read ({type(exc).__name__}: {exc.strerror or exc})")

    for folder, dirs, names in os.walk(src, onerror=unreadable):
        for name in sorted(dirs + names):
            path = Path(folder) / name
            rel = path.relative_to(src).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise BackupError(f"the backup holds a symbolic link: {rel} (a backup holds plain files and "
                                  "folders only)")
            if stat.S_ISDIR(mode):
                if rel not in folders:
                    raise BackupError(f"the backup holds a folder its manifest does not list: {rel}")
            elif not stat.S_ISREG(mode):
                raise BackupError(f"the backup holds {rel}, which is not a plain file")
            elif rel not in files and rel != MANIFEST:
                raise BackupError(f"the backup holds a file its manifest does not list: {rel}")
    for rel, meta in sorted(files.items()):
        path = src / rel
        if not path.is_file():
            raise BackupError(f"the backup is incomplete: {rel} is missing")
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise BackupError(f"the backup is damaged: {rel} has {size} bytes, the manifest says "
                              f"{meta['bytes']} (truncated?)")
        if sha256(path) != meta["sha256"]:
            raise BackupError(f"the backup is damaged: {rel} does not match its checksum")
    key = f"{FILES_DIR}/secret_key"
    if key in files and is_published((src / key).read_text(errors="replace")):
        raise BackupError(f"the backup's {key} is a secret key that was published (it is in this project's git "
                          f"history) and no instance may use it: delete the file and its entry in {MANIFEST}, then "
                          "restore (everyone signs in again)")
