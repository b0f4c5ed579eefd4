"""`rl-train` and `export-feedback` end to end on the micro model: runs, refusals, crashes."""
from __future__ import annotations

import json

import pytest

from rlhf.models import registry
from tests.support.app import flask_cli as cli
from tests.support.app import make_app, register_model
from tests.support.app import runs_and_versions as state
from tests.support.feedback_factory import seed_feedback
from webapp.core.extensions import db
from webapp.core.models import Conversation, ModelVersion, TrainingRun

pytestmark = pytest.mark.slow

FAST = {"RLHF_PPO_EPISODES": "32", "RLHF_POLICY_LR": "1e-3"}


@pytest.fixture
def instance(tmp_path, micro_model_dir, monkeypatch):
    inst = tmp_path / "instance"
    register_model(make_app(inst), micro_model_dir)
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    monkeypatch.setenv("RLHF_DEVICE", "cpu")
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)
    return inst


def test_refuses_without_enough_feedback(instance):
    result = cli("rl-train")
    assert result.exit_code == 2
    assert "Error: not enough feedback yet: 0 feedback events, need at least 50" in result.output
    assert state(instance) == ([], [("v1-base", "active")])


def test_refuses_when_feedback_gives_no_pairs(instance):
    seed_feedback(make_app(instance), 3, correction_rate=0, vote_rate=0)
    result = cli("rl-train", "--min-feedback", "0")
    assert result.exit_code == 2 and "preference pairs for training" in result.output
    assert state(instance)[0] == []


@pytest.mark.parametrize("args,needle", [(["--max-steps", "0"], "--max-steps must be at least 1"),
                                         (["--min-feedback", "-1"], "--min-feedback must be >= 0"),
                                         (["--algorithm", "sft"], "Invalid value for '--algorithm'")])
def test_refuses_invalid_settings(instance, args, needle):
    result = cli("rl-train", *args)
    assert result.exit_code == 2 and needle in result.output
    assert state(instance)[0] == []


def test_refuses_while_another_run_holds_the_lock(instance):
    from webapp.core import locks

    seed_feedback(make_app(instance), 40)
    # as a running training process would (it records which run it is)
    with locks.held(instance / "training.lock", job="training run", doing="training", run_id=7):
        result = cli("rl-train", "--min-feedback", "10")
    assert result.exit_code == 2 and "another training run (#7) is in progress" in result.output
    assert state(instance)[0] == []


def test_waits_out_housekeepings_moment_with_the_lock(instance, monkeypatch):
    """Housekeeping holds the training lock for a moment (cleaning up stale runs) as a run
    starts: the run waits for it instead of refusing as if another run held the lock (here it
    then gets as far as counting the feedback)."""
    import threading

    from webapp.core import locks

    seed_feedback(make_app(instance), 3)
    contender_waits, seen = threading.Event(), []
    read = locks._read_record

    def reading(path):  # a contender reads the holder's record each time it finds the lock taken
        record = read(path)
        if record.get("job") == "housekeeping":
            seen.append(record)
            contender_waits.set()
        return record

    monkeypatch.setattr(locks, "_read_record", reading)
    lock = locks.acquire(instance / "training.lock", wait=False, job="housekeeping", doing="cleaning up stale runs",
                         brief=True)
    releaser = threading.Thread(target=lambda: (contender_waits.wait(120), lock.close()))
    releaser.start()
    try:
        result = cli("rl-train", "--min-feedback", "1000")
    finally:
        contender_waits.set()
        releaser.join(120)
    assert seen and lock.closed  # the run found housekeeping there, and it let go
    assert result.exit_code == 2, result.output
    assert "not enough feedback yet" in result.output and "in progress" not in result.output


