"""Locks between processes of one instance: an exclusive ``flock`` on a file in the instance folder.

One helper for all of them (the base-model build, the training run, the scheduler). A flock
dies with its process, so a crashed holder never leaves a stale lock behind.

Whoever takes a lock writes who it is into the lock file: the job, what it is doing, pid, host,
since when, and whether it holds the lock only for a moment (``brief``). Another process that
finds the lock taken reads that record (:func:`holder`), so it can tell a long holder (a
training run: give up and say which) from a brief one (housekeeping's cleanup: wait for it a
few seconds, ``patience``). The record is cleared on release; one left behind by a crashed
holder is never read as a holder (the lock is free then, or its pid is gone).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from flask import current_app

# A holder writes its record right after it took the lock (and clears it right before it lets
# go): one found without a record for longer than this is a holder that writes none.
RECORD_GRACE_SECONDS = 1.0
POLL_SECONDS = 0.05


class LockBusy(RuntimeError):
    """Another process (or another open file in this one) holds the lock. ``holder`` is the
    record it wrote (:func:`holder`), ``{}`` when it wrote none."""

    def __init__(self, path: Path, holder: dict[str, Any] | None = None) -> None:
        super().__init__(str(path))
        self.path = Path(path)
        self.holder = holder or {}


class Lock:
    """A held lock: the open file whose flock it is. ``close()`` (or the end of a ``with``
    block) clears the holder's record and releases the lock."""

    def __init__(self, f: IO) -> None:
        self._file = f

    @property
    def closed(self) -> bool:
        return self._file.closed

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self._file.truncate(0)  # the record goes with the hold
        except OSError:
            pass
        self._file.close()  # closing the file drops the flock

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lock_path(name: str) -> Path:
    """``<instance>/<name>.lock``."""
    return Path(current_app.config["INSTANCE_DIR"]) / f"{name}.lock"


def _try_flock(path: Path, wait: bool = False) -> IO | None:
    """The open file with its exclusive flock, or None when another open file holds it."""
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    return f


def _write_record(f: IO, record: dict[str, Any]) -> None:
    f.truncate(0)  # opened for appending: the record is the file's only content
    f.write(json.dumps(record, default=str))
    f.flush()


def _pid_gone(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, TypeError, ValueError, OverflowError):
        return False
    return False


def _read_record(path: Path) -> dict[str, Any]:
    """The record in the lock file; ``{}`` when there is none, it is half written, or its
    process is gone (a crashed holder's, read while someone without a record holds the lock)."""
    try:
        record = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    if record.get("hostname") == socket.gethostname() and _pid_gone(record.get("pid")):
        return {}
    return record


def _worth_waiting(who: dict[str, Any], waited: float, patience: float) -> bool:
    """Wait ``patience`` seconds at most for a brief holder, and the record grace (within
    ``patience``) for one that has not written its record (yet); never for a long holder."""
    if who.get("brief"):
        return waited < patience
    if not who:
        return waited < min(patience, RECORD_GRACE_SECONDS)
    return False


def acquire(path: Path, wait: bool = True, *, patience: float = 0.0, job: str | None = None,
            doing: str | None = None, brief: bool = False, **detail: Any) -> Lock:
    """Open ``path`` and take its exclusive lock, waiting for it or (``wait=False``) raising
    LockBusy with the holder's record. With ``wait=False`` and ``patience`` it first waits up
    to ``patience`` seconds while the holder is a brief one. The lock lives as long as the
    returned Lock stays open; while it does, the file records this holder (``job``, ``doing``,
    ``brief``, ``detail``, pid, host, since)."""
    started = time.monotonic()
    while True:
        f = _try_flock(path, wait)
        if f is not None:
            break
        who = _read_record(path)
        if not _worth_waiting(who, time.monotonic() - started, patience):
            raise LockBusy(path, who)
        time.sleep(POLL_SECONDS)
    _write_record(f, {"job": job, "doing": doing, "brief": bool(brief), "pid": os.getpid(),
                      "hostname": socket.gethostname(), "since": datetime.now(timezone.utc).isoformat(),
                      **detail})
    return Lock(f)


@contextmanager
def held(path: Path, wait: bool = True, **holder: Any) -> Iterator[Lock]:
    """The lock on ``path`` for the duration of a ``with`` block (see :func:`acquire`)."""
    with acquire(path, wait, **holder) as lock:
        yield lock


def is_held(path: Path) -> bool:
    """True while some process holds the lock on ``path`` (a different open file description,
    so this process's own holds count too)."""
    f = _try_flock(path)
    if f is None:
        return True
    f.close()  # a probe: it leaves the file (and any record in it) alone
    return False


def holder(path: Path) -> dict[str, Any] | None:
    """Who holds the lock on ``path``: None while nobody does, else the record its holder wrote
    (``{}`` when it wrote none)."""
    if not is_held(path):
        return None
    return _read_record(path)


def wait_out_brief(path: Path, patience: float,
                   on_wait: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any] | None:
    """Wait up to ``patience`` seconds while the lock on ``path`` is held briefly (see
    :func:`acquire`), without taking it; then who holds it (None: nobody). ``on_wait`` is called
    once with the holder when there is something to wait for."""
    started, told = time.monotonic(), False
    while True:
        who = holder(path)
        if who is None or not _worth_waiting(who, time.monotonic() - started, patience):
            return who
        if on_wait is not None and not told:
            on_wait(who)
            told = True
        time.sleep(POLL_SECONDS)
