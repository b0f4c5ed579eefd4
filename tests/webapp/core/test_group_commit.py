"""SQLite group commit (webapp/group_commit.py): queued writes share a transaction, every
caller gets its own row or its own error, and the writer thread comes and goes."""
from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from webapp.core.group_commit import GroupCommitWriter

UPSERT = text("INSERT INTO ratings (k, v) VALUES (:k, :v) ON CONFLICT (k) DO UPDATE SET v = excluded.v "
              "RETURNING k, v")


@pytest.fixture
def engine(tmp_path):
    eng = create_engine(f"sqlite:///{tmp_path / 'g.db'}", connect_args={"timeout": 15, "check_same_thread": False})
    with eng.begin() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        conn.exec_driver_sql("CREATE TABLE ratings (k INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    yield eng
    eng.dispose()


def _write_all(writer: GroupCommitWriter, jobs: list[tuple[int, int | None]]
               ) -> tuple[dict[int, object], list[threading.Thread]]:
    results: dict[int, object] = {}

    def one(i: int, k: int, v: int | None) -> None:
        try:
            results[i] = tuple(writer.execute_one(UPSERT, {"k": k, "v": v}))
        except Exception as exc:  # noqa: BLE001 -- the test looks at it
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i, k, v)) for i, (k, v) in enumerate(jobs)]
    for t in threads:
        t.start()
    return results, threads


def _wait_until(condition, what: str, timeout: float = 60.0) -> None:
    """Poll a state change of the writer (no assumption about how long anything takes)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def test_writes_queued_behind_a_busy_database_commit_together(engine, tmp_path):
    writer = GroupCommitWriter(engine)
    # another connection holds SQLite's write lock: the first write, taken alone by the writer
    # thread, waits in the busy handler, and the other 19 queue up behind it
    blocker = sqlite3.connect(tmp_path / "g.db", timeout=15)
    blocker.execute("BEGIN IMMEDIATE")
    results, threads = _write_all(writer, [(0, 0)])
    _wait_until(lambda: writer._thread is not None and not writer._queue, "the writer took the first write")
    more, more_threads = _write_all(writer, [(k, 10 * k) for k in range(1, 20)])
    _wait_until(lambda: len(writer._queue) == 19, "the other 19 writes are queued")
    blocker.rollback()
    blocker.close()
    for t in threads + more_threads:
        t.join(30)
    results.update({i + 1: r for i, r in more.items()})
    assert results == {k: (k, 10 * k) for k in range(20)}  # each caller got its own row back
    assert writer.writes == 20 and writer.batches == 2  # the first alone, then the 19 queued ones at once
    with engine.connect() as conn:
        assert dict(conn.execute(text("SELECT k, v FROM ratings")).all()) == {k: 10 * k for k in range(20)}


def test_a_failing_write_fails_alone(engine, tmp_path):
    """A write that breaks a constraint, queued in one transaction with two good ones: the group is
    retried write by write, so only that caller gets the error."""
    writer = GroupCommitWriter(engine)
    sizes: list[int] = []  # every transaction the writer tries, by its number of writes
    attempt = writer._write
    writer._write = lambda batch: (sizes.append(len(batch)), attempt(batch))[1]
    blocker = sqlite3.connect(tmp_path / "g.db", timeout=15)
    blocker.execute("BEGIN IMMEDIATE")
    results, threads = _write_all(writer, [(1, 1)])  # taken alone; waits for the lock
    _wait_until(lambda: writer._thread is not None and not writer._queue, "the writer took the first write")
    more, more_threads = _write_all(writer, [(2, 2), (3, None), (4, 4)])  # v NULL breaks NOT NULL
    _wait_until(lambda: len(writer._queue) == 3, "the other three writes are queued")
    blocker.rollback()
    blocker.close()
    for t in threads + more_threads:
        t.join(30)
        assert not t.is_alive()
    results.update({i + 1: r for i, r in more.items()})
    assert sizes == [1, 3, 1, 1, 1]  # the three together, then each alone
    assert isinstance(results[2], IntegrityError)
    assert {i: r for i, r in results.items() if i != 2} == {0: (1, 1), 1: (2, 2), 3: (4, 4)}
    with engine.connect() as conn:
        assert dict(conn.execute(text("SELECT k, v FROM ratings")).all()) == {1: 1, 2: 2, 4: 4}


def test_writer_thread_exits_when_idle_and_comes_back(engine):
    writer = GroupCommitWriter(engine, idle_seconds=0.1)
    assert tuple(writer.execute_one(UPSERT, {"k": 1, "v": 1})) == (1, 1)
    first = writer._thread
    assert first is not None
    first.join(5)
    assert not first.is_alive() and writer._thread is None
    assert tuple(writer.execute_one(UPSERT, {"k": 1, "v": 2})) == (1, 2)  # a new thread takes it
    assert writer.writes == 2