def test_full_cycle_registers_a_version_and_recovers_a_dead_run(instance):
    app = make_app(instance)
    events = seed_feedback(app, 60)
    with app.app_context():  # a run whose process died without cleaning up
        db.session.add(TrainingRun(trigger="cli", status="running", stage="policy", pid=999999, hostname="gone"))
        db.session.commit()
    result = cli("rl-train", "--min-feedback", "10", "--json")
    assert result.exit_code in (0, 3), result.output
    out = json.loads(result.stdout)
    assert set(out) >= {"run_id", "status", "data_counts", "reward_model", "policy", "evaluation", "version",
                        "decision"}
    assert out["status"] == "succeeded" and out["data_counts"]["events"] == events
    assert out["reward_model"]["heldout_accuracy"] is not None and out["reward_model"]["train_pairs"] > 0
    assert (out["evaluation"]["before"]["mean_reward"] is not None
            and out["evaluation"]["after"]["mean_reward"] is not None)
    # the gate's held-out evidence: the held-out pairs and the held-out rated pairs across questions
    ev = out["evaluation"]
    held_out = out["data_counts"]["pairs"]["eval"] + out["data_counts"]["rated_pairs"]["eval"]
    assert ev["heldout"]["pairs"] == held_out and ev["optimized_against"]["decides"] is False
    if held_out < 8:  # the default training.gate.min_heldout_pairs
        assert ev["verdict"] == "not enough evidence" and ev["judge"] is None and not ev["passed"]
    else:  # the judge learned from the held-out pairs alone and was checked on training pairs
        assert ev["judge"]["trained_on_pairs"] == held_out
        assert ev["judge"]["accuracy_pairs"] == out["reward_model"]["train_pairs"]
    assert out["policy"]["algorithm"] == "ppo" and out["policy"]["updates"] == 2
    assert (result.exit_code == 0) == (out["decision"] == "candidate") == out["evaluation"]["passed"]
    version = out["version"]
    assert version["name"] == "v2-ppo" and version["parent"] == "v1-base"
    assert version["status"] == ("candidate" if out["evaluation"]["passed"] else "failed")
    assert registry.is_complete(version["path"])
    lineage = json.loads((instance / "models" / "v2-ppo" / "version.json").read_text())
    assert lineage["parent"] == "v1-base" and lineage["training_run"] == out["run_id"]
    assert lineage["data_counts"]["pairs"] == out["data_counts"]["pairs"]
    assert (instance / "runs" / f"run-{out['run_id']}" / "reward_model" / "config.json").is_file()
    runs, versions = state(instance)
    assert runs[0][0] == "failed" and "died" in runs[0][1]  # the dead run was recovered
    assert runs[1] == ("succeeded", None)
    assert versions == [("v1-base", "active"), ("v2-ppo", version["status"])]  # active unchanged


def test_a_cycle_with_enough_held_out_pairs_is_judged_by_them_and_a_judge_trained_on_them(instance):
    seed_feedback(make_app(instance), 60, preference="detailed", correction_rate=1.0, vote_rate=1.0)
    result = cli("rl-train", "--min-feedback", "10")
    assert result.exit_code in (0, 3), result.output
    assert "reward gain on the reward model the policy was optimized against (reported, never decides)" in result.output
    app = make_app(instance)
    with app.app_context():
        run = db.session.scalars(db.select(TrainingRun)).one()
        ev, counts, timings = run.metrics["evaluation"], run.feedback_counts["pairs"], run.metrics["timings"]
        rated = run.feedback_counts["rated_pairs"]
        log = run.log
    evidence = counts["eval"] + rated["eval"]  # held-out pairs and held-out rated pairs across questions
    assert counts["eval"] >= 8 and rated["eval"] > 0 and ev["heldout"]["pairs"] == evidence
    assert ev["verdict"] in ("passed", "rejected") and (result.exit_code == 0) == ev["passed"]
    judge = ev["judge"]
    assert judge["trained_on_pairs"] == evidence and judge["accuracy_pairs"] == counts["train"]
    assert judge["prompts"] == ev["prompts"] and isinstance(judge["trusted"], bool)
    assert ev["judged_by"][1].startswith(f"judge reward model trained on {evidence} held-out pairs")
    assert f"judge: reward model trained on {evidence} held-out pairs" in log and timings["judge"] > 0
    assert f"evaluation gate: {ev['verdict']}; judged by: held-out preferences" in result.output


