"""GrowthBook-compatible hashing, bucket ranges, stickiness and split accuracy."""
from __future__ import annotations

import math

import pytest

from tests.conftest import ApiClient, make_app, register_model
from webapp.experiments.assignment import arm_for, gb_hash
from webapp.core.extensions import db
from webapp.core.models import Assignment, Experiment, ModelVersion

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


def test_assignment_is_sticky_across_restarts_and_split_changes(two_versions):
    app = make_app(two_versions)
    clients = [app.test_client() for _ in range(60)]
    first = {}
    for c in clients:
        data = c.get("/api/session").get_json()
        first[data["user_id"]] = data["arm"]
        assert data["experiment"] == "sticky"
        assert data["arm"] == arm_for("sticky", str(data["user_id"]), 0.5)  # hashed on the stable user id
    assert set(first.values()) == {"control", "variant"}

    restarted = make_app(two_versions)  # a new process: same cookies, same arms
    with restarted.app_context():
        db.session.query(Experiment).filter_by(key="sticky").update({"traffic_split": 0.01})
        db.session.commit()
    for c in clients:
        c.application = restarted
        data = c.get("/api/session").get_json()
        assert data["arm"] == first[data["user_id"]]  # the changed split moves nobody already assigned
    with restarted.app_context():
        assert db.session.query(Assignment).count() == 60
    # new users follow the new split
    newcomers = [ApiClient(restarted.test_client()).get("/api/session").get_json()["arm"] for _ in range(30)]
    assert newcomers.count("variant") <= 3


def test_no_running_experiment_means_active_version_for_everyone(two_versions):
    app = make_app(two_versions)
    with app.app_context():
        db.session.query(Experiment).update({"status": "stopped"})
        db.session.commit()
    data = app.test_client().get("/api/session").get_json()
    assert (data["experiment"], data["arm"], data["model_version"]) == (None, None, "v1-base")
    with app.app_context():
        assert db.session.query(Assignment).count() == 0
        assert db.session.get(ModelVersion, 1).status == "active"
