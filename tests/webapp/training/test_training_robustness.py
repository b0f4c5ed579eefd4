"""Training never hangs: small or odd feedback sets end in a version, a refusal or a clear
failure in bounded time, and a run that stops making progress is stopped by the watchdog.

The property tests run every algorithm, with and without LoRA, on random small feedback sets
(few conversations, repeated questions, only thumbs up, only corrections, one user, empty
comments and answers, very long and non-ASCII texts) written into a real database, through
``run_training`` (what ``rl-train`` runs) on the micro model."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from rlhf.settings import EvalSettings, RewardSettings
from tests.support.app import make_app, register_model
from tests.support.app import runs_and_versions as state
from tests.support.feedback_factory import add_exchange
from tests.support.paths import ROOT
from webapp.core.extensions import db
from webapp.core.models import Comparison, Feedback, TrainingRun, User, utcnow

pytestmark = pytest.mark.slow

RUN_TIME_LIMIT_S = 300  # far above what any of these runs needs; past it the run counts as hung

QUESTIONS = ["How do I cook rice?", "How do I cook rice?", "What should I plant in spring?",
             "¿Cómo duermo mejor? 睡眠について教えて 🌙", "How do I learn Python " + "quickly " * 300 + "?",
             "Tell me about saving money.", "What is a good stretch after running?"]
ANSWERS = ["Rinse the rice, then simmer it covered for 15 minutes.", "Figure it out yourself.",
           "", "Ja. Нет. 是的。 " * 3, "Water the soil deeply once a week. " * 80,
           "Stars are far away. Anyway, where was I?", "Sleep at the same time every night."]

feedback_st = st.fixed_dictionaries({
    "thumb": st.sampled_from([None, "up", "down"]),
    "rating": st.sampled_from([None, 1, 3, 5]),
    "correction": st.sampled_from([None, None, "Rinse it first, then simmer it for 15 minutes.", "✓ " * 5]),
    "comment": st.sampled_from([None, "", "meh"]),
})
conversation_st = st.fixed_dictionaries({
    "user": st.integers(0, 2),
    "question": st.integers(0, len(QUESTIONS) - 1),
    "answers": st.lists(st.tuples(st.integers(0, len(ANSWERS) - 1), feedback_st), min_size=1, max_size=3),
    "vote": st.sampled_from([None, "a", "b", "tie", "both_bad"]),
})
feedback_set_st = st.one_of(
    st.lists(conversation_st, min_size=1, max_size=12),
    # only thumbs up (no preference at all)
    st.lists(conversation_st.map(lambda c: {**c, "vote": None, "answers": [
        (a, {"thumb": "up", "rating": None, "correction": None, "comment": None}) for a, _ in c["answers"]]}),
        min_size=1, max_size=8),
    # only corrections, one user
    st.lists(conversation_st.map(lambda c: {**c, "user": 0, "vote": None, "answers": [
        (a, {"thumb": None, "rating": None, "correction": "Rinse it first, then simmer it.", "comment": None})
        for a, _ in c["answers"]]}), min_size=1, max_size=8),
)


def write_feedback(app, conversations: list[dict]) -> None:
    with app.app_context():
        users = {}
        for conv in conversations:
            if conv["user"] not in users:
                user = User(anon_id=f"prop-{conv['user']}")
                db.session.add(user)
                db.session.flush()
                users[conv["user"]] = user.id
            uid = users[conv["user"]]
            q, answers = add_exchange(uid, QUESTIONS[conv["question"]], [ANSWERS[a] for a, _ in conv["answers"]], 1)
            for message, (_, fb) in zip(answers, conv["answers"]):
                if any(v is not None for v in fb.values()):
                    db.session.add(Feedback(user_id=uid, message_id=message.id, reasons=[], **fb))
            if conv["vote"] and len(answers) >= 2:
                db.session.add(Comparison(user_id=uid, prompt_message_id=q.id, message_a_id=answers[0].id,
                                          message_b_id=answers[1].id, winner=conv["vote"], voted_at=utcnow()))
        db.session.commit()


def run_bounded(app, **kwargs) -> tuple[str, object]:
    """``run_training`` in a thread: ('ok', summary) / ('refused', message) / ('error', exc), or a
    test failure if it has not ended within RUN_TIME_LIMIT_S."""
    from webapp.training.runner import run_training
    from webapp.training.runs import RunRefused

    outcome: list[tuple[str, object]] = []

    def target() -> None:
        with app.app_context():
            try:
                outcome.append(("ok", run_training(**kwargs)))
            except RunRefused as exc:
                outcome.append(("refused", str(exc)))
            except BaseException:  # noqa: BLE001 -- reported by the test, with where it happened
                outcome.append(("error", traceback.format_exc()[-4000:]))
            finally:
                db.session.remove()

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(RUN_TIME_LIMIT_S)
    assert not worker.is_alive(), f"run_training({kwargs.get('algorithm')}) still running after {RUN_TIME_LIMIT_S} s"
    return outcome[0]


FAST = dict(min_feedback=0, reward=RewardSettings(min_steps=4, epochs=1.0),
            evaluation=EvalSettings(samples_per_prompt=1, max_prompts=4, max_new_tokens=12))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("algorithm", ["ppo", "dpo", "kto", "rloo"])
# no shrinking: each example is a training run, and the failing one is printed as it is
@settings(max_examples=5, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(feedback=feedback_set_st)
def test_small_and_odd_feedback_sets_end_in_a_version_or_a_refusal(micro_model_dir, algorithm, lora, feedback):
    with tempfile.TemporaryDirectory(prefix="prop-") as tmp:
        instance = Path(tmp) / "instance"
        # the cycle's own thresholds as low as they go, so tiny data reaches every trainer
        app = make_app(instance, RLHF_PPO_EPISODES=16, RLHF_MIN_PAIRS=1, RLHF_DEVICE="cpu")
        register_model(app, micro_model_dir)
        write_feedback(app, feedback)
        base = (instance / "models" / "v1-base" / "model.safetensors").read_bytes()
        kind, result = run_bounded(app, algorithm=algorithm, lora=lora, max_steps=2, min_prompts=1, **FAST)
        event(kind if kind != "ok" else result["decision"])  # --hypothesis-show-statistics: how runs ended
        assert kind in ("ok", "refused"), f"{algorithm} lora={lora} crashed:\n{result}"
        if kind == "refused":
            assert "not enough feedback yet" in result, result
            assert state(instance)[0] == []  # a refusal stores no run
        else:
            assert result["decision"] in ("candidate", "rejected_by_gate")
            assert result["status"] == "succeeded"
        # the active version is untouched, whatever happened
        assert state(instance)[1][0] == ("v1-base", "active")
        assert (instance / "models" / "v1-base" / "model.safetensors").read_bytes() == base
        assert not list((instance / "runs").glob(".tmp-run-*")) if (instance / "runs").exists() else True


# ---------------------------------------------------------------------------- the reported hang

def few_prompts_feedback(app) -> None:
    """The report: a handful of distinct questions (6), 14 conversations, 14 rated answer pairs
    (about 11 for training), fewer training prompts than PPO's batch of 16."""
    import random

    from tests.support.feedback_factory import corpus_answer_of_quality

    rng = random.Random(5)
    questions = ["How do I cook rice?", "What should I plant in spring?", "How do I sleep better?",
                 "How do I save money?", "How do I learn Python?", "How do I train my dog?"]
    with app.app_context():
        for i in range(14):
            user = User(anon_id=f"few-{i % 3}-{i}")
            db.session.add(user)
            db.session.flush()
            q = questions[i % 6]
            _, (good, bad) = add_exchange(user.id, q, [corpus_answer_of_quality(q, "helpful", rng),
                                                       corpus_answer_of_quality(q, "rude", rng)], 1)
            db.session.add_all([Feedback(user_id=user.id, message_id=good.id, thumb="up", rating=5, reasons=[]),
                                Feedback(user_id=user.id, message_id=bad.id, thumb="down", rating=1, reasons=[])])
        db.session.commit()