def test_alternative_algorithm_and_hyperparameters_from_the_settings_file(instance):
    """The algorithm and any training hyperparameter come from instance/config.toml; the run and
    the new version record the settings they were trained with."""
    seed_feedback(make_app(instance), 40)
    (instance / "config.toml").write_text('[training]\nalgorithm = "dpo"\n\n'
                                          '[training.policy]\nbeta = 0.25\nmax_steps = 2\n')
    result = cli("rl-train", "--min-feedback", "10", "--json")
    assert result.exit_code in (0, 3), result.output
    out = json.loads(result.stdout)
    assert out["policy"]["algorithm"] == "dpo" and out["version"]["name"] == "v2-dpo"
    app = make_app(instance)
    with app.app_context():
        run = db.session.get(TrainingRun, out["run_id"])
        assert run.algorithm == "dpo" and run.config["algorithm"] == "dpo"
        assert run.config["policy"]["beta"] == 0.25 and run.config["policy"]["max_steps"] == 2
        assert run.config["reward"]["learning_rate"] == 5e-4  # every field is recorded, defaults too
        version = db.session.get(ModelVersion, run.version_id)
        assert version.config["policy"]["beta"] == 0.25
    result = cli("rl-train", "--min-feedback", "10", "--algorithm", "kto", "--max-steps", "0")
    assert result.exit_code == 2 and "--max-steps must be at least 1" in result.output  # the CLI still overrides


def test_crash_midway_leaves_active_version_and_store_consistent(instance, monkeypatch):
    import rlhf.policy.ppo

    seed_feedback(make_app(instance), 40)

    def crash(policy_dir, reward_dir, prompts, out_dir, *a, **k):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text("{}")  # half-written policy
        raise RuntimeError("killed mid-way")

    monkeypatch.setattr(rlhf.policy.ppo, "train_ppo", crash)  # what the PPO algorithm trains with
    result = cli("rl-train", "--min-feedback", "10")
    assert result.exit_code == 1 and "training run failed: RuntimeError: killed mid-way" in result.output
    runs, versions = state(instance)
    assert runs == [("failed", "RuntimeError: killed mid-way")]
    assert versions == [("v1-base", "active")]
    assert sorted(p.name for p in (instance / "models").iterdir()) == ["v1-base"]
    assert not list((instance / "runs").glob(".tmp-*"))
    monkeypatch.undo()
    # the next run succeeds
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(instance))
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)
    again = cli("rl-train", "--min-feedback", "10")
    assert again.exit_code in (0, 3), again.output
    assert state(instance)[0][-1] == ("succeeded", None)


def test_export_feedback_in_trl_columns_without_deleted_conversations(instance, tmp_path):
    app = make_app(instance)
    seed_feedback(app, 30)
    with app.app_context():
        victim = db.session.scalars(db.select(Conversation).order_by(Conversation.id)).first()
        victim.deleted_at = victim.created_at
        db.session.commit()
        victim_title = victim.title
        victim_id = victim.id
    expected = {"pairs": {"prompt", "chosen", "rejected", "margin"}, "kto": {"prompt", "completion", "label"},
                "sft": {"prompt", "completion"}, "raw": {"id", "messages", "comparisons"}}
    for fmt, columns in expected.items():
        out = tmp_path / f"{fmt}.jsonl"
        result = cli("export-feedback", "--format", fmt, "--output", str(out))
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert rows and all(columns <= set(r) for r in rows)
        if fmt == "raw":
            assert victim_id not in {r["id"] for r in rows}
        else:
            assert all(r["split"] in ("train", "eval") for r in rows)
    assert victim_title  # the deleted conversation's question may recur in others; its id must not
    bad = cli("export-feedback", "--format", "csv", "--output", str(tmp_path / "x"))
    assert bad.exit_code == 2 and "Invalid value for '--format'" in bad.output


