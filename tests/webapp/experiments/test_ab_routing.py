"""GrowthBook-compatible hashing, bucket ranges, stickiness and split accuracy."""
from __future__ import annotations

import math

import pytest

from tests.support.app import ApiClient, make_app, register_model
from webapp.core.extensions import db
from webapp.core.models import Assignment, Experiment, Message, ModelVersion
from webapp.experiments.assignment import arm_for, gb_hash

# growthbook/growthbook packages/sdk-js/test/cases.json, "hash": [seed, value, version, expected]
GROWTHBOOK_HASH_CASES = [
    ["", "a", 1, 0.22], ["", "b", 1, 0.077], ["b", "a", 1, 0.946], ["ef", "d", 1, 0.652],
    ["asdf", "8952klfjas09ujk", 1, 0.549], ["", "123", 1, 0.011], ["", '___)((*":&', 1, 0.563],
    ["seed", "a", 2, 0.0505], ["seed", "b", 2, 0.2696], ["foo", "ab", 2, 0.2575], ["foo", "def", 2, 0.2019],
    ["89123klj", "8952klfjas09ujkasdf", 2, 0.124], ["90850943850283058242805", "123", 2, 0.7516],
    ["()**(%$##$%#$#", '___)((*":&', 2, 0.0128], ["abc", "def", 99, None],
]


@pytest.mark.parametrize("seed,value,version,expected", GROWTHBOOK_HASH_CASES)
def test_hash_matches_growthbook_vectors(seed, value, version, expected):
    assert gb_hash(seed, value, version) == expected


def test_bucket_ranges_match_growthbook():
    # getBucketRange "normal 50/50" -> [[0, 0.5], [0.5, 1]]; "uneven weights" [0.4, 0.6] -> [[0, 0.4], [0.4, 1]]
    for user in map(str, range(2000)):
        bucket = gb_hash("exp", user)
        assert arm_for("exp", user, 0.5) == ("variant" if bucket >= 0.5 else "control")
        assert arm_for("exp", user, 0.6) == ("variant" if bucket >= 0.4 else "control")


def test_split_accuracy_over_many_users():
    n = 20000
    for split in (0.1, 0.5, 0.8):
        share = sum(arm_for("split-test", str(u), split) == "variant" for u in range(n)) / n
        sigma = math.sqrt(split * (1 - split) / n)
        assert abs(share - split) < 4 * sigma, (split, share)


def test_different_keys_give_independent_assignments():
    a = [arm_for("exp-a", str(u), 0.5) for u in range(4000)]
    b = [arm_for("exp-b", str(u), 0.5) for u in range(4000)]
    agree = sum(x == y for x, y in zip(a, b)) / len(a)
    assert 0.45 < agree < 0.55


@pytest.fixture
def two_versions(tmp_path, micro_model_dir):
    inst = tmp_path / "instance"
    app = make_app(inst)
    register_model(app, micro_model_dir)
    variant = register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    with app.app_context():
        db.session.add(Experiment(key="sticky", control_version_id=1, variant_version_id=variant,
                                  traffic_split=0.5, status="running"))
        db.session.commit()
    return inst


IDENTITY_KEYS = {"experiment", "arm", "model_version"}


def stored_arms(app) -> dict[int, str]:
    """user id -> arm, as assigned in the database (users themselves are never told: blind arms)."""
    with app.app_context():
        arms = dict(db.session.execute(db.select(Assignment.user_id, Assignment.arm)).all())
        db.session.remove()
        return arms


def answer_arm(app, api: ApiClient) -> tuple[str, str | None]:
    """Ask one question as ``api``'s user; (version name, arm) of the stored answer."""
    conv = api.post("/api/conversations", json={}).get_json()["id"]
    resp = api.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?", "stream": False})
    assert resp.status_code == 201
    answer = resp.get_json()["assistant_message"]
    assert not IDENTITY_KEYS & set(answer)
    with app.app_context():
        msg = db.session.get(Message, answer["id"])
        return msg.model_version.name, msg.arm


def test_assignment_is_sticky_across_restarts_and_split_changes(two_versions):
    app = make_app(two_versions)
    clients = [app.test_client() for _ in range(60)]
    users = []
    for c in clients:
        data = c.get("/api/session").get_json()
        assert not IDENTITY_KEYS & set(data)  # assigned on arrival, never told which arm
        users.append(data["user_id"])
    first = stored_arms(app)
    assert sorted(first) == sorted(users)
    for user_id, arm in first.items():
        assert arm == arm_for("sticky", str(user_id), 0.5)  # hashed on the stable user id
    assert set(first.values()) == {"control", "variant"}

    restarted = make_app(two_versions, RLHF_MAX_NEW_TOKENS=4)  # a new process: same cookies, same arms
    with restarted.app_context():
        db.session.query(Experiment).filter_by(key="sticky").update({"traffic_split": 0.01})
        db.session.commit()
    for c, user_id in zip(clients, users):
        c.application = restarted
        if first[user_id] == "variant":  # the changed split moves nobody already assigned
            assert answer_arm(restarted, ApiClient(c)) == ("v2-ppo", "variant")
    assert stored_arms(restarted) == first
    # new users follow the new split
    newcomers = [ApiClient(restarted.test_client()).user_id for _ in range(30)]
    arms = stored_arms(restarted)
    assert [arms[u] for u in newcomers].count("variant") <= 3


def test_no_running_experiment_means_active_version_for_everyone(two_versions):
    app = make_app(two_versions, RLHF_MAX_NEW_TOKENS=4)
    with app.app_context():
        db.session.query(Experiment).update({"status": "stopped"})
        db.session.commit()
    api = ApiClient(app.test_client())
    assert answer_arm(app, api) == ("v1-base", None)
    with app.app_context():
        assert db.session.query(Assignment).count() == 0
        assert db.session.get(ModelVersion, 1).status == "active"