def test_ppo_with_fewer_prompts_than_its_batch_trains_instead_of_hanging(tmp_path, micro_model_dir):
    """`rl-train --lora --min-feedback 5` on 6 distinct questions looped forever in TRL's
    repeat_generator (an empty drop_last dataloader); now PPO's batch fits the prompts."""
    instance = tmp_path / "instance"
    app = make_app(instance)
    register_model(app, micro_model_dir)
    few_prompts_feedback(app)
    env = {**os.environ, "RLHF_INSTANCE_DIR": str(instance), "RLHF_DEVICE": "cpu", "RLHF_PPO_EPISODES": "32",
           "RLHF_EMBEDDED_PRESET": "micro", "RLHF_AUTO_INIT_MODEL": "0"}
    try:
        done = subprocess.run([sys.executable, "-m", "flask", "--app", "webapp", "rl-train", "--lora",
                               "--min-feedback", "5", "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=RUN_TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rl-train still running after {RUN_TIME_LIMIT_S} s (the PPO hang)")
    assert done.returncode in (0, 3), done.stderr[-3000:]
    runs, versions = state(instance)
    assert [r[0] for r in runs] == ["succeeded"] and versions[0] == ("v1-base", "active")
    with app.app_context():
        run = db.session.scalars(db.select(TrainingRun)).one()
        assert "sized to the data: PPO: batch size 16 ->" in run.log
        assert run.config["policy"]["batch_size"] < 16 and run.config["limits"]["stall_seconds"] == 600


def test_a_stage_that_cannot_train_refuses_with_the_numbers(tmp_path, micro_model_dir):
    instance = tmp_path / "instance"
    app = make_app(instance, RLHF_MIN_PAIRS=1, RLHF_DEVICE="cpu")
    register_model(app, micro_model_dir)
    write_feedback(app, [{"user": 0, "question": 0, "vote": None, "answers": [
        (0, {"thumb": "up", "rating": None, "correction": None, "comment": None}),
        (1, {"thumb": "down", "rating": None, "correction": None, "comment": None})]}])
    kind, message = run_bounded(app, algorithm="ppo", min_prompts=1, **FAST)
    assert kind == "refused" and message == ("not enough feedback yet: 1 training prompts, PPO needs at least 2 "
                                             "(one per mini-batch) to fill a rollout batch")
    kind, message = run_bounded(app, algorithm="ppo", **FAST)  # the default of 4 distinct prompts
    assert kind == "refused" and message == "not enough feedback yet: 1 distinct user prompts, need at least 4"


# ---------------------------------------------------------------------------- the watchdog

def enough_feedback(app) -> None:
    from tests.support.feedback_factory import seed_feedback

    seed_feedback(app, 30, seed=3)


def test_watchdog_stops_a_run_without_heartbeats_and_the_next_run_succeeds(tmp_path, micro_model_dir, monkeypatch):
    from webapp.training.jobs import training_in_progress
    from webapp.training.runs import spawn_training

    instance = tmp_path / "instance"
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(instance))
    monkeypatch.setenv("RLHF_DEVICE", "cpu")
    monkeypatch.setenv("RLHF_PPO_EPISODES", "64")
    app = make_app(instance)
    register_model(app, micro_model_dir)
    enough_feedback(app)
    with app.app_context():
        run_id, proc = spawn_training("ppo", trigger="manual", min_feedback=0)
        assert db.session.get(TrainingRun, run_id).status == "queued"  # on the dashboard at once
    try:
        # wait (for the event, not for a time) until the child trains, then freeze it: no more heartbeats
        with app.app_context():
            deadline = utcnow() + timedelta(seconds=RUN_TIME_LIMIT_S)
            while True:
                db.session.expire_all()
                run = db.session.get(TrainingRun, run_id)
                if run.status == "running" and run.stage in ("reward", "policy"):
                    break
                assert run.status in ("queued", "running") and utcnow() < deadline, (run.status, run.error)
                proc.poll()
                threading.Event().wait(0.05)
        os.killpg(proc.pid, signal.SIGSTOP)
        with app.app_context():
            assert training_in_progress()
            limits = db.session.get(TrainingRun, run_id).config["limits"]
            from webapp.training import watchdog

            # the heartbeat is frozen; look at it as the watchdog will once the stall limit has passed
            later = utcnow() + timedelta(seconds=limits["stall_seconds"] + 1)
            health = watchdog.run_health(db.session.get(TrainingRun, run_id), later)
            assert health["overdue"] and "no progress" in health["overdue"]
            stopped = watchdog.enforce_run_limits(later)
            assert [(s["run_id"], s["killed"]) for s in stopped] == [(run_id, True)]
            assert proc.wait(30) == -signal.SIGKILL
            run = db.session.get(TrainingRun, run_id)
            assert run.status == "failed" and run.error.startswith("stopped by the watchdog: no progress for")
            assert not training_in_progress()  # the lock died with the process
            assert not (instance / "runs" / f".tmp-run-{run_id}").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    kind, result = run_bounded(app, algorithm="ppo", **FAST)  # the next run proceeds
    assert kind == "ok", result
    with app.app_context():
        assert [r.status for r in db.session.scalars(db.select(TrainingRun).order_by(TrainingRun.id))] == \
            ["failed", "succeeded"]


