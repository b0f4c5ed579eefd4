"""Continuous learning: promotion policy, scheduler jobs, housekeeping, simulated users, a small loop."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from rlhf.sim.users import Behaviour, SimulatedUser, prompt_set
from tests.support.app import make_app, register_model
from tests.support.feedback_factory import seed_feedback
from tests.support.live_server import LiveServer
from webapp.core.extensions import db
from webapp.core.models import (
    Assignment,
    AuditEvent,
    Conversation,
    Experiment,
    Feedback,
    Message,
    ModelVersion,
    TrainingRun,
    User,
)
from webapp.experiments.promotion import PromotionPolicy, decide
from webapp.training import jobs
from webapp.training import scheduler as sched

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------- promotion policy

def row(name="thumbs_up_rate", diff=0.08, seq=(0.02, 0.14), fixed=None, p_seq=0.01, enough=True, higher=True,
        kind="proportion", n=200):
    """One metric of a constructed table: ``seq`` the sequential interval the policy decides on,
    ``fixed`` the fixed-horizon one (reference; by default far narrower, as it is)."""
    fixed = fixed or (diff - 0.02, diff + 0.02)
    return {"name": name, "kind": kind, "higher_is_better": higher, "enough_data": enough,
            "control": {"value": 0.6, "n": n}, "variant": {"value": 0.6 + diff, "n": n},
            "comparison": {"diff": diff, "low": fixed[0], "high": fixed[1], "p_value": 0.0001,
                           "chance_to_beat": 0.99 if diff > 0 else 0.01},
            "sequential": {"low": seq[0], "high": seq[1], "p_value": p_seq, "n": 2 * n, "tuning": 5000.0},
            "power": None}


def table(*rows, srm=False):
    return {"srm": {"mismatch": srm, "p_value": 0.0001 if srm else 0.5}, "min_sample": 30,
            "metrics": list(rows) or [row()]}


POLICY = PromotionPolicy(primary_metric="thumbs_up_rate", alpha=0.05, max_hours=72)


@pytest.mark.parametrize("metrics,hours,action,needle", [
    (table(row()), 1, "promote", "variant better"),
    (table(row(diff=-0.08, seq=(-0.14, -0.02))), 1, "retire", "variant worse"),
    (table(row(seq=(-0.01, 0.17), p_seq=0.2)), 1, "wait", "not significant yet"),
    (table(row(n=10, enough=False)), 1, "wait", "not enough data"),
    (table(row(diff=0.01, seq=(-0.1, 0.12), p_seq=0.9)), 80, "retire", "no significant result"),
    (table(row(), srm=True), 1, "wait", "sample ratio mismatch"),
    (table(row(), srm=True), 80, "retire", "sample ratio mismatch"),
    (table(row("latency_ms", -20.0, (-30.0, -10.0), higher=False, kind="mean")), 1, "promote", "variant better"),
    (table(row("latency_ms", 20.0, (10.0, 30.0), higher=False, kind="mean")), 1, "retire", "variant worse"),
])
def test_promotion_policy(metrics, hours, action, needle):
    primary = metrics["metrics"][0]["name"]
    decision = decide(metrics, PromotionPolicy(primary_metric=primary, alpha=0.05, max_hours=72), hours)
    assert decision.action == action and needle in decision.reason
    assert decision.numbers["p_value"] == metrics["metrics"][0]["sequential"]["p_value"]


def test_policy_decides_on_the_sequential_interval_not_the_fixed_horizon_p():
    # a peek where the fixed-horizon test says "significant" but the sequence still holds 0: wait
    peek = row(diff=0.05, seq=(-0.03, 0.13), fixed=(0.01, 0.09), p_seq=0.3)
    decision = decide(table(peek), POLICY, 1)
    assert decision.action == "wait" and "not significant yet" in decision.reason
    assert decision.numbers["fixed_horizon_ci"] == [0.01, 0.09] and decision.numbers["sequential_ci"] == [-0.03, 0.13]


def test_guardrail_significantly_worse_retires_whatever_the_primary_says():
    reward = row("mean_reward", 0.5, (0.2, 0.8), kind="mean")
    thumbs_worse = row(diff=-0.1, seq=(-0.16, -0.04))
    decision = decide(table(reward, thumbs_worse), PromotionPolicy(primary_metric="mean_reward"), 1)
    assert decision.action == "retire" and "better on mean_reward but significantly worse on thumbs_up_rate" \
        in decision.reason
    undecided = row("mean_reward", 0.1, (-0.2, 0.4), kind="mean", p_seq=0.5)
    decision = decide(table(undecided, thumbs_worse), PromotionPolicy(primary_metric="mean_reward"), 1)
    assert decision.action == "retire" and decision.numbers["guardrails_worse"] == ["thumbs_up_rate"]


@pytest.mark.parametrize("guard,action", [
    # a loss of 5 points is not ruled out: wait for more data
    (row(diff=-0.01, seq=(-0.09, 0.07), p_seq=1.0), "wait"),
    # looks worse, but the interval rules out a loss of 5 points: cleared
    (row(diff=-0.01, seq=(-0.04, 0.02), p_seq=1.0), "promote"),
    # looks better, but a loss of 5 points is not ruled out: looking fine at one look is not
    # enough (a rule that cleared it let true losses slip through at some look)
    (row(diff=0.01, seq=(-0.07, 0.09), p_seq=1.0), "wait"),
    (row(diff=0.01, seq=(-0.12, 0.14), p_seq=1.0), "wait"),
    # exactly at the margin: not ruled out
    (row(diff=0.0, seq=(-0.05, 0.05), p_seq=1.0), "wait"),
    # some data, too little to judge: not cleared yet
    (row(diff=-0.05, seq=(-0.5, 0.4), enough=False), "wait"),
    # no data at all in either arm (nobody rates with stars here): no guardrail
    (row("mean_rating", 0.0, (None, None), enough=False, kind="mean", n=0), "promote"),
    # the rating's typical effect is a quarter star
    (row("mean_rating", -0.05, (-0.2, 0.1), kind="mean"), "promote"),
    (row("mean_rating", -0.05, (-0.3, 0.2), kind="mean"), "wait"),
    (row("mean_rating", 0.05, (-0.45, 0.55), kind="mean"), "wait"),
    # compare votes: lower than 1/2 is worse
    (row("compare_win_rate", -0.02, (-0.1, 0.06), kind="win_rate"), "wait"),
    (row("compare_win_rate", 0.02, (-0.03, 0.07), kind="win_rate"), "promote"),
])
def test_a_guardrail_must_clear_before_a_promotion(guard, action):
    reward = row("mean_reward", 0.5, (0.2, 0.8), kind="mean")
    decision = decide(table(reward, guard), PromotionPolicy(primary_metric="mean_reward"), 1)
    assert decision.action == action, decision.reason
    if action == "wait":
        assert f"a loss of a typical effect on {guard['name']} is not ruled out yet" in decision.reason
        assert decide(table(reward, guard), PromotionPolicy(primary_metric="mean_reward"), 80).action == "retire"


def test_guardrails_are_held_to_their_own_stricter_level():
    """The row's interval is at the policy's alpha (5 %); a guardrail clears only if the wider
    interval at guardrail_alpha (1 %) rules out the typical loss too."""
    reward = row("mean_reward", 0.5, (0.2, 0.8), kind="mean")
    close = row(diff=0.0, seq=(-0.046, 0.046), p_seq=1.0)  # at 5 %: -4.6 points; at 1 %: about -5.1
    strict = PromotionPolicy(primary_metric="mean_reward")
    lenient = PromotionPolicy(primary_metric="mean_reward", guardrail_alpha=0.05)
    assert decide(table(reward, close), strict, 1).action == "wait"
    assert decide(table(reward, close), lenient, 1).action == "promote"
    with pytest.raises(ValueError, match="guardrail_alpha"):
        PromotionPolicy(guardrail_alpha=0)


def test_unknown_primary_metric_is_an_error():
    with pytest.raises(ValueError, match="unknown primary metric"):
        decide(table(), PromotionPolicy(primary_metric="vibes"), 1)
    with pytest.raises(ValueError, match="alpha"):
        PromotionPolicy(alpha=1.5)


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
    for proc in list(jobs._CHILDREN):
        proc.wait(max(1, deadline - time.time()))


def test_retrain_only_past_the_threshold_and_never_twice(instance, micro_model_dir):
    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=40)
    seed_feedback(app, 8, seed=1)  # 16+ events
    with app.app_context():
        first = jobs.retrain_tick()
        assert (first["action"] == "skip"
                and first["reason"] == f"{first['new_events']} of 40 new feedback events since the last run")
        assert 16 <= first["new_events"] < 40
    seed_feedback(app, 20, seed=2)
    with app.app_context():
        started = jobs.retrain_tick()
        assert started["action"] == "train" and started["new_events"] >= 40
        # the run row exists at once, before the child has started (queued), and names the child
        queued = db.session.get(TrainingRun, started["run_id"])
        assert queued.trigger == "schedule" and queued.pid == started["pid"]
        again = jobs.retrain_tick()  # the child is still running: no second run
        assert again["action"] == "skip" and "in progress" in again["reason"]
    wait_children()
    with app.app_context():
        runs = db.session.scalars(db.select(TrainingRun)).all()
        assert [(r.id, r.trigger, r.status) for r in runs] == [(started["run_id"], "schedule", "succeeded")]
        after = jobs.retrain_tick()  # nothing new since the run
        assert after["action"] == "skip" and after["reason"].startswith("0 of 40 new feedback events")


def running_experiment_with_feedback(app, model_dir, key: str) -> None:
    """A candidate in a running experiment ``key`` against the active version, and 8 rated chats."""
    from webapp.experiments.lifecycle import create_experiment

    candidate = register_model(app, model_dir, name="v2-candidate", status="candidate")
    seed_feedback(app, 8, seed=1)
    with app.app_context():
        active = db.session.scalars(db.select(ModelVersion).filter_by(status="active")).one()
        create_experiment(key, active.id, candidate, actor="test")


def test_retrain_waits_for_a_running_experiments_verdict(instance, micro_model_dir):
    from webapp.experiments.lifecycle import conclude_experiment

    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=10)
    running_experiment_with_feedback(app, micro_model_dir, "exp-wait")
    with app.app_context():
        waiting = jobs.retrain_tick()
        assert waiting["action"] == "skip" and waiting["experiment"] == "exp-wait"
        assert waiting["reason"] == (f"experiment exp-wait is running: the next run waits for its verdict "
                                     f"({waiting['new_events']} new feedback events)")
        assert db.session.scalars(db.select(TrainingRun)).all() == []
        # the verdict in, the next run starts on the feedback that waited (the experiment's included)
        conclude_experiment("exp-wait", "keep_control", {}, actor="test")
        started = jobs.retrain_tick()
        assert started["action"] == "train" and started["new_events"] == waiting["new_events"]
    wait_children()
    with app.app_context():
        assert db.session.get(TrainingRun, started["run_id"]).status == "succeeded"


def test_retrain_during_an_experiment_when_the_operator_allows_it(instance, micro_model_dir):
    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=10, RLHF_RETRAIN_DURING_EXPERIMENT=True)
    running_experiment_with_feedback(app, micro_model_dir, "exp-on")
    with app.app_context():
        started = jobs.retrain_tick()
        assert started["action"] == "train" and started["new_events"] >= 10
    wait_children()
    with app.app_context():
        assert db.session.get(TrainingRun, started["run_id"]).status == "succeeded"


# another process holding the training lock as webapp.core.locks records a holder (released
# when its stdin closes)
HOLD_LOCK = ("import sys; from pathlib import Path; from webapp.core import locks;"
             "lock = locks.acquire(Path(sys.argv[1]), wait=False, job=sys.argv[2], doing=sys.argv[3],"
             " brief=sys.argv[4] == '1', run_id=12);"
             "print('locked', flush=True); sys.stdin.read()")


@contextlib.contextmanager
def lock_held_by(path, job, doing, brief):
    from tests.support.paths import ROOT

    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path), job, doing, "1" if brief else "0"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait(60)


def test_tick_skips_while_another_process_trains(instance, caplog):
    import logging

    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=1)
    seed_feedback(app, 5)
    caplog.set_level(logging.INFO, logger="webapp.training.scheduler")
    with lock_held_by(instance / "training.lock", "training run", "training", brief=False) as pid:
        with app.app_context():
            assert jobs.training_in_progress()
            assert jobs.retrain_tick() == {
                "action": "skip", "reason": "a training run (#12) is in progress",
                "held_by": {"job": "training run", "doing": "training", "run_id": 12, "pid": pid,
                            "since": jobs.training_lock_holder()["since"]}}
            assert jobs.watchdog_tick() == {"action": "idle", "stopped": []}
            assert jobs.housekeeping_tick()["recovered_runs"] == []
    assert "waiting for" not in caplog.text  # a training run is never waited for


def test_a_lock_without_a_record_is_not_called_a_training_run(instance, monkeypatch):
    import fcntl

    from webapp.core import locks

    monkeypatch.setattr(locks, "RECORD_GRACE_SECONDS", 0.0)
    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=1)
    seed_feedback(app, 5)
    with open(instance / "training.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # a holder that writes no record
        with app.app_context():
            result = jobs.retrain_tick()
    assert result["action"] == "skip"
    assert result["reason"] == "another process holds the training lock without saying what it is doing"


class _Child:
    """A spawned rl-train as the retrain tick keeps it (it never trains here)."""
    pid = 4321

    def poll(self):
        return None


def test_retrain_waits_out_housekeepings_moment_with_the_lock(instance, monkeypatch, caplog):
    """Housekeeping holds the training lock to clean up stale runs just as the retrain check
    looks (both jobs used to fire together): the check waits for it and starts the run, rather
    than skipping the hour as if a run were in progress."""
    import logging
    import threading

    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=1)
    seed_feedback(app, 5)
    in_cleanup, retrain_waits = threading.Event(), threading.Event()
    real_recover = jobs.recover_stale_runs

    def recover_when_the_retrain_waits(*args, **kwargs):  # housekeeping, holding the training lock
        in_cleanup.set()
        retrain_waits.wait(120)  # a bound for a broken test, not a timing
        return real_recover(*args, **kwargs)

    class RetrainWaits(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("retrain: waiting for housekeeping (cleaning up stale runs"):
                retrain_waits.set()

    spawned = []
    monkeypatch.setattr(jobs, "recover_stale_runs", recover_when_the_retrain_waits)
    monkeypatch.setattr(jobs, "spawn_training", lambda **kw: spawned.append(kw) or (7, _Child()))
    monkeypatch.setattr(jobs, "_CHILDREN", [])
    monkeypatch.setattr(sched, "_APP", None)
    caplog.set_level(logging.INFO, logger="webapp.training.scheduler")
    watcher = RetrainWaits()
    logging.getLogger("webapp.training.scheduler").addHandler(watcher)
    housekeeping = []

    def housekeeping_job():
        with app.app_context():
            housekeeping.append(jobs.housekeeping_tick())

    sched.build_scheduler(app)  # sets the app the jobs run against
    thread = threading.Thread(target=housekeeping_job)
    thread.start()
    try:
        assert in_cleanup.wait(120)
        sched.run_job("retrain")
    finally:
        retrain_waits.set()
        thread.join(120)
        logging.getLogger("webapp.training.scheduler").removeHandler(watcher)
    assert spawned == [{"trigger": "schedule", "min_feedback": 0}]
    assert housekeeping and housekeeping[0]["recovered_runs"] == []  # its cleanup ran, under the lock
    with app.app_context():
        last = sched.scheduler_status()["last_retrain"]
    assert last["action"] == "train" and last["reason"].endswith("started run #7"), last
    assert not last["held_by"]


def test_a_housekeeping_hold_past_the_wait_is_named_as_such(instance, monkeypatch):
    from webapp.training import runs

    monkeypatch.setattr(runs, "BRIEF_HOLD_PATIENCE_SECONDS", 0.0)  # the check gives up at once
    monkeypatch.setattr(sched, "_APP", None)
    app = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=1)
    seed_feedback(app, 5)
    with app.app_context():
        db.session.add(TrainingRun(status="running", stage="policy", pid=999999, hostname="gone"))  # a dead run's row
        db.session.commit()
    sched.build_scheduler(app)
    with lock_held_by(instance / "training.lock", "housekeeping", "cleaning up stale runs", brief=True) as pid:
        with app.app_context():
            assert not jobs.training_in_progress()  # housekeeping is no training run
        sched.run_job("retrain")
    with app.app_context():
        last = sched.scheduler_status()["last_retrain"]
    assert last["action"] == "skip" and "training run" not in last["reason"]
    assert last["reason"] == ("housekeeping was cleaning up stale runs and still held the training lock after 0 s "
                              f"(pid {pid})")
    assert last["held_by"]["job"] == "housekeeping"


def test_first_runs_are_staggered(instance):
    from webapp.training import runs

    app = make_app(instance, RLHF_OPENWEBUI_URL="http://openwebui.invalid", RLHF_OPENWEBUI_API_KEY="sk-test")
    scheduler = sched.build_scheduler(app)
    scheduler.start(paused=True)
    try:
        jobs = {job.id: job for job in scheduler.get_jobs()}
        first = {job_id: job.next_run_time for job_id, job in jobs.items()}
    finally:
        scheduler.shutdown(wait=False)
    assert set(first) == {"retrain", "experiment_monitor", "housekeeping", "watchdog", "openwebui_pull"}
    assert len(set(first.values())) == len(first), first  # no two jobs fire together
    # housekeeping's moment with the training lock is over (with room for the retrain's wait)
    # before the retrain checks, at the first run and at every later one
    patience = timedelta(seconds=runs.BRIEF_HOLD_PATIENCE_SECONDS)
    assert first["housekeeping"] + patience < first["retrain"]

    def fire_times(job, n=48):
        times, at = [], job.next_run_time
        for _ in range(n):
            times.append(at)
            at = job.trigger.get_next_fire_time(at, at + timedelta(microseconds=1))
        return times

    gaps = [abs(h - r) for h in fire_times(jobs["housekeeping"]) for r in fire_times(jobs["retrain"])]
    assert min(gaps) > patience


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
        result = jobs.housekeeping_tick()
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
        started = jobs.monitor_tick()
        assert started["action"] == "start"
        exp = db.session.scalars(db.select(Experiment)).one()
        assert (exp.status, exp.control_version.name, exp.variant_version.name) == ("running", "v1-base", "v2-ppo")
        assert jobs.monitor_tick()["action"] == "wait"  # no data yet
        exp_id = exp.id
    _answers(app, exp_id, "control", 1, ups=10, n=60)
    _answers(app, exp_id, "variant", 2, ups=55, n=60)
    with app.app_context():
        decided = jobs.monitor_tick()
        assert decided["action"] == "promote" and decided["numbers"]["p_value"] < 0.05
        assert decided["numbers"]["n_control"] == decided["numbers"]["n_variant"] == 60  # users, one answer each
        assert {v.name: v.status for v in db.session.scalars(db.select(ModelVersion))} == \
            {"v1-base": "retired", "v2-ppo": "active"}
        event = db.session.scalars(db.select(AuditEvent).filter_by(action="experiment_conclude")).one()
        assert event.actor == "scheduler" and event.detail["numbers"]["policy"]["action"] == "promote"
        assert jobs.monitor_tick() == {"action": "idle"}  # the candidate was tried; nothing new


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
           # (the held-out evidence is reported, not required; only the safety checks decide)
           "RLHF_TRAINING_GATE_EVIDENCE": "reported", "RLHF_GATE_MAX_KL": "1e9", "RLHF_COMPARE_RATE": "0",
           "RLHF_MIN_PAIRS": "3"}
    server = LiveServer(inst, env=env)
    try:
        prompts = prompt_set(30)
        events = 0
        for i in range(40):
            # the micro model talks noise, which an on-topic judge dislikes: corrections give pairs. Each user
            # asks a follow-up in the same chat, rated in its context
            user = SimulatedUser(server.url, "on_topic", seed=i, behaviour=Behaviour(correction_prob=0.6))
            for turn in range(2):
                events += sum(x.events for x in user.ask(prompts[(i + 7 * turn) % len(prompts)], follow_up=turn > 0))
            if events >= 30:
                break
        assert events >= 30
        app = make_app(inst)
        with app.app_context():  # the follow-ups are second turns of the users' chats, and were rated
            second_turns = [m for m in db.session.scalars(db.select(Message).filter_by(role="user"))
                            if db.session.scalar(db.select(db.func.count(Message.id)).filter(
                                Message.conversation_id == m.conversation_id, Message.role == "user",
                                Message.id < m.id))]
            assert second_turns
            rated = {f.message_id for f in db.session.scalars(db.select(Feedback))}
            assert any(a.id in rated for a in db.session.scalars(db.select(Message).filter(
                Message.parent_id.in_([m.id for m in second_turns]))))

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
    from tests.support.app import flask_cli

    result = flask_cli("serve", "--workers", "2")
    assert result.exit_code == 1
    assert "would run once per worker with --workers 2: set RLHF_SCHEDULER=0" in result.output