def test_a_run_weighs_its_raters_and_stores_their_assessments(instance):
    """The runner hands every rater's admin setting and history to rlhf.trust: a rater an
    admin quarantined trains nothing, the run records what each rule did, and every rater's
    assessment is stored for the raters page and the verdicts."""
    from webapp.core.models import RaterAssessment, RaterTrust
    from webapp.core.raters import excluded_raters

    app = make_app(instance)
    seed_feedback(app, 60)
    with app.app_context():
        raters = sorted({c.user_id for c in db.session.scalars(db.select(Conversation))})
        db.session.add(RaterTrust(user_id=raters[0], trust="quarantined", note="a test"))
        db.session.commit()
    result = cli("rl-train", "--min-feedback", "10", "--json")
    assert result.exit_code in (0, 3), result.output
    with app.app_context():
        run = db.session.scalars(db.select(TrainingRun)).one()
        trust = run.feedback_counts["trust"]
        assert trust["rules"]["quarantined"]["raters"] == 1 and trust["rules"]["quarantined"]["rows"] > 0
        stored = {a.user_id: a for a in db.session.scalars(db.select(RaterAssessment))}
        assert set(stored) == set(raters)
        assert (stored[raters[0]].status, stored[raters[0]].weight) == ("quarantined", 0)
        assert all(a.training_run_id == run.id for a in stored.values())
        assert all(a.weight > 0 for uid, a in stored.items() if uid != raters[0])
        assert raters[0] in excluded_raters()
        assert "rater trust:" in (run.log or "")


def test_the_data_stage_runs_once_and_its_outcome_is_handed_on(instance, micro_model_dir, monkeypatch):
    """The runner prepares the data once (built, weighed by its raters, the stages sized to it) and hands
    that very outcome to the cycle and to the other training processes; the run records its sizes."""
    import shutil

    import rlhf.cycle
    import webapp.training.runner
    from rlhf.cycle import CycleResult
    from rlhf.training import distributed

    app = make_app(instance)
    seed_feedback(app, 40)
    built, sent, trained = [], [], []
    build = rlhf.cycle.build_datasets
    monkeypatch.setattr(rlhf.cycle, "build_datasets", lambda *a, **k: built.append(1) or build(*a, **k))
    monkeypatch.setattr(distributed, "broadcast", lambda job: sent.append(job) or job)

    def run_prepared(prepared, parent_path, reward_dir, policy_dir, progress=None, log=None, logs=None):
        trained.append(prepared)  # no training: the parent's weights stand in for the trained models
        shutil.copytree(micro_model_dir, reward_dir)
        shutil.copytree(micro_model_dir, policy_dir)
        return CycleResult(counts=prepared.bundle.counts, reward={}, policy={}, timings={},
                           evaluation={"passed": False, "reasons": ["not judged"]})

    monkeypatch.setattr(webapp.training.runner, "run_prepared", run_prepared)
    result = cli("rl-train", "--min-feedback", "10")
    assert result.exit_code in (0, 3), result.output
    assert len(built) == 1
    [prepared] = trained
    assert [job.prepared for job in sent if job is not None] == [prepared]
    with app.app_context():
        run = db.session.scalars(db.select(TrainingRun)).one()
        assert run.config["policy"] == json.loads(json.dumps(prepared.settings.to_dict()["policy"]))
        assert run.config["reward"] == json.loads(json.dumps(prepared.settings.to_dict()["reward"]))
        assert {k: v for k, v in run.feedback_counts.items() if k != "events"} == \
            json.loads(json.dumps(prepared.bundle.counts))


