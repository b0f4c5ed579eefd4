"""Locks between processes of one instance: an exclusive ``flock`` on a file in the instance folder.

One helper for all of them (the base-model build, the training run, the scheduler). A flock
dies with its process, so a crashed holder never leaves a stale lock behind.
"""
from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from flask import current_app


class LockBusy(RuntimeError):
    """Another process (or another open file in this one) holds the lock."""


def lock_path(name: str) -> Path:
    """``<instance>/<name>.lock``."""
    return Path(current_app.config["INSTANCE_DIR"]) / f"{name}.lock"


def acquire(path: Path, wait: bool = True) -> IO:
    """Open ``path`` and take its exclusive lock, waiting for it or (``wait=False``) raising
    LockBusy. The lock lives as long as the returned file stays open."""
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        raise LockBusy(str(path)) from None
    return f


@contextmanager
def held(path: Path, wait: bool = True) -> Iterator[None]:
    """The lock on ``path`` for the duration of a ``with`` block (see :func:`acquire`)."""
    f = acquire(path, wait)
    try:
        yield
    finally:
        f.close()  # closing the file drops the flock


def is_held(path: Path) -> bool:
    """True while some process holds the lock on ``path`` (a different open file description,
    so this process's own holds count too)."""
    try:
        acquire(path, wait=False).close()
    except LockBusy:
        return True
    return False
