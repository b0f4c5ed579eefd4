"""Faults with nothing lost: a training process killed mid-run, a broken active version, a
failure while a new version is being saved."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from rlhf.models import registry
from tests.support.app import flask_cli as cli
from tests.support.app import make_app, register_model, seeded_instance, sse_events
from tests.support.app import runs_and_versions as state
from tests.support.feedback_factory import seed_feedback
from tests.support.paths import ROOT
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Assignment, AuditEvent, Message, ModelVersion, TrainingRun

FAST = {"RLHF_PPO_EPISODES": "32", "RLHF_POLICY_LR": "1e-3", "RLHF_DEVICE": "cpu"}


def admin_client(app):
    """A test client logged in as the admin "root"."""
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    resp = client.post("/admin/login", data={"username": "root", "password": "correct horse", "csrf_token": token})
    assert resp.status_code == 302
    return client


def dashboard(app) -> str:
    """The admin overview's HTML, as a logged-in admin sees it."""
    return admin_client(app).get("/admin/").get_data(as_text=True)


def admin_health(app) -> dict:
    """``/api/health`` as an admin sees it (visitors get the status alone: blind arms)."""
    return admin_client(app).get("/api/health").get_json()


# ---------------------------------------------------------------------------- a broken active version

@pytest.fixture
def lineage(app, micro_model_dir):
    """v1-base -> v2-ppo -> v3-ppo (active): each trained from the one before, earlier ones retired."""
    register_model(app, micro_model_dir, name="v2-ppo", status="retired")
    register_model(app, micro_model_dir, name="v3-ppo", status="active")
    with app.app_context():
        v1, v2, v3 = (db.session.scalars(db.select(ModelVersion).filter_by(name=n)).one()
                      for n in ("v1-base", "v2-ppo", "v3-ppo"))
        v1.status = "retired"
        v2.kind = v3.kind = "ppo"
        v2.parent_id, v3.parent_id = v1.id, v2.id
        db.session.commit()
        set_admin_password("root", "correct horse")
        return {v.name: (v.id, Path(v.path)) for v in (v1, v2, v3)}


def break_version(path: Path, how: str) -> None:
    weights = path / "model.safetensors"
    if how == "missing_dir":
        shutil.rmtree(path)
    elif how == "no_config":
        (path / "config.json").unlink()
    elif how == "truncated_weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "garbage_weights":
        weights.write_bytes(os.urandom(4096))


def answer(api, stream=False):
    conv = api.post("/api/conversations", json={}).get_json()["id"]
    resp = api.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?", "stream": stream})
    if stream:
        return resp.status_code, sse_events(resp)[-1]
    return resp.status_code, resp.get_json()


def answered_by(app, message_id) -> tuple[str, str | None]:
    with app.app_context():
        msg = db.session.get(Message, message_id)
        return db.session.get(ModelVersion, msg.model_version_id).name, msg.arm


def audit_actions(app) -> list[tuple[str, str]]:
    with app.app_context():
        return [(e.action, e.subject) for e in db.session.scalars(db.select(AuditEvent).order_by(AuditEvent.id))
                if e.action.startswith("version_")]