def test_feedback_given_during_the_data_stage_counts_for_the_next_run(instance, micro_model_dir, monkeypatch):
    """Feedback that arrives after a run read its data is not in that run: the scheduler must count it
    as new for the next one (a run's start is when it read its data, not when its data stage ended)."""
    import shutil

    import rlhf.cycle
    import webapp.training.runner
    from rlhf.cycle import CycleResult
    from webapp.training import jobs
    from webapp.training.records import feedback_event_count

    app = make_app(instance)
    seed_feedback(app, 40)
    during = []
    build = rlhf.cycle.build_datasets

    def build_while_users_rate(*a, **k):  # the records are read: more feedback arrives meanwhile
        during.append(seed_feedback(app, 5, seed=9, vote_rate=0))  # (the factory writes no vote time)
        return build(*a, **k)

    def run_prepared(prepared, parent_path, reward_dir, policy_dir, progress=None, log=None, logs=None):
        shutil.copytree(micro_model_dir, reward_dir)  # no training: the parent stands in for the models
        shutil.copytree(micro_model_dir, policy_dir)
        return CycleResult(counts=prepared.bundle.counts, reward={}, policy={}, timings={},
                           evaluation={"passed": False, "reasons": ["not judged"]})

    monkeypatch.setattr(rlhf.cycle, "build_datasets", build_while_users_rate)
    monkeypatch.setattr(webapp.training.runner, "run_prepared", run_prepared)
    result = cli("rl-train", "--min-feedback", "10")
    assert result.exit_code in (0, 3), result.output
    with app.app_context():
        run = db.session.scalars(db.select(TrainingRun)).one()
        assert run.status == "succeeded" and during[0] > 0
        assert run.feedback_counts["events"] + during[0] == feedback_event_count()
        assert jobs.new_feedback_events() == during[0]


@pytest.mark.parametrize("args,algorithm", [([], "iterative_dpo"), (["--algorithm", "ppo"], "ppo")])
def test_a_large_parent_trains_with_the_large_model_settings_except_the_operators(instance, monkeypatch, args,
                                                                                   algorithm):
    """rl-train sizes its settings to the parent (rlhf.models.size_settings); the threshold is lowered
    so the micro model counts as large. What the operator set (here RLHF_PPO_EPISODES and
    RLHF_POLICY_LR in the environment, the reward model's learning rate, and --algorithm) stays theirs."""
    from rlhf.models import size_settings as model_size

    monkeypatch.setattr(model_size, "LARGE_PARAMETERS", 1)
    monkeypatch.setenv("RLHF_TRAINING_REWARD_LEARNING_RATE", "2e-3")
    seed_feedback(make_app(instance), 40)
    result = cli("rl-train", "--min-feedback", "10", "--json", *args)
    assert result.exit_code in (0, 3), result.output
    out = json.loads(result.stdout)
    with make_app(instance).app_context():
        run = db.session.get(TrainingRun, out["run_id"])
        config, log, recorded = run.config, run.log, run.algorithm
    large = model_size.LARGE
    assert out["algorithm"] == recorded == config["algorithm"] == out["policy"]["algorithm"] == algorithm
    assert config["reward"]["trainable_layers"] == 2 and config["reward"]["min_steps"] == large["reward.min_steps"]
    assert config["policy"]["lora"] is True and config["policy"]["response_length"] == large["policy.response_length"]
    assert config["policy"]["missing_eos_penalty"] == 0.0
    assert config["evaluation"]["judge_min_steps"] == large["evaluation.judge_min_steps"]
    assert config["evaluation"]["judge_min_questions"] == large["evaluation.judge_min_questions"]
    # the operator's settings
    assert config["reward"]["learning_rate"] == 2e-3
    assert config["policy"]["episodes"] == 32 and config["policy"]["learning_rate"] == 1e-3
    sized = log.split("sized to the model:")[1].splitlines()[0]
    assert "reward.trainable_layers=2" in sized and "reward.learning_rate" not in sized
    assert ("algorithm=" in sized) == (algorithm == "iterative_dpo")
    assert out["policy"]["lora"] is True and out["reward_model"]["steps"] >= large["reward.min_steps"]
