"""Owner-only files. An instance holds every conversation, all feedback, the password and key
hashes and the cookie-signing key, so it and every copy of it are readable by their owner only,
whatever the process umask: folders 0700, files 0600.

- the instance folder, its SQLite database (SQLite gives its ``-wal``, ``-shm`` and ``-journal``
  files the database file's mode, so the database is created 0600 before SQLite first opens it)
  and its secret key (webapp/core/settings/secret_key.py);
- backups (webapp/core/backup.py: every folder and file in one), what a restore installs
  (webapp/core/restore.py), and ``copy-database`` SQLite targets (webapp/core/database_copy.py).

An existing instance (made by an older version, or by hand) is tightened at start-up
(:func:`secure_instance`, from create_app), with one log line naming what changed. Tightening only
takes permissions away (group and other); a symbolic link is never followed to change what it
points to.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any, Iterable, Mapping

from sqlalchemy.engine import make_url

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
# The scheduler's backups (webapp/core/backup.py: scheduled_backup) are folders named so.
SCHEDULED_BACKUP_GLOB = "backup-*"

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- creating

def private_dir(path: Path) -> Path:
    """``path``, created 0700 when missing (missing parents above it get the usual mode); an
    existing folder is left as it is."""
    path = Path(path)
    if path.is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:
        if not path.is_dir():
            raise
        return path
    os.chmod(path, PRIVATE_DIR)  # mkdir's mode went through the umask
    return path


def private_dirs(path: Path, base: Path) -> Path:
    """``path`` and every missing folder between ``base`` and it, each created 0700."""
    current = Path(base)
    private_dir(current)
    for part in Path(path).relative_to(base).parts:
        current = private_dir(current / part)
    return current


def create_private(path: Path) -> None:
    """An empty file 0600 at ``path`` unless something is there already (left as it is): an
    SQLite database before SQLite creates it with the umask's mode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    except FileExistsError:
        return
    os.fchmod(fd, PRIVATE_FILE)
    os.close(fd)


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``path`` (replacing its contents; a link there is refused) as a 0600 file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def copy_private(src: Path, dst: Path) -> None:
    """Copy the plain file ``src`` (never through a link) to ``dst`` as a 0600 file, keeping its
    modification time."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{src} is not a plain file")
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE)
        os.fchmod(out, PRIVATE_FILE)
        with os.fdopen(out, "wb") as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))


# ---------------------------------------------------------------------------- tightening

def tighten(path: Path, exact: bool = False) -> int | None:
    """Take group's and others' permissions off ``path`` (``exact``: set 0700 / 0600). Returns its
    former mode when it changed; None when nothing changed, it is missing, or it is a link."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return None
    mode = stat.S_IMODE(info.st_mode)
    wanted = (PRIVATE_DIR if stat.S_ISDIR(info.st_mode) else PRIVATE_FILE) if exact else mode & 0o700
    if wanted == mode:
        return None
    os.chmod(path, wanted)
    return mode


def tighten_tree(root: Path, exact: bool = False) -> list[tuple[Path, int]]:
    """:func:`tighten` on ``root`` and everything under it (links are neither followed nor
    changed); returns (path, former mode) of each change."""
    changed = []
    for path in [Path(root), *_walk(Path(root))]:
        old = tighten(path, exact)
        if old is not None:
            changed.append((path, old))
    return changed


def _walk(root: Path) -> Iterable[Path]:
    if not root.is_dir() or root.is_symlink():
        return
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(folder) / name


def sqlite_path(url: Any) -> Path | None:
    """The file of an SQLite database URL; None for other databases and in-memory ones."""
    try:
        parsed = make_url(str(url))
    except Exception:
        return None
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" \
            or database.startswith("file:"):
        return None
    return Path(database).expanduser()


def sqlite_files(database: Path | None) -> list[Path]:
    """The database file and the side files SQLite may make beside it."""
    return [] if database is None else [database, *(Path(f"{database}{s}") for s in SQLITE_SIDE_FILES)]


def secure_instance(config: Mapping[str, Any]) -> list[str]:
    """At start-up: the SQLite database file created 0600 when it does not exist yet; the instance
    folder, its database files and secret key, and the scheduler's backups tightened to owner
    only, in one log line when anything changed. Returns what changed (or could not be), as
    the line lists it."""
    instance = Path(config["INSTANCE_DIR"])
    database = sqlite_path(config.get("SQLALCHEMY_DATABASE_URI"))
    if database is not None and database.parent.is_dir():
        create_private(database)
    done: list[str] = []
    for path in [instance, instance / "secret_key", *sqlite_files(database)]:
        _note(done, path, lambda p=path: [(p, old)] if (old := tighten(p)) is not None else [])
    backups = Path(config.get("RLHF_BACKUP_DIR") or instance / "backups")
    if backups == instance / "backups":
        _note(done, backups, lambda: [(backups, old)] if (old := tighten(backups)) is not None else [])
    if backups.is_dir():
        for backup in sorted(backups.glob(SCHEDULED_BACKUP_GLOB)):
            _note(done, backup, lambda b=backup: tighten_tree(b), tree=True)
    if done:
        log.warning("Made the instance's files readable by their owner only (0700 folders, 0600 files): %s",
                    "; ".join(done))
    return done


def _note(done: list[str], path: Path, change, tree: bool = False) -> None:
    try:
        changed = change()
    except OSError as exc:
        done.append(f"{path} could not be changed ({type(exc).__name__}: {exc.strerror or exc})")
        return
    if tree and changed:
        done.append(f"{path} ({len(changed)} files and folders)")
    elif changed:
        done.append(f"{path} (was {changed[0][1]:04o})")