@pytest.mark.parametrize("how", ["missing_dir", "no_config", "truncated_weights", "garbage_weights"])
def test_broken_active_version_is_served_by_the_last_good_version(app, api, lineage, micro_model_dir, how):
    v3_path = lineage["v3-ppo"][1]
    break_version(v3_path, how)
    status, body = answer(api)
    assert status == 201, body
    msg = body["assistant_message"]
    assert answered_by(app, msg["id"]) == ("v2-ppo", None)  # the version that really answered
    status, (event, done) = answer(api, stream=True)
    assert (status, event) == (200, "done")
    assert answered_by(app, done["message_id"])[0] == "v2-ppo"
    assert answer(api)[0] == 201

    with app.app_context():
        v3 = db.session.get(ModelVersion, lineage["v3-ppo"][0])
        assert v3.status == "active"  # nothing was promoted or retired behind the admin's back
        problem = v3.metrics["unservable"]
        assert problem["serving"] == "v2-ppo" and "could not be loaded" in problem["error"]
    assert audit_actions(app) == [("version_unservable", "v3-ppo")]  # recorded once, not per request
    assert api.get("/api/health").get_json() == {"status": "degraded"}  # a visitor: the status alone
    health = admin_health(app)
    assert health["status"] == "degraded" and health["model_version"] == "v3-ppo" and health["serving"] == "v2-ppo"

    page = dashboard(app)
    assert 'data-testid="serving-warning" data-version="v3-ppo"' in page
    assert "Model version v3-ppo cannot be loaded" in page
    assert 'served by <b data-testid="serving-fallback">v2-ppo</b> instead' in page

    # fixed on disk: the next answer comes from v3 again and the warning is gone
    shutil.rmtree(v3_path, ignore_errors=True)
    shutil.copytree(micro_model_dir, v3_path)
    (v3_path / "version.json").write_text("{}")
    status, body = answer(api)
    assert status == 201
    assert answered_by(app, body["assistant_message"]["id"]) == ("v3-ppo", None)
    with app.app_context():
        assert "unservable" not in db.session.get(ModelVersion, lineage["v3-ppo"][0]).metrics
    assert audit_actions(app) == [("version_unservable", "v3-ppo"), ("version_recovered", "v3-ppo")]
    assert api.get("/api/health").get_json() == {"status": "ok"}
    assert admin_health(app) == {"status": "ok", "model_version": "v3-ppo"}
    assert "serving-warning" not in dashboard(app)


def test_fallback_walks_back_to_the_base_and_503_only_when_nothing_loads(app, api, lineage):
    break_version(lineage["v3-ppo"][1], "garbage_weights")
    break_version(lineage["v2-ppo"][1], "missing_dir")
    status, body = answer(api)
    assert status == 201 and answered_by(app, body["assistant_message"]["id"])[0] == "v1-base"
    break_version(lineage["v1-base"][1], "no_config")
    status, body = answer(api)  # v1-base is already in memory: it keeps answering
    assert status == 201 and answered_by(app, body["assistant_message"]["id"])[0] == "v1-base"

    fresh = make_app(Path(app.config["INSTANCE_DIR"]))  # a new worker process: nothing loaded
    fresh_api = type(api)(fresh.test_client())
    status, body = answer(fresh_api)
    assert status == 503 and "cannot be loaded" in body["error"]
    assert "v3-ppo" not in body["error"]  # the user is not told which version (the admin overview says)
    page = dashboard(fresh)
    assert 'data-version="v3-ppo"' in page and "No earlier version can be loaded either" in page
    assert admin_health(fresh)["serving"] is None


def test_broken_variant_answers_from_its_parent_outside_the_experiment(app, api, lineage):
    from webapp.experiments.lifecycle import create_experiment

    with app.app_context():
        create_experiment("exp", lineage["v2-ppo"][0], lineage["v3-ppo"][0], 0.99, actor="test")
    break_version(lineage["v3-ppo"][1], "truncated_weights")
    status, body = answer(api)
    assert status == 201
    with app.app_context():  # 99 % of users are in the variant, this one included
        assert db.session.scalars(db.select(Assignment.arm).filter_by(user_id=api.user_id)).one() == "variant"
    # an answer the variant's model never gave must not count for the variant arm
    assert answered_by(app, body["assistant_message"]["id"]) == ("v2-ppo", None)
    assert 'data-version="v3-ppo"' in dashboard(app)


def test_dashboard_warns_before_any_request_and_restart_keeps_the_broken_version(app, lineage):
    from webapp.serving.versions import ensure_base_version

    break_version(lineage["v3-ppo"][1], "no_config")
    page = dashboard(app)
    assert 'data-version="v3-ppo"' in page and "no config.json" in page and ">v2-ppo</b>" in page
    with app.app_context():  # what `serve` does on start: no new base model built over it
        version, created = ensure_base_version()
        assert (version.name, created) == ("v3-ppo", False)
        assert db.session.scalar(db.select(db.func.count(ModelVersion.id))) == 3


# ---------------------------------------------------------------------------- a failure while saving