def test_the_runs_own_watchdog_fails_a_run_that_stops_reporting_progress(tmp_path, micro_model_dir):
    from webapp.training.watchdog import RunWatchdog

    app = make_app(tmp_path / "instance")
    with app.app_context():
        run = TrainingRun(status="running", stage="policy", started_at=utcnow(), heartbeat_at=utcnow(), pid=os.getpid())
        db.session.add(run)
        db.session.commit()
        run_id = run.id
    (tmp_path / "instance" / "runs" / f".tmp-run-{run_id}").mkdir(parents=True)
    guard = RunWatchdog(app, run_id, {"stall_seconds": 0.3, "max_seconds": 3600}, exit_process=False).start()
    guard.beat("policy")
    guard._thread.join(60)  # no further beats: it fires
    assert guard.fired and "no progress" in guard.fired and "during stage policy" in guard.fired
    with app.app_context():
        run = db.session.get(TrainingRun, run_id)
        assert run.status == "failed" and run.error.startswith("stopped by the watchdog: no progress")
    assert not (tmp_path / "instance" / "runs" / f".tmp-run-{run_id}").exists()


def test_a_quiet_run_shows_late_before_it_is_stopped(tmp_path):
    from webapp.training.watchdog import run_health

    app = make_app(tmp_path / "instance")
    now = utcnow()
    with app.app_context():
        run = TrainingRun(status="running", stage="policy", started_at=now - timedelta(seconds=400),
                          heartbeat_at=now - timedelta(seconds=200),
                          config={"limits": {"stall_seconds": 600, "max_seconds": 3600}})
        fresh = run_health(TrainingRun(status="running", stage="policy", started_at=now, heartbeat_at=now,
                                       config=run.config), now)
        health = run_health(run, now)
        overdue = run_health(run, now + timedelta(seconds=401))["overdue"]
    assert not fresh["late"] and fresh["overdue"] is None
    assert health["late"] and health["overdue"] is None
    assert health["message"] == "no progress for 200 s; stopped after 600 s without progress"
    assert overdue.startswith("no progress for 601 s")


