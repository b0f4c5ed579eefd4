"""Online backup and restore (`flask --app webapp backup` / `restore`), on SQLite and PostgreSQL.

The main test takes a backup of a live server while simulated users write feedback through its
API and a training run runs, restores it into a new instance at another path, and checks that the
restored instance holds exactly the rows the manifest counts, every feedback committed before the
backup began, no row that differs from the source, and that it serves and trains. The others feed
restore bad backups (damaged, holding what the manifest does not list, a malformed manifest) and
a non-empty instance: each stops with one line and changes nothing. Backups, restored instances
and copy-database targets are readable by their owner only, whatever the umask."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from sqlalchemy import text

from tests.support.app import DATABASES, database_url_for, flask_cli, make_app, register_model
from tests.support.feedback_factory import seed_feedback
from tests.support.leaked_key import leaked_secret_key
from tests.support.live_server import LiveServer
from tests.support.paths import ROOT
from webapp.core.extensions import db
from webapp.core.models import Feedback, ModelVersion

FAST = {"RLHF_DEVICE": "cpu", "RLHF_PPO_EPISODES": "32", "RLHF_EMBEDDED_PRESET": "micro", "RLHF_MAX_NEW_TOKENS": "4"}


@pytest.fixture(params=DATABASES)
def database_url(request):
    return database_url_for(request, request.param)


def flask(instance: Path, *args: str, database_url: str | None = None, env: dict | None = None,
          background: bool = False):
    """``flask --app webapp ARGS`` on ``instance``: a child process with ``background`` (beside the
    live server), otherwise in this process (the same command, without the start-up of a new
    Python). Returns an object with ``returncode``, ``stdout`` and ``stderr``."""
    full = {"RLHF_INSTANCE_DIR": str(instance), **FAST, "RLHF_SCHEDULER": "0", **(env or {})}
    if database_url:
        full["DATABASE_URL"] = database_url
    if background:
        child_env = {**os.environ, **full}
        if not database_url:
            child_env.pop("DATABASE_URL", None)
        return subprocess.Popen([sys.executable, "-m", "flask", "--app", "webapp", *args], env=child_env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mp = pytest.MonkeyPatch()
    try:
        mp.delenv("DATABASE_URL", raising=False)
        for key, value in full.items():
            mp.setenv(key, value)
        result = flask_cli(*args)
    finally:
        mp.undo()
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def feedback_rows(app) -> dict[int, tuple]:
    """Feedback by the answer it rates (each answer here is rated once, by its asker)."""
    with app.app_context():
        return {f.message_id: (f.id, f.user_id, f.thumb, f.rating, f.correction, f.comment)
                for f in db.session.scalars(db.select(Feedback))}


def running(app) -> bool:
    from webapp.core.models import TrainingRun

    with app.app_context():
        found = db.session.scalars(db.select(TrainingRun).filter_by(status="running")).first() is not None
        db.session.remove()
    return found


class Rater(threading.Thread):
    """A simulated user: asks a question on the live server, rates each answer once (new rows
    only, so a restored row can be compared with its source), and records every feedback id the
    server confirmed (by the answer's id)."""

    def __init__(self, url: str, index: int, stop: threading.Event, confirmed: list[int]):
        super().__init__(daemon=True)
        self.url, self.index, self.stop, self.confirmed = url, index, stop, confirmed
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            s = requests.Session()
            csrf = {"X-CSRFToken": s.get(f"{self.url}/api/session", timeout=30).json()["csrf_token"]}
            n = 0
            while not self.stop.is_set():
                conv = s.post(f"{self.url}/api/conversations", json={}, headers=csrf, timeout=60).json()["id"]
                answer = s.post(f"{self.url}/api/conversations/{conv}/messages", headers=csrf, timeout=120,
                                json={"content": f"How do I cook rice? ({self.index}-{n})", "stream": False})
                answer.raise_for_status()
                message = answer.json()["assistant_message"]["id"]
                rated = s.post(f"{self.url}/api/messages/{message}/feedback", headers=csrf, timeout=60,
                               json={"thumb": "up" if n % 2 else "down", "rating": 1 + n % 5})
                rated.raise_for_status()
                self.confirmed.append(rated.json()["message_id"])
                n += 1
        except Exception as exc:  # reported by the test
            self.error = exc


def test_backup_while_users_rate_and_a_run_trains_restores_exactly(tmp_path, micro_model_dir, database_url,
                                                                    request):
    source = tmp_path / "source"
    overrides = {"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {}
    app = make_app(source, **overrides)
    register_model(app, micro_model_dir)
    seed_feedback(app, 40)
    env = {"DATABASE_URL": database_url} if database_url else {}
    server = LiveServer(source, env={**FAST, **env, "RLHF_RATELIMIT_ENABLED": "0"})
    stop, confirmed = threading.Event(), []
    raters = [Rater(server.url, i, stop, confirmed) for i in range(3)]
    training = None
    try:
        for rater in raters:
            rater.start()
        training = flask(source, "rl-train", "--min-feedback", "10", "--max-steps", "2",
                         database_url=database_url, background=True)
        deadline = time.monotonic() + 600
        while (len(confirmed) < 6 or not running(app)) and all(r.is_alive() for r in raters) \
                and training.poll() is None and time.monotonic() < deadline:  # writes flow, the run trains
            threading.Event().wait(0.2)
        assert all(r.error is None for r in raters), [r.error for r in raters]
        assert len(confirmed) >= 6 and running(app), (len(confirmed), training.poll())
        committed_before = set(confirmed)
        backup = tmp_path / "backups" / "b1"
        # the run is held mid-training (not ended) for as long as the backup takes: the snapshot is
        # of a database with a run in progress, whatever the machine's speed
        os.kill(training.pid, signal.SIGSTOP)
        try:
            made = flask(source, "backup", str(backup), database_url=database_url)
        finally:
            os.kill(training.pid, signal.SIGCONT)
        assert made.returncode == 0, made.stdout + made.stderr
        after_backup = len(confirmed)
        deadline = time.monotonic() + 300
        while len(confirmed) < after_backup + 3 and all(r.is_alive() for r in raters) \
                and time.monotonic() < deadline:  # ... and users go on rating
            threading.Event().wait(0.2)
        assert len(confirmed) >= after_backup + 3, [r.error for r in raters]
    finally:
        stop.set()
        for rater in raters:
            rater.join(120)
        if training is not None:
            training.wait(600)
        server.stop()
    assert all(r.error is None for r in raters), [r.error for r in raters]
    assert training.returncode in (0, 3), training.stdout.read()

    manifest = json.loads((backup / "manifest.json").read_text())
    counts = manifest["database"]["counts"]
    assert counts["feedback"] >= 80 + len(committed_before)
    source_rows = feedback_rows(app)
    assert len(source_rows) > counts["feedback"]  # users went on rating after the backup

    # restore into a new instance at another path (and a new database)
    target = tmp_path / "elsewhere" / "restored"
    target_url = request.getfixturevalue("postgres_server").create_database() if database_url else None
    restored = flask(target, "restore", str(backup), database_url=target_url)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "paths moved from" in restored.stdout
    new = make_app(target, **({"SQLALCHEMY_DATABASE_URI": target_url} if target_url else {}))
    with new.app_context():
        for table, n in counts.items():
            if table != "apscheduler_jobs":
                assert db.session.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() == n, table
        versions = db.session.scalars(db.select(ModelVersion)).all()
        assert versions and all(not Path(v.path).is_absolute() and v.location.startswith(str(target))
                                for v in versions)
        # the run is in the snapshot mid-run (a restored "running" run is recovered as failed by the
        # next run there, as after a crash)
        assert db.session.execute(text("SELECT status FROM training_runs")).scalars().all() == ["running"]
    restored_rows = feedback_rows(new)
    assert committed_before <= set(restored_rows)  # no committed feedback lost
    assert all(source_rows[i] == row for i, row in restored_rows.items())  # no partial or foreign row

    # the restored instance serves and trains
    client = new.test_client()
    csrf = {"X-CSRFToken": client.get("/api/session").get_json()["csrf_token"]}
    conv = client.post("/api/conversations", json={}, headers=csrf).get_json()["id"]
    answer = client.post(f"/api/conversations/{conv}/messages", headers=csrf,
                         json={"content": "How do I cook rice?", "stream": False})
    assert answer.status_code == 201, answer.get_json()
    trained = flask(target, "rl-train", "--min-feedback", "10", "--max-steps", "2", database_url=target_url)
    assert trained.returncode in (0, 3), trained.stdout + trained.stderr


# ---------------------------------------------------------------------------- bad input

@pytest.fixture
def a_backup(tmp_path, micro_model_dir) -> Path:
    source = tmp_path / "source"
    app = make_app(source)
    register_model(app, micro_model_dir)
    seed_feedback(app, 6)
    made = flask(source, "backup", str(tmp_path / "good"))
    assert made.returncode == 0, made.stderr
    return tmp_path / "good"


def _snapshot(instance: Path) -> dict[str, object]:
    """Every file of an instance; the database as its contents (SQLite rewrites its file when a
    connection checkpoints the write-ahead log, without any change to the data)."""
    import sqlite3

    out: dict[str, object] = {}
    for p in sorted(instance.rglob("*")):
        if not p.is_file() or p.name.endswith((".lock", "-wal", "-shm")):
            continue
        if p.suffix == ".db":
            conn = sqlite3.connect(p)
            out[p.name] = list(conn.iterdump())
            conn.close()
        else:
            out[str(p.relative_to(instance))] = p.read_bytes()
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _break_checksum(b: Path) -> None:
    path = b / "database.sqlite"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(b: Path) -> None:
    path = b / "database.sqlite"
    path.write_bytes(path.read_bytes()[:4096])


def _drop_model_file(b: Path) -> None:
    next((b / "instance" / "models").rglob("*.safetensors")).unlink()


def _newer_schema(b: Path) -> None:
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["schema_revision"] = "ffffffffffff"
    (b / "manifest.json").write_text(json.dumps(manifest))


def _garbage_manifest(b: Path) -> None:
    (b / "manifest.json").write_text('{"format": 1, "files": ')


def _no_manifest(b: Path) -> None:
    (b / "manifest.json").unlink()


def _edit_manifest(b: Path, edit) -> None:
    manifest = json.loads((b / "manifest.json").read_text())
    edit(manifest)
    (b / "manifest.json").write_text(json.dumps(manifest))


def _add_listed(b: Path, rel: str, data: bytes) -> None:
    """A file the manifest lists, with its right size and checksum."""
    (b / rel).parent.mkdir(parents=True, exist_ok=True)
    (b / rel).write_bytes(data)
    entry = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _edit_manifest(b, lambda m: m["files"].update({rel: entry}))


def _model_folder(b: Path) -> Path:
    return next((b / "instance" / "models").iterdir())


# what the manifest does not list: installed (and config.py executed at the next start) before
def _unlisted_config(b: Path) -> None:
    (b / "instance" / "config.py").write_text("RLHF_MAX_NEW_TOKENS = 7\n")


def _unlisted_model_file(b: Path) -> None:
    (_model_folder(b) / "extra.bin").write_bytes(b"\0" * 16)


def _unlisted_symlink(b: Path) -> None:
    (b.parent / "outside.txt").write_text("a file from outside the backup")
    (_model_folder(b) / "notes.txt").symlink_to(b.parent / "outside.txt")


def _symlinked_folder(b: Path) -> None:
    (b.parent / "outside").mkdir()
    (b.parent / "outside" / "run.log").write_text("from outside")
    (b / "instance" / "runs").symlink_to(b.parent / "outside", target_is_directory=True)


def _listed_file_as_symlink(b: Path) -> None:
    """A listed file replaced by a link to an identical copy inside the backup."""
    listed = next(p for p in _model_folder(b).iterdir() if p.is_file())
    copy = b / "instance" / "models" / "copy"
    copy.write_bytes(listed.read_bytes())
    _edit_manifest(b, lambda m: m["files"].update({str(copy.relative_to(b)): m["files"][str(listed.relative_to(b))]}))
    listed.unlink()
    listed.symlink_to(copy)


def _unlisted_folder(b: Path) -> None:
    (b / "instance" / "models" / "empty").mkdir()


def _listed_database_over_the_instance(b: Path) -> None:
    _add_listed(b, "instance/rlhf.db", (b / "database.sqlite").read_bytes())


def _leaked_secret_key(b: Path) -> None:
    _add_listed(b, "instance/secret_key", leaked_secret_key().encode())


@pytest.mark.parametrize("damage,needle", [
    (_break_checksum, "does not match its checksum"),
    (_truncate, "(truncated?)"),
    (_drop_model_file, "is missing"),
    (_newer_schema, "newer than this code"),
    (_garbage_manifest, "is unreadable"),
    (_no_manifest, "is not a backup (no manifest.json)"),
    (_unlisted_config, "holds a file its manifest does not list: instance/config.py"),
    (_unlisted_model_file, "holds a file its manifest does not list: instance/models/"),
    (_unlisted_symlink, "holds a symbolic link: instance/models/"),
    (_symlinked_folder, "holds a symbolic link: instance/runs"),
    (_listed_file_as_symlink, "holds a symbolic link: instance/models/"),
    (_unlisted_folder, "holds a folder its manifest does not list: instance/models/empty"),
    (_listed_database_over_the_instance, "instance/rlhf.db"),
    (_leaked_secret_key, "secret key"),
])
def test_a_bad_backup_is_refused_and_changes_nothing(tmp_path, a_backup, damage, needle):
    bad = _copy(a_backup, tmp_path / "bad")
    damage(bad)
    _refused_unchanged(tmp_path, bad, needle)


def _refused_unchanged(tmp_path: Path, bad: Path, needle: str) -> None:
    target = tmp_path / "target"
    make_app(target)  # the empty database the app makes on start
    before = _snapshot(target)
    result = flask(target, "restore", str(bad))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in result.stderr, result.stderr
    assert _snapshot(target) == before
    assert not (target / "models").exists()


def _first_file(m: dict) -> str:
    return next(iter(m["files"]))


@pytest.mark.parametrize("edit,field", [
    (lambda m: m.update(instance_dir=5), "instance_dir"),
    (lambda m: m.update(instance_dir="relative/instance"), "instance_dir"),
    (lambda m: m.update(instance_dir="/"), "instance_dir"),
    (lambda m: m.update(format=True), "format"),
    (lambda m: m.update(created_at="yesterday"), "created_at"),
    (lambda m: m.update(schema_revision=["0001"]), "schema_revision"),
    (lambda m: m.update(models_missing_at_backup="models/v0"), "models_missing_at_backup"),
    (lambda m: m.pop("created_at"), "created_at"),
    (lambda m: m.update(signed_by="nobody"), "signed_by"),
    (lambda m: m.update(files=[]), "files"),
    (lambda m: m["files"].update({_first_file(m): 5}), "files"),
    (lambda m: m["files"][_first_file(m)].update(bytes="12"), "bytes"),
    (lambda m: m["files"][_first_file(m)].update(bytes=-1), "bytes"),
    (lambda m: m["files"][_first_file(m)].update(sha256=None), "sha256"),
    (lambda m: m["files"].update({"/etc/passwd": m["files"]["database.sqlite"]}), "/etc/passwd"),
    (lambda m: m["files"].update({"instance/../database.sqlite": m["files"]["database.sqlite"]}),
     "instance/../database.sqlite"),
    (lambda m: m.update(database=[]), "database"),
    (lambda m: m["database"].update(dialect="oracle"), "dialect"),
    (lambda m: m["database"].update(file="instance/secret_key"), "file"),
    (lambda m: m["database"].update(counts=[["feedback", 12]]), "counts"),
    (lambda m: m["database"]["counts"].update(feedback=-1), "counts"),
    (lambda m: m["database"]["counts"].update(feedback=True), "counts"),
    (lambda m: m["database"]["counts"].update({"feedback; DROP TABLE users": 1}), "counts"),
])
def test_a_malformed_manifest_is_one_line_and_changes_nothing(tmp_path, a_backup, edit, field):
    """Every field is checked before anything changes: a field of the wrong kind (``instance_dir: 5``)
    must not stop a restore half-way, after the database and the files are in place."""
    bad = _copy(a_backup, tmp_path / "bad")
    _edit_manifest(bad, edit)
    _refused_unchanged(tmp_path, bad, field)


def test_restore_into_a_non_empty_instance_is_refused(tmp_path, a_backup, micro_model_dir):
    target = tmp_path / "busy"
    app = make_app(target)
    register_model(app, micro_model_dir)
    seed_feedback(app, 2)
    before = _snapshot(target)
    result = flask(target, "restore", str(a_backup))
    assert result.returncode == 1 and "the instance is not empty" in result.stderr, result.stderr
    assert _snapshot(target) == before


def test_backup_refuses_an_existing_destination(tmp_path, a_backup):
    again = flask(tmp_path / "source", "backup", str(a_backup))
    assert again.returncode == 1 and "already exists" in again.stderr


def test_scheduled_backups_keep_the_newest(tmp_path, micro_model_dir):
    from webapp.training.jobs import backup_tick

    app = make_app(tmp_path / "instance", RLHF_BACKUP_INTERVAL_HOURS=24.0, RLHF_BACKUP_KEEP=2,
                   RLHF_BACKUP_DIR=str(tmp_path / "auto"))
    register_model(app, micro_model_dir)
    made = []
    with app.app_context():
        for n in range(3):
            seed_feedback(app, 1, seed=100 + n)
            result = backup_tick()
            assert result["action"] == "backup"
            made.append(Path(result["path"]).name)
    kept = sorted(p.name for p in (tmp_path / "auto").iterdir())
    assert len(kept) == 2 and kept == sorted(made)[-2:], (made, kept)
    off = make_app(tmp_path / "instance")
    with off.app_context():
        assert backup_tick()["action"] == "skip"


# ---------------------------------------------------------------------------- owner only

@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def loose(root: Path) -> dict[str, str]:
    """Everything at and under ``root`` that anyone but its owner may read, enter or write (or that
    is not 0700 / 0600), with its mode."""
    out = {}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != (0o700 if path.is_dir() else 0o600):
            out[str(path.relative_to(root.parent))] = oct(mode)
    return out


def test_backups_restores_and_copies_are_private_whatever_the_umask(tmp_path, micro_model_dir):
    """A backup, the instance it is restored into and a copy-database SQLite target hold every
    conversation and hash: 0700 folders and 0600 files even with umask 000 (0777 / 0666 before)."""
    (tmp_path / "copies").mkdir()
    with umask(0o000):
        source = tmp_path / "source"
        app = make_app(source)
        register_model(app, micro_model_dir)
        seed_feedback(app, 2)
        made = flask(source, "backup", str(tmp_path / "backups" / "b1"))
        assert made.returncode == 0, made.stderr
        target = tmp_path / "target"
        restored = flask(target, "restore", str(tmp_path / "backups" / "b1"))
        assert restored.returncode == 0, restored.stderr
        copied = flask(source, "copy-database", f"sqlite:///{tmp_path / 'copies' / 'copy.db'}")
        assert copied.returncode == 0, copied.stderr
    assert loose(tmp_path / "backups") == {}
    for name in ("rlhf.db", "rlhf.db-wal", "rlhf.db-shm", "secret_key"):
        assert not (target / name).exists() or loose(target / name) == {}, name
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    restored_files = [p for p in (target / "models").rglob("*")]
    assert restored_files and all(not stat.S_IMODE(p.stat().st_mode) & 0o077 for p in restored_files)
    for name in ("copy.db", "copy.db-wal", "copy.db-shm", "copy.db-journal"):
        assert not (tmp_path / "copies" / name).exists() or loose(tmp_path / "copies" / name) == {}, name