@pytest.fixture
def instance(tmp_path, micro_model_dir, monkeypatch):
    return seeded_instance(tmp_path, micro_model_dir, monkeypatch, FAST)


class _Os:
    """``os`` for webapp.training.runner whose rename fails once the new version's directory in the model
    store got one file (disk full half-way through the save)."""

    def __init__(self):
        self.moved = 0

    def __getattr__(self, name):
        return getattr(os, name)

    def rename(self, src, dst):
        if Path(dst).parent.parent.name == "models":
            if self.moved == 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.moved += 1
        return os.rename(src, dst)


def _fail_fsync(path):
    raise OSError(errno.EIO, "Input/output error")


def fake_cycle(model_dir: Path):
    """``run_prepared`` without the training: the parent's weights as the 'trained' policy and reward
    model, passing the gate. Everything after it -- saving and registering -- is the real code."""
    from rlhf.cycle import CycleResult

    def run_prepared(prepared, parent_path, reward_dir, policy_dir, progress=None, log=None, logs=None):
        shutil.copytree(model_dir, reward_dir)
        shutil.copytree(model_dir, policy_dir)
        evaluation = {"passed": True, "reasons": [], "reward_gain": 0.1, "kl_from_parent": 0.0}
        return CycleResult(counts={}, reward={}, policy={}, evaluation=evaluation, timings={})
    return run_prepared


@pytest.mark.parametrize("where", ["half_written", "fsync", "registering"])
def test_failure_while_saving_leaves_no_version(instance, micro_model_dir, monkeypatch, where):
    import webapp.training.runner

    monkeypatch.setattr(webapp.training.runner, "run_prepared", fake_cycle(micro_model_dir))
    with monkeypatch.context() as fault:
        if where == "half_written":
            fault.setattr(webapp.training.runner, "os", _Os())
            expected = "OSError: [Errno 28] No space left on device"
        elif where == "fsync":
            fault.setattr(registry, "_fsync_tree", _fail_fsync)
            expected = "OSError: [Errno 5] Input/output error"
        else:  # the files are in place, but the database refuses the new row
            def refuse():
                raise RuntimeError("database is locked")
            fault.setattr(db.session, "flush", refuse, raising=False)
            expected = "RuntimeError: database is locked"
        result = cli("rl-train", "--min-feedback", "10")
    assert result.exit_code == 1 and f"training run failed: {expected}" in result.output, result.output
    runs, versions = state(instance)
    assert runs == [("failed", expected)]
    assert versions == [("v1-base", "active")]  # no model_versions row for the failed save
    assert sorted(p.name for p in (instance / "models").iterdir()) == ["v1-base"]  # nothing half-written
    assert not list((instance / "runs").glob(".tmp-*"))

    again = cli("rl-train", "--min-feedback", "10", "--json")  # the same save without the fault
    assert again.exit_code == 0, again.output
    assert state(instance) == ([("failed", expected), ("succeeded", None)],
                               [("v1-base", "active"), ("v2-ppo", "candidate")])
    assert registry.is_complete(instance / "models" / "v2-ppo")
    assert sorted(p.name for p in (instance / "models").iterdir()) == ["v1-base", "v2-ppo"]


def test_writer_killed_mid_save_leaves_only_a_temporary(tmp_path, micro_model_dir):
    """No exception handler runs on SIGKILL: only writing into a temporary directory and renaming
    it keeps a half-written version from appearing under a version's name."""
    from webapp.training.jobs import housekeeping_tick

    app = make_app(tmp_path / "instance")
    register_model(app, micro_model_dir)
    store = Path(app.config["MODEL_STORE"])
    code = ("import os, shutil, signal, sys\n"
            "from rlhf.models import registry\n"
            "def write(tmp):\n"
            "    shutil.copy(sys.argv[2] + '/config.json', tmp)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "registry.write_version(sys.argv[1], 'ppo', write)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(store), str(micro_model_dir)], cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL
    leftovers = sorted(p.name for p in store.iterdir())
    assert leftovers[0].startswith(".tmp-v2-ppo-") and leftovers[1:] == ["v1-base"]
    assert registry.next_version_name(store, "ppo") == "v2-ppo"  # the temporary is no version
    with app.app_context():
        assert db.session.scalar(db.select(db.func.count(ModelVersion.id))) == 1
        assert housekeeping_tick()["removed_tmp"] == 1
    assert sorted(p.name for p in store.iterdir()) == ["v1-base"]


