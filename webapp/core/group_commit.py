"""Group commit for SQLite: many requests' single-statement writes in one transaction.

SQLite has one writer at a time. With a writer lock per statement (or SQLite's own busy
handler, which sleeps 1, 2, 5, 10 ... ms between retries) every rating paid for its own
transaction, and under 32 concurrent raters threads spent most of their time queued for the
lock while its holder waited to get the GIL back between the statement and the commit: the
lock was held ~1 ms for ~0.3 ms of work. Here one thread per database takes whatever writes
are queued (up to ``max_batch``), runs them in one transaction and commits once; each request
waits for the commit that holds its write, so a 200 still means "stored". Queued writes are
served in arrival order, which also keeps the latency tail short.

A statement that fails does not fail the others: the batch is rolled back and each write is
retried in its own transaction, so every caller gets its own result or its own error.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine, Row
from sqlalchemy.sql import Executable


@dataclass(eq=False)
class _Write:
    statement: Executable
    params: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    row: Row | None = None
    error: BaseException | None = None


class GroupCommitWriter:
    """Runs ``INSERT/UPDATE ... RETURNING`` statements for one engine on one writer thread,
    several per transaction. The thread starts on the first write and exits after
    ``idle_seconds`` without any."""

    def __init__(self, engine: Engine, max_batch: int = 64, idle_seconds: float = 10.0) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.idle_seconds = idle_seconds
        self._queue: deque[_Write] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.batches = 0  # transactions committed (for benchmarks and tests)
        self.writes = 0

    def execute_one(self, statement: Executable, params: dict[str, Any], timeout: float = 60.0) -> Row:
        """Execute ``statement`` (which must return exactly one row) and commit it; returns the row."""
        write = _Write(statement, params)
        with self._cond:
            self._queue.append(write)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sqlite-group-commit", daemon=True)
                self._thread.start()
            else:
                self._cond.notify()
        if not write.done.wait(timeout):
            raise TimeoutError(f"the database did not take the write within {timeout:.0f} s")
        if write.error is not None:
            raise write.error
        assert write.row is not None
        return write.row

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._cond.wait(self.idle_seconds)
                if not self._queue:
                    self._thread = None  # under the lock: a new write after this starts a new thread
                    return
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            self._write(batch)

    def _write(self, batch: list[_Write]) -> None:
        try:
            with self.engine.begin() as conn:
                rows = [conn.execute(w.statement, w.params).one() for w in batch]
        except BaseException as exc:  # noqa: BLE001 -- delivered to the waiting request(s)
            if len(batch) == 1:
                batch[0].error = exc
                batch[0].done.set()
                return
            for w in batch:  # find who failed: each write alone, in its own transaction
                self._write([w])
            return
        self.batches += 1
        self.writes += len(batch)
        for w, row in zip(batch, rows):
            w.row = row
            w.done.set()