def test_rloo_prompts_cut_through_a_multibyte_character_still_fit(micro_model_dir):
    """RLOO takes prompt text: a cut inside a multi-byte character decoded to U+FFFD, which
    re-encoded to more tokens than the cut (68 for 64), and prompt + answer overran the model's
    positions (IndexError), found by the property test above."""
    from transformers import AutoTokenizer

    from rlhf.policy.common import prompt_text_within

    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    messages = [{"role": "user", "content": "¿Cómo duermo mejor? 睡眠について教えて 🌙 " * 20}]
    text = prompt_text_within(tok, messages, 64)
    assert len(tok(text, add_special_tokens=False)["input_ids"]) <= 64
    assert text.endswith("\nAssistant:") and "\ufffd" not in text


def test_long_pairs_are_cut_to_the_reward_models_context_not_dropped(micro_model_dir):
    """TRL's RewardTrainer dropped every pair longer than its max_length: a small data set of
    long conversations had none left ("num_samples=0"), found by the property test above."""
    from transformers import AutoTokenizer

    from rlhf.reward.training import tokenized_pairs

    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    rows = [{"prompt": "User: " + "tell me more " * 100 + "\nAssistant:", "chosen": " Rinse it." + tok.eos_token,
             "rejected": " No." + tok.eos_token, "margin": 1.0}]
    [pair] = tokenized_pairs(tok, rows, 64)
    assert len(pair["chosen_ids"]) == len(pair["rejected_ids"]) == 64 and pair["margin"] == 1.0
    assert pair["chosen_ids"][-1] == pair["rejected_ids"][-1] == tok.eos_token_id  # the end is kept
    assert tok.decode(pair["chosen_ids"]).endswith("Assistant: Rinse it." + tok.eos_token)
