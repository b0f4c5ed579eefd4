"""The verdict is defended too: admins (who can see the arms) and quarantined raters are counted
out of an experiment's metrics -- their chats are answered and their rows kept -- and a user whose
first request is a side-by-side compare is assigned an arm (sticky) like everyone else."""
from __future__ import annotations

import pytest

from tests.support.app import ApiClient, make_app, register_model
from tests.support.feedback_factory import add_exchange
from webapp.core.extensions import db
from webapp.core.models import Assignment, Comparison, Experiment, Feedback, User, utcnow
from webapp.core.raters import set_trust, store_assessments
from webapp.experiments.assignment import arm_for
from webapp.experiments.metrics import experiment_metrics


def answer(exp: Experiment, user_id: int, arm: str, thumb: str) -> None:
    version = exp.control_version_id if arm == "control" else exp.variant_version_id
    _, (a,) = add_exchange(user_id, "How do I cook rice?", ["Simmer it for 12 minutes."], version)
    a.experiment_id, a.arm, a.latency_ms = exp.id, arm, 100.0
    db.session.add(Feedback(user_id=user_id, message_id=a.id, thumb=thumb, rating=4 if thumb == "up" else 2))


def thumbs(data: dict) -> dict:
    row = next(m for m in data["metrics"] if m["name"] == "thumbs_up_rate")
    return {arm: (row[arm]["value"], row[arm]["n"]) for arm in ("control", "variant")}


@pytest.fixture
def experiment(app, micro_model_dir):
    variant = register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    with app.app_context():
        exp = Experiment(key="integrity", control_version_id=1, variant_version_id=variant, status="running",
                         started_at=utcnow())
        db.session.add(exp)
        db.session.flush()
        for i in range(40):  # ordinary users: half of each arm's thumbs are up
            user = User(anon_id=f"user-{i}")
            db.session.add(user)
            db.session.flush()
            arm = ("control", "variant")[i % 2]
            db.session.add(Assignment(experiment_id=exp.id, user_id=user.id, arm=arm))
            answer(exp, user.id, arm, "up" if (i // 2) % 2 else "down")
        db.session.commit()
        return exp.id


def add_heavy_downvoter(exp_id: int, **user_fields) -> int:
    """A user in the variant who thumbs down 25 of its answers and votes for the control twice."""
    exp = db.session.get(Experiment, exp_id)
    user = User(**user_fields)
    db.session.add(user)
    db.session.flush()
    db.session.add(Assignment(experiment_id=exp.id, user_id=user.id, arm="variant"))
    for _ in range(25):
        answer(exp, user.id, "variant", "down")
    for _ in range(2):
        q, (a, b) = add_exchange(user.id, "Pasta?", ["Boil it.", "Salt the water, then boil it."])
        a.experiment_id, a.arm, b.experiment_id, b.arm = exp.id, "control", exp.id, "variant"
        a.model_version_id, b.model_version_id = exp.control_version_id, exp.variant_version_id
        db.session.add(Comparison(user_id=user.id, prompt_message_id=q.id, message_a_id=a.id, message_b_id=b.id,
                                  winner="a", voted_at=utcnow()))
    db.session.commit()
    return user.id


def test_quarantined_raters_and_admins_do_not_move_the_table(app, experiment):
    with app.app_context():
        exp = db.session.get(Experiment, experiment)
        baseline = experiment_metrics(exp)
        assert thumbs(baseline) == {"control": (0.5, 20), "variant": (0.5, 20)}
        assert baseline["excluded_users"] == 0

        run_quarantined = add_heavy_downvoter(experiment, anon_id="sybil")
        store_assessments(None, {run_quarantined: {"events": 27, "raw_share": 0.4, "share": 0.1, "agreement": 0.05,
                                                   "checked": 20, "weight": 0.0, "status": "quarantined",
                                                   "reasons": ["disagrees with the other raters"]}})
        admin_quarantined = add_heavy_downvoter(experiment, anon_id="script")
        set_trust(admin_quarantined, "quarantined", "a script", None)
        admin = add_heavy_downvoter(experiment, username="root", password_hash="x", is_admin=True)
        db.session.commit()

        after = experiment_metrics(exp)
        assert thumbs(after) == thumbs(baseline)
        assert after["arms"] == baseline["arms"]  # users, answers, feedback per arm: all as before
        win = next(m for m in after["metrics"] if m["name"] == "compare_win_rate")
        assert win["control"]["n"] == win["variant"]["n"] == 0  # their votes are out too
        assert after["srm"] == baseline["srm"]
        assert after["excluded_users"] == 3
        # their rows are still in the database
        for uid in (run_quarantined, admin_quarantined, admin):
            assert db.session.scalar(db.select(db.func.count()).select_from(Feedback)
                                     .where(Feedback.user_id == uid)) == 25
            assert db.session.scalar(db.select(db.func.count()).select_from(Comparison)
                                     .where(Comparison.user_id == uid)) == 2

        # the same user trusted by an admin counts again: the exclusion is what kept the table still
        set_trust(run_quarantined, "trusted", "checked by hand", None)
        db.session.commit()
        counted = experiment_metrics(exp)
        value, n = thumbs(counted)["variant"]
        assert n == 21 and value < 0.5
        assert counted["excluded_users"] == 2


def test_a_compare_first_user_is_assigned_an_arm(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=4)
    register_model(app, micro_model_dir)
    variant = register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    user = ApiClient(app.test_client())  # a session from before the experiment: no assignment yet
    conv = user.post("/api/conversations", json={}).get_json()["id"]
    with app.app_context():
        exp = Experiment(key="compare-first", control_version_id=1, variant_version_id=variant,
                         traffic_split=0.5, status="running", started_at=utcnow())
        db.session.add(exp)
        db.session.commit()
        exp_id = exp.id
        assert db.session.scalars(db.select(Assignment).filter_by(user_id=user.user_id)).all() == []

    pair = user.post(f"/api/conversations/{conv}/compare", json={"content": "How do I cook rice?"})
    assert pair.status_code == 201, pair.get_data(as_text=True)
    with app.app_context():
        (assignment,) = db.session.scalars(db.select(Assignment).filter_by(user_id=user.user_id)).all()
        assert assignment.experiment_id == exp_id
        assert assignment.arm == arm_for("compare-first", str(user.user_id), 0.5)  # the hash, as for everyone
    vote = user.post(f"/api/pairs/{pair.get_json()['pair_id']}/vote", json={"winner": "a"})
    assert vote.status_code == 200
    # sticky: a later compare and answer keep the one assignment
    assert user.post(f"/api/conversations/{conv}/compare", json={"content": "And pasta?"}).status_code == 201
    with app.app_context():
        assert db.session.scalar(db.select(db.func.count()).select_from(Assignment)
                                 .where(Assignment.user_id == user.user_id)) == 1
        data = experiment_metrics(db.session.get(Experiment, exp_id))
        assert data["arms"]["control"]["users"] + data["arms"]["variant"]["users"] == 1  # the voter is a unit
