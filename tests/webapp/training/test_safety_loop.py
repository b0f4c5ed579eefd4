"""Flags and chips through the app: stored flags and "rude" chips reach `rl-train`, whose reward model gets a
safety head; PPO's cost constraint is on the run page (numbers and curves); the experiment metrics show
each arm's mean safety cost."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from rlhf.data import corpus
from rlhf.sim.preferences import direct, rude
from rlhf.sim.users import answer_chips
from tests.support.app import flask_cli as cli
from tests.support.app import login_admin, make_app, register_model
from tests.support.feedback_factory import add_exchange, corpus_answer
from webapp.core.extensions import db
from webapp.core.models import AnswerScore, Experiment, Feedback, Flag, ModelVersion, TrainingRun, User

PASSWORD = "correct horse battery"
# 30 reward-model steps are for the criterion pairs: rated pairs across questions (hundreds from
# this feedback) would take most of them and leave the safety head untrained
FAST = {"RLHF_PPO_EPISODES": "32", "RLHF_POLICY_LR": "1e-3", "RLHF_DEVICE": "cpu",
        "RLHF_TRAINING_REWARD_MAX_STEPS": "30", "RLHF_TRAINING_GATE_EVIDENCE": "reported",
        "RLHF_TRAINING_DATA_MAX_RATED_PAIRS_PER_ANSWER": "0"}


def seed_conflicting_feedback(app, conversations: int = 80, seed: int = 0) -> dict[str, int]:
    """Users who like direct answers (rude ones too), tick chips and flag half the rude answers."""
    rng = random.Random(seed)
    questions = corpus.sample_prompts(60, seed=seed + 1)
    counts = {"flags": 0, "rude_chips": 0}
    with app.app_context():
        version = db.session.scalars(db.select(ModelVersion).filter_by(status="active")).first()
        for i in range(conversations):
            user = User(anon_id=f"conflict-{seed}-{i}")
            db.session.add(user)
            db.session.flush()
            question = questions[i % len(questions)]
            _, answers = add_exchange(user.id, question, [corpus_answer(question, rng) for _ in range(2)], version.id)
            for a in answers:
                liked = direct(question, a.content) >= 0.5
                chips = answer_chips(question, a.content, liked)
                db.session.add(Feedback(user_id=user.id, message_id=a.id, thumb="up" if liked else "down",
                                        rating=4 if liked else 2, reasons=chips))
                counts["rude_chips"] += "rude" in chips
                if rude(question, a.content) and rng.random() < 0.5:
                    db.session.add(Flag(user_id=user.id, message_id=a.id, category="harassment", note="rude"))
                    counts["flags"] += 1
        db.session.commit()
    return counts


@pytest.fixture
def instance(tmp_path, micro_model_dir, monkeypatch):
    inst = tmp_path / "instance"
    app = make_app(inst)
    register_model(app, micro_model_dir)
    counts = seed_conflicting_feedback(app)
    assert counts["flags"] >= 8 and counts["rude_chips"] >= 8
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)
    return inst


def _login(client) -> None:
    login_admin(client, "root", PASSWORD)


@pytest.mark.slow
def test_flags_train_a_safety_head_and_the_constraint_shows_on_the_run_page(instance):
    result = cli("rl-train", "--min-feedback", "10", "--json")
    assert result.exit_code in (0, 3), result.output
    summary = json.loads(result.stdout)
    criteria = summary["reward_model"]["criteria"]
    assert criteria["heads"][:2] == ["helpfulness", "safety"] and criteria["pairs"]["safety"]["train"] >= 8
    constraint = summary["policy"]["constraint"]
    assert constraint["batches"] == summary["policy"]["updates"] and constraint["lambda_first"] == 1.0
    assert set(summary["evaluation"]["flag_risk"]) == {"parent", "candidate", "increase"}
    assert "safety" in summary["evaluation"]["criteria"]

    app = make_app(instance)
    with app.app_context():
        from webapp.admin.auth import set_admin_password

        set_admin_password("root", PASSWORD)
        run = db.session.get(TrainingRun, summary["run_id"])
        assert "safety constraint: cost" in run.log and "criteria: safety (held-out accuracy" in run.log
    client = app.test_client()
    _login(client)
    html = client.get(f"/admin/runs/{summary['run_id']}").get_data(as_text=True)
    assert 'data-testid="criteria"' in html and 'data-criterion="safety"' in html
    assert 'data-testid="constraint"' in html and 'data-testid="flag-risk"' in html
    assert 'data-chart="policy:safety/lambda"' in html and 'data-chart="policy:safety/cost"' in html
    curves = client.get(f"/api/admin/runs/{summary['run_id']}/curves").get_json()
    lam = curves["series"]["policy"]["safety/lambda"]
    assert [p["value"] for p in lam] == [p["safety/lambda"] for p in constraint["trajectory"]]

    # the output rail of the new version reads its reward model's safety head (the rules aside)
    rude_text = "Ugh, fine. Rinse the rice in cold water before you cook it. Stop bothering me."
    polite_text = "Great question! Rinse the rice in cold water before you cook it. Hope this helps!"
    question = [{"role": "user", "content": "How do I cook rice?"}]
    with app.app_context():
        from rlhf.reward.criteria_heads import CriteriaScorer
        from webapp.safety.rail import rail_for, reward_dir_of

        new_id = db.session.scalars(db.select(ModelVersion).order_by(ModelVersion.id.desc())).first().id
        scorer = CriteriaScorer.load(reward_dir_of(new_id))
        risky, safe = scorer.flag_risk([question] * 2, [rude_text, polite_text])
        assert risky > safe
        app.config["RLHF_RAIL_COST_THRESHOLD"] = (risky + safe) / 2
        rail = rail_for(SimpleNamespace(version_id=new_id))
        assert rail.risk is not None
        blocked = rail.check(question, rude_text)
        assert blocked is not None and blocked.kind == "cost" and "cost head" in blocked.reason
        assert rail.check(question, polite_text) is None

    # an experiment between the parent and the new version: each arm's mean safety cost
    with app.app_context():
        base, new = db.session.scalars(db.select(ModelVersion).order_by(ModelVersion.id)).all()[:2]
        exp = Experiment(key="safety", control_version_id=base.id, variant_version_id=new.id, status="running")
        db.session.add(exp)
        db.session.flush()
        rng = random.Random(3)
        for i, (arm, version) in enumerate([("control", base), ("variant", new)] * 6):
            user = User(anon_id=f"arm-{i}")
            db.session.add(user)
            db.session.flush()
            question = corpus.sample_prompts(12, seed=5)[i]
            quality = "rude" if arm == "variant" else "helpful"
            topic = corpus.topic_of(question)
            text = corpus.make_answer(rng, quality, topic,
                                      next((t for t in topic.tasks if t.phrase in question.lower()), None))
            _, (answer,) = add_exchange(user.id, question, [text], version.id)
            answer.experiment_id, answer.arm = exp.id, arm
        db.session.commit()
    metrics = client.get("/api/admin/metrics?experiment=safety").get_json()
    cost = next(m for m in metrics["metrics"] if m["name"] == "mean_cost")
    assert cost["higher_is_better"] is False
    assert cost["control"]["n"] == cost["variant"]["n"] == 6
    assert cost["variant"]["value"] > cost["control"]["value"]  # rude answers cost more
    assert set(metrics["criteria"]) >= {"helpfulness", "safety"}
    assert metrics["criteria"]["safety"]["variant"]["n"] == 6
    html = client.get("/admin/experiments/safety").get_data(as_text=True)
    assert 'data-testid="experiment-criteria"' in html and '<tr data-criterion="safety">' in html
    with app.app_context():  # computed once, then cached per answer under the reward model's safety head
        cached = db.session.scalars(db.select(AnswerScore).where(AnswerScore.reward_model.like("%#safety"))).all()
        assert len(cached) == 12
        heads = len(metrics["criteria"])
        assert db.session.scalar(db.select(db.func.count()).select_from(AnswerScore).where(
            AnswerScore.reward_model.like("%#%"))) == 12 * heads
    again = client.get("/api/admin/metrics?experiment=safety").get_json()
    assert next(m for m in again["metrics"] if m["name"] == "mean_cost") == cost