# ---------------------------------------------------------------------------- a killed training process

class Chatter(threading.Thread):
    """Keeps asking the live server questions (fresh users now and then, below the per-user
    rate limit); records (time, status, answer id or error). Which version answered is read from
    the database afterwards (:func:`answering_versions`): users are not told."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.results, self.stop = url, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            s = requests.Session()
            csrf = s.get(self.url + "/api/session", timeout=30).json()["csrf_token"]
            conv = s.post(self.url + "/api/conversations", json={}, headers={"X-CSRFToken": csrf}, timeout=30).json()
            for _ in range(10):
                if self.stop.is_set():
                    return
                try:
                    r = s.post(f"{self.url}/api/conversations/{conv['id']}/messages", timeout=60,
                               json={"content": "How do I water tomatoes?", "stream": False},
                               headers={"X-CSRFToken": csrf})
                    answer = r.json()["assistant_message"]["id"] if r.status_code == 201 else r.text
                    self.results.append((time.monotonic(), r.status_code, answer))
                except requests.RequestException as exc:
                    self.results.append((time.monotonic(), 0, repr(exc)))

    def between(self, start: float, end: float) -> list[tuple]:
        return [r for r in self.results if start <= r[0] < end]


def answering_versions(inst: Path) -> dict[int, str]:
    """answer id -> the name of the version that wrote it."""
    with sqlite3.connect(inst / "rlhf.db", timeout=10) as con:
        return dict(con.execute("SELECT m.id, v.name FROM messages m JOIN model_versions v "
                                "ON m.model_version_id = v.id WHERE m.role = 'assistant'").fetchall())


def run_row(inst: Path):
    with sqlite3.connect(inst / "rlhf.db", timeout=10) as con:
        return con.execute("SELECT id, status, stage, pid, error, progress FROM training_runs "
                           "ORDER BY id DESC").fetchone()


@pytest.mark.slow
def test_killed_training_process_never_interrupts_serving(tmp_path, micro_model_dir):
    from tests.support.live_server import LiveServer

    inst = tmp_path / "instance"
    app = make_app(inst)
    register_model(app, micro_model_dir)
    seed_feedback(app, 40)
    env = {"RLHF_DEVICE": "cpu", "RLHF_MAX_NEW_TOKENS": "16", "RLHF_CHAT_RATE_LIMIT": "100000 per minute",
           "RLHF_CHAT_RATE_LIMIT_PER_ADDRESS": "100000 per minute"}
    train_env = {**os.environ, **FAST, "RLHF_INSTANCE_DIR": str(inst), "RLHF_TRAIN_THREADS": "1"}
    server = LiveServer(inst, env=env)
    chatter = Chatter(server.url)
    numbers = {}
    try:
        chatter.start()
        t0 = time.monotonic()
        train_log = tmp_path / "rl-train.log"
        with open(train_log, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "webapp", "rl-train", "--min-feedback",
                                     "10"], cwd=ROOT, env=train_env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        row = None
        while time.monotonic() < deadline and proc.poll() is None:
            row = run_row(inst)
            if row and row[1] == "running" and row[2] == "reward" and row[5] > 0.06:  # reward model training steps
                break
            time.sleep(0.1)
        assert proc.poll() is None and row and row[2] == "reward", (proc.poll(), row, train_log.read_text()[-3000:])
        run_id = row[0]
        assert (inst / "runs" / f".tmp-run-{run_id}").is_dir()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        t_kill = time.monotonic()
        assert run_row(inst)[1:3] == ("running", "reward")  # nobody was left to record it

        with app.app_context():  # the kernel released the run lock with the process
            from webapp.training.jobs import training_in_progress
            assert not training_in_progress()
        time.sleep(2)
        # the next run marks the dead one failed, cleans up after it and succeeds
        nxt = subprocess.run([sys.executable, "-m", "flask", "--app", "webapp", "rl-train", "--min-feedback", "10",
                              "--json"], cwd=ROOT, env=train_env, capture_output=True, text=True, timeout=600)
        t_next = time.monotonic()
        assert nxt.returncode in (0, 3), nxt.stderr[-3000:]
        out = json.loads(nxt.stdout)
        assert out["status"] == "succeeded" and out["version"]["name"] == "v2-ppo"
        time.sleep(2)
        chatter.stop.set()
        chatter.join(120)

        with app.app_context():
            dead = db.session.get(TrainingRun, run_id)
            assert dead.status == "failed" and dead.finished_at is not None
            assert dead.error == (f"process {row[3]} on {dead.hostname} died during stage reward "
                                  "(recovered by a later run)")
            assert f"recovered stale runs [{run_id}]" in db.session.get(TrainingRun, out["run_id"]).log
            assert {v.name: v.status for v in db.session.scalars(db.select(ModelVersion))} == \
                {"v1-base": "active", "v2-ppo": out["version"]["status"]}
        assert not (inst / "runs" / f".tmp-run-{run_id}").exists()
        assert sorted(p.name for p in (inst / "models").iterdir()) == ["v1-base", "v2-ppo"]

        before, during, after = (chatter.between(t0, t_kill), chatter.between(t_kill, t_next),
                                 chatter.between(t_next, float("inf")))
        results = chatter.results
        versions = answering_versions(inst)
        assert all(status == 201 and versions.get(answer) == "v1-base" for _, status, answer in results), \
            [r for r in results if r[1] != 201][:5]
        assert before and during and after
        gaps = [b[0] - a[0] for a, b in zip(results, results[1:])]
        numbers = {"answers_while_training_before_kill": len(before),
                   "answers_between_kill_and_next_run_done": len(during), "answers_after": len(after),
                   "failed_requests": sum(1 for r in results if r[1] != 201),
                   "longest_gap_between_answers_s": round(max(gaps), 2),
                   "kill_after_s": round(t_kill - t0, 1), "killed_at_progress": row[5],
                   "next_run_s": round(t_next - t_kill, 1), "next_run_stage_s": out["timings_s"]}
    finally:
        chatter.stop.set()
        server.stop()
        print("\nkill test:", json.dumps(numbers))


def test_housekeeping_leaves_a_queued_run_whose_child_has_not_started_yet(tmp_path, micro_model_dir):
    """spawn_training writes the queued row, then starts rl-train, which takes the training lock a
    few seconds later. Housekeeping in between holds the lock, but that proves nothing about a run
    whose child is still starting: it must not be marked dead (it used to be, and the run then
    trained under a stale "died" error). Old queued rows and rows of dead processes are recovered."""
    import socket
    from datetime import timedelta

    from webapp.core.extensions import db
    from webapp.core.models import TrainingRun, utcnow
    from webapp.training.jobs import housekeeping_tick

    app = make_app(tmp_path / "instance")
    register_model(app, micro_model_dir)
    with app.app_context():
        rows = {"just queued": TrainingRun(trigger="schedule", status="queued", hostname=socket.gethostname()),
                "queued long ago": TrainingRun(trigger="schedule", status="queued", hostname=socket.gethostname(),
                                               created_at=utcnow() - timedelta(hours=1)),
                "child died": TrainingRun(trigger="schedule", status="queued", hostname=socket.gethostname(),
                                          pid=2**22 + 12345),  # above Linux's largest pid: never alive
                "running, lock free": TrainingRun(trigger="cli", status="running", pid=2**22 + 12346, hostname="gone")}
        db.session.add_all(rows.values())
        db.session.commit()
        ids = {name: run.id for name, run in rows.items()}
        housekeeping_tick()
        db.session.expire_all()
        status = {name: db.session.get(TrainingRun, i).status for name, i in ids.items()}
    assert status == {"just queued": "queued", "queued long ago": "failed", "child died": "failed",
                      "running, lock free": "failed"}
