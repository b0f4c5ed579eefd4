"""A throwaway PostgreSQL server for the tests that run the data layer on PostgreSQL.

The server is a fresh cluster (``initdb``) in a temporary directory, listening on a free
loopback port with ``trust`` authentication and durability switched off (fsync, synchronous
commit): it starts in a second or two and is removed at the end of the session. Each test gets
a database of its own (:meth:`PostgresServer.create_database`).

The binaries are looked for in ``$RLHF_PG_BINDIR``, ``/usr/lib/postgresql/<newest>/bin``
(Debian's ``postgresql`` package), then on ``PATH``. ``initdb`` refuses to run as root, so as
root the server runs as the ``postgres`` user (created by the Debian package) via ``runuser``.

Without PostgreSQL (or the psycopg driver) the tests that need it are skipped, unless
``RLHF_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which turns the skip into a failure.
"""
from __future__ import annotations

import itertools
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

REQUIRE_ENV = "RLHF_REQUIRE_POSTGRES"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL cannot be used on this machine; the message says why."""


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _version_key(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.\-]", path.parent.name))


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl, or None."""
    candidates: list[Path] = []
    if os.environ.get("RLHF_PG_BINDIR"):
        candidates.append(Path(os.environ["RLHF_PG_BINDIR"]))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.run_as: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root and there is no 'postgres' user to run "
                                          "initdb as (install Debian's postgresql package)") from None
            self.run_as = "postgres"
        # Not under pytest's tmp_path: as root that is a 0700 root-owned tree the server user
        # cannot enter. A short path also keeps the unix socket path under its length limit.
        self.base = Path(tempfile.mkdtemp(prefix="rlhf-pg-"))
        if self.run_as:
            shutil.chown(self.base, self.run_as, self.run_as)
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = _free_port()
        self._names = itertools.count(1)

    # ------------------------------------------------------------------ process control

    def _run(self, *args: str, timeout: float = 60) -> str:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.run_as:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=self.base)
        if proc.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(args[:2])} failed (exit {proc.returncode}): "
                                      f"{(proc.stderr or proc.stdout).strip()[-1500:]}\n{self.log_tail()}")
        return proc.stdout

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return "server log: " + self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _options(self) -> str:
        return (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{self.base}' "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")

    def initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                  "--locale=C", "--no-sync", timeout=120)

    def start(self) -> None:
        for attempt in range(3):  # the free port can be taken between choosing and binding it
            try:
                self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log),
                          "-o", self._options(), timeout=90)
                return
            except PostgresUnavailable:
                if attempt == 2:
                    raise
                self.port = _free_port()

    def restart(self) -> None:
        """Stop (fast: disconnects every client) and start again on the same port."""
        self._run("pg_ctl", "restart", "-w", "-t", "60", "-m", "fast", "-D", str(self.data), "-l", str(self.log),
                  "-o", self._options(), timeout=90)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.data), timeout=60)
        except (PostgresUnavailable, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------ databases

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> list[tuple]:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                             autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def create_database(self) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        name = f"test_{next(self._names)}"
        self.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def start_server() -> PostgresServer:
    """initdb + start, or PostgresUnavailable with the reason."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresUnavailable("the psycopg driver is not installed (pip install -e '.[dev]')") from None
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailable("PostgreSQL is not installed (no initdb/pg_ctl under /usr/lib/postgresql/*/bin "
                                  "or on PATH; Debian: apt-get install postgresql)")
    server = PostgresServer(bindir)
    try:
        server.initdb()
        server.start()
        server.execute("SELECT 1")
    except BaseException:
        server.stop()
        raise
    return server
