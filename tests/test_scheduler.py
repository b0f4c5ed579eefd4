"""Continuous learning: promotion policy, scheduler jobs, housekeeping, simulated users, a small loop."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rlhf.simulated_users import Behaviour, SimulatedUser, prompt_set
from tests.conftest import make_app, register_model
from tests.feedback_factory import seed_feedback
from tests.live_server import LiveServer
from webapp.training import scheduler as sched
from webapp.core.extensions import db
from webapp.core.models import (Assignment, AuditEvent, Conversation, Experiment, Feedback, Message, ModelVersion,
                                TrainingRun, User)
from webapp.experiments.promotion import PromotionPolicy, decide

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------- promotion policy

def table(diff, p, n=200, enough=True, metric="thumbs_up_rate", higher=True, kind="proportion", srm=False):
    return {"srm": {"mismatch": srm, "p_value": 0.0001 if srm else 0.5},
            "metrics": [{"name": metric, "kind": kind, "higher_is_better": higher, "enough_data": enough,
                         "control": {"value": 0.8, "n": n}, "variant": {"value": 0.8 + diff, "n": n},
                         "comparison": {"diff": diff, "low": diff - 0.05, "high": diff + 0.05, "p_value": p,
                                        "chance_to_beat": 0.99 if diff > 0 else 0.01}}]}


@pytest.mark.parametrize("metrics,hours,action,needle", [
    (table(0.08, 0.001), 1, "promote", "variant better"),
    (table(-0.08, 0.001), 1, "retire", "variant worse"),
    (table(0.08, 0.2), 1, "wait", "not significant"),
    (table(0.08, 0.001, n=10, enough=False), 1, "wait", "not enough data"),
    (table(0.01, 0.6), 80, "retire", "no significant result"),
    (table(0.08, 0.001, srm=True), 1, "wait", "sample ratio mismatch"),
    (table(-20.0, 0.001, metric="latency_ms", higher=False, kind="mean"), 1, "promote", "variant better"),
    (table(20.0, 0.001, metric="latency_ms", higher=False, kind="mean"), 1, "retire", "variant worse"),
])
def test_promotion_policy(metrics, hours, action, needle):
    primary = metrics["metrics"][0]["name"]
    decision = decide(metrics, PromotionPolicy(primary_metric=primary, alpha=0.05, max_hours=72), hours)
    assert decision.action == action and needle in decision.reason
    assert decision.numbers["p_value"] == metrics["metrics"][0]["comparison"]["p_value"]


def test_guardrail_blocks_promotion_on_a_self_serving_metric():
    metrics = table(0.5, 0.0001, metric="mean_reward", kind="mean")
    metrics["metrics"].append(table(-0.1, 0.001)["metrics"][0])  # thumbs-up rate significantly worse
    decision = decide(metrics, PromotionPolicy(primary_metric="mean_reward"), 1)
    assert decision.action == "retire" and "thumbs_up_rate" in decision.reason
    metrics["metrics"][1]["comparison"]["p_value"] = 0.4  # not significant: no objection
    assert decide(metrics, PromotionPolicy(primary_metric="mean_reward"), 1).action == "promote"


def test_unknown_primary_metric_is_an_error():
    with pytest.raises(ValueError, match="unknown primary metric"):
        decide(table(0.1, 0.01), PromotionPolicy(primary_metric="vibes"), 1)


# ---------------------------------------------------------------------------- jobs

@pytest.fixture
def instance(tmp_path, micro_model_dir, monkeypatch):
    inst = tmp_path / "instance"
    register_model(make_app(inst), micro_model_dir)
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    monkeypatch.setenv("RLHF_PPO_EPISODES", "32")
    monkeypatch.setenv("RLHF_DEVICE", "cpu")
    return inst


def wait_children(timeout=180):
    deadline = time.time() + timeout
    for proc in list(sched._CHILDREN):
        proc.wait(max(1, deadline - time.time()))


def test_retrain_only_past_the_threshold_and_never_twice(instance, micro_model_dir):
    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=40)
    seed_feedback(app, 8, seed=1)  # 16+ events
    with app.app_context():
        first = sched.retrain_tick()
        assert first["action"] == "skip" and first["reason"] == f"{first['new_events']} of 40 new feedback events since the last run"
        assert 16 <= first["new_events"] < 40
    seed_feedback(app, 20, seed=2)
    with app.app_context():
        started = sched.retrain_tick()
        assert started["action"] == "train" and started["new_events"] >= 40
        # the run row exists at once, before the child has started (queued), and names the child
        queued = db.session.get(TrainingRun, started["run_id"])
        assert queued.trigger == "schedule" and queued.pid == started["pid"]
        again = sched.retrain_tick()  # the child is still running: no second run
        assert again["action"] == "skip" and "in progress" in again["reason"]
    wait_children()
    with app.app_context():
        runs = db.session.scalars(db.select(TrainingRun)).all()
        assert [(r.id, r.trigger, r.status) for r in runs] == [(started["run_id"], "schedule", "succeeded")]
        after = sched.retrain_tick()  # nothing new since the run
        assert after["action"] == "skip" and after["reason"].startswith("0 of 40 new feedback events")


def test_tick_skips_while_another_process_trains(instance):
    import fcntl

    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=1)
    seed_feedback(app, 5)
    with open(instance / "training.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        with app.app_context():
            assert sched.retrain_tick() == {"action": "skip", "reason": "a training run is in progress"}
            assert sched.watchdog_tick() == {"action": "idle", "stopped": []}
            assert sched.housekeeping_tick()["recovered_runs"] == []


def test_housekeeping_recovers_dead_runs_and_prunes_old_versions(instance, micro_model_dir):
    app = make_app(instance, RLHF_RETAIN_RETIRED_VERSIONS=1)
    for i in range(2, 6):
        register_model(app, micro_model_dir, name=f"v{i}-ppo", status="retired")
    (instance / "models" / ".tmp-v9-ppo-dead").mkdir()
    with app.app_context():
        db.session.add(TrainingRun(status="running", stage="policy", pid=999999, hostname="gone"))
        active = db.session.get(ModelVersion, 1)
        active.parent_id = 2  # the roll-back target is protected
        db.session.commit()
        result = sched.housekeeping_tick()
        assert result["recovered_runs"] == [1] and result["removed_tmp"] == 1
        assert result["pruned"] == ["v4-ppo", "v3-ppo"]  # v5 kept (newest), v2 protected
        assert db.session.get(TrainingRun, 1).status == "failed"
        assert "pruned_at" in db.session.scalars(db.select(ModelVersion).filter_by(name="v3-ppo")).one().metrics
        assert db.session.scalars(db.select(AuditEvent).filter_by(action="housekeeping")).one().actor == "scheduler"
    assert sorted(p.name for p in (instance / "models").iterdir()) == ["v1-base", "v2-ppo", "v5-ppo"]


def _answers(app, exp_id, arm, version_id, ups, n):
    with app.app_context():
        for i in range(n):
            user = User(anon_id=f"{arm}-{i}")
            db.session.add(user)
            db.session.flush()
            conv = Conversation(user_id=user.id)
            db.session.add(conv)
            db.session.flush()
            q = Message(conversation_id=conv.id, role="user", content="How do I cook rice?")
            db.session.add(q)
            db.session.flush()
            a = Message(conversation_id=conv.id, role="assistant", content="Rinse it.", parent_id=q.id,
                        experiment_id=exp_id, arm=arm, model_version_id=version_id, latency_ms=50.0)
            db.session.add(a)
            db.session.flush()
            db.session.add(Feedback(user_id=user.id, message_id=a.id, thumb="up" if i < ups else "down"))
        db.session.commit()


def test_monitor_starts_an_experiment_and_promotes_by_policy(instance, micro_model_dir):
    app = make_app(instance, RLHF_AB_MIN_SAMPLE=30)
    register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    with app.app_context():
        started = sched.monitor_tick()
        assert started["action"] == "start"
        exp = db.session.scalars(db.select(Experiment)).one()
        assert (exp.status, exp.control_version.name, exp.variant_version.name) == ("running", "v1-base", "v2-ppo")
        assert sched.monitor_tick()["action"] == "wait"  # no data yet
        exp_id = exp.id
    _answers(app, exp_id, "control", 1, ups=20, n=50)
    _answers(app, exp_id, "variant", 2, ups=45, n=50)
    with app.app_context():
        decided = sched.monitor_tick()
        assert decided["action"] == "promote" and decided["numbers"]["p_value"] < 0.05
        assert {v.name: v.status for v in db.session.scalars(db.select(ModelVersion))} == \
            {"v1-base": "retired", "v2-ppo": "active"}
        event = db.session.scalars(db.select(AuditEvent).filter_by(action="experiment_conclude")).one()
        assert event.actor == "scheduler" and event.detail["numbers"]["policy"]["action"] == "promote"
        assert sched.monitor_tick() == {"action": "idle"}  # the candidate was tried; nothing new


def test_jobs_persist_across_restarts(instance):
    app = make_app(instance, RLHF_RETRAIN_INTERVAL_SECONDS=3600.0)
    scheduler = sched.build_scheduler(app)
    scheduler.start(paused=True)
    assert sorted(j.id for j in scheduler.get_jobs()) == ["experiment_monitor", "housekeeping", "retrain", "watchdog"]
    scheduler.shutdown(wait=False)
    again = sched.build_scheduler(make_app(instance))  # a restart: jobs come back from the database
    again.start(paused=True)
    assert len(again.get_jobs()) == 4
    with app.app_context():
        listed = sched.scheduled_jobs()
    assert {j["name"] for j in listed} == {"retrain", "experiment monitor", "housekeeping", "watchdog"}
    again.shutdown(wait=False)


# ---------------------------------------------------------------------------- a small closed loop

def test_small_loop_closes_by_itself(tmp_path, micro_model_dir):
    inst = tmp_path / "instance"
    register_model(make_app(inst), micro_model_dir)
    env = {"RLHF_SCHEDULER": "1", "RLHF_RETRAIN_INTERVAL_SECONDS": "1", "RLHF_MONITOR_INTERVAL_SECONDS": "1",
           "RLHF_RETRAIN_MIN_FEEDBACK": "30", "RLHF_PPO_EPISODES": "32", "RLHF_DEVICE": "cpu",
           # micro models learn little: let any candidate through the gate so the loop can be observed
           "RLHF_GATE_MIN_REWARD_GAIN": "-1000", "RLHF_GATE_MAX_KL": "1e9", "RLHF_COMPARE_RATE": "0",
           "RLHF_MIN_PAIRS": "3"}
    server = LiveServer(inst, env=env)
    try:
        prompts = prompt_set(30)
        events = 0
        for i in range(40):
            # the micro model talks noise, which an on-topic judge dislikes: corrections give pairs
            user = SimulatedUser(server.url, "on_topic", seed=i, behaviour=Behaviour(correction_prob=0.6))
            events += sum(x.events for x in user.ask(prompts[i % len(prompts)]))
            if events >= 30:
                break
        assert events >= 30
        app = make_app(inst)

        def experiment():
            with app.app_context():
                db.session.remove()
                return db.session.scalars(db.select(Experiment).filter_by(status="running")).first()

        deadline = time.time() + 180
        while time.time() < deadline and experiment() is None:
            time.sleep(1)
        exp = experiment()
        assert exp is not None, server.log()[-3000:]
        assert exp.key.startswith("auto-v2-ppo")
        with app.app_context():
            run = db.session.scalars(db.select(TrainingRun)).one()
            assert (run.trigger, run.status) == ("schedule", "succeeded")
        for i in range(12):  # each new user is assigned an arm on arrival (and is not told which)
            SimulatedUser(server.url, "polite", seed=100 + i, rate=False)
        with app.app_context():
            db.session.remove()
            arms = set(db.session.scalars(db.select(Assignment.arm).filter_by(experiment_id=exp.id)))
        assert arms == {"control", "variant"}  # new users are routed into the experiment
    finally:
        server.stop()


def test_one_scheduler_per_instance_and_its_status(instance):
    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=50)
    with app.app_context():
        assert sched.scheduler_status()["running"] is False
    # another process runs the scheduler: it holds the lock and wrote who it is
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, json, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX);"
        "json.dump({'pid': 1, 'hostname': 'h', 'where': 'scheduler process', 'last': {}}, open(sys.argv[2], 'w'));"
        "print('locked', flush=True); time.sleep(600)"), str(instance / "scheduler.lock"),
        str(instance / "scheduler.json")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(sched.SchedulerAlreadyRunning, match=r"already runs for this instance \(scheduler process"):
            sched.claim_scheduler(app, "web process")
        with app.app_context():
            status = sched.scheduler_status()
        assert status["running"] and status["where"] == "scheduler process (pid 1)"
    finally:
        holder.kill()
        holder.wait()
    # now this process takes it; a job's outcome is what the overview shows as the last retrain check
    sched.claim_scheduler(app, "web process")
    try:
        sched.build_scheduler(app)  # sets the app the jobs run against
        sched.run_job("retrain")
        with app.app_context():
            status = sched.scheduler_status()
        assert status["running"] and status["where"].startswith("web process (pid ")
        assert status["last_retrain"]["action"] == "skip"
        assert status["last_retrain"]["reason"] == "0 of 50 new feedback events since the last run"
    finally:
        sched.release_scheduler()


def test_serve_with_several_workers_refuses_the_in_process_scheduler(instance):
    from tests.conftest import flask_cli

    result = flask_cli("serve", "--workers", "2")
    assert result.exit_code == 1
    assert "would run once per worker with --workers 2: set RLHF_SCHEDULER=0" in result.output
