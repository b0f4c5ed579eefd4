"""An instance folder moved to another path: rows store paths relative to it
(webapp/core/instance_paths.py), so a copy at another path serves and trains without any row
changed, and rows written before (absolute paths) still read, in place and after a move."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlhf.models import registry
from tests.support.app import ApiClient, flask_cli, make_app, register_model
from tests.support.feedback_factory import seed_feedback
from webapp.core.display import display_path
from webapp.core.extensions import db
from webapp.core.instance_paths import resolve, to_stored
from webapp.core.models import Message, ModelVersion, TrainingRun

pytestmark = pytest.mark.slow

FAST = {"RLHF_DEVICE": "cpu", "RLHF_PPO_EPISODES": "32", "RLHF_POLICY_LR": "1e-3", "RLHF_EMBEDDED_PRESET": "micro",
        "RLHF_MAX_NEW_TOKENS": "4"}


def use_instance(monkeypatch, instance: Path, **env: str) -> None:
    """The `flask` commands of the test run on ``instance``."""
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(instance))
    for key, value in {**FAST, **env}.items():
        monkeypatch.setenv(key, value)


def move(src: Path, dst: Path) -> None:
    """Copy the instance folder elsewhere and delete the original: nothing can read it any more."""
    shutil.copytree(src, dst)
    shutil.rmtree(src)


def close(app) -> None:
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


def answer_version(app) -> int:
    """Ask one question through the chat API; the id of the version whose answer was stored."""
    user = ApiClient(app.test_client())
    conv = user.post("/api/conversations", json={}).get_json()["id"]
    resp = user.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?", "stream": False})
    assert resp.status_code == 201, resp.get_json()
    with app.app_context():
        return db.session.get(Message, resp.get_json()["assistant_message"]["id"]).model_version_id


def activate(app, name: str) -> int:
    """Make version ``name`` the active one (whatever the gate said of it), the others retired."""
    with app.app_context():
        for version in db.session.scalars(db.select(ModelVersion)):
            version.status = "active" if version.name == name else "retired"
        db.session.commit()
        return db.session.scalars(db.select(ModelVersion).filter_by(name=name)).one().id


def test_a_moved_instance_serves_its_trained_version_and_trains_on(tmp_path, micro_model_dir, monkeypatch):
    a, b = tmp_path / "a" / "instance", tmp_path / "b" / "moved"
    # instance A: the base model imported by init-model, rated answers, one training cycle
    use_instance(monkeypatch, a, RLHF_BASE_MODEL=str(micro_model_dir))
    made = flask_cli("init-model")
    assert made.exit_code == 0, made.output
    app = make_app(a)
    seed_feedback(app, 40)
    trained = flask_cli("rl-train", "--min-feedback", "10", "--max-steps", "2", "--json")
    assert trained.exit_code in (0, 3), trained.output
    name = json.loads(trained.stdout)["version"]["name"]
    with app.app_context():
        rows = {v.name: v.path for v in db.session.scalars(db.select(ModelVersion))}
        run = db.session.scalars(db.select(TrainingRun)).one()
        assert rows == {"v1-base": "models/v1-base", name: f"models/{name}"}
        assert run.metrics["reward_model_path"] == f"runs/run-{run.id}/reward_model"
        assert db.session.scalars(db.select(ModelVersion).filter_by(name=name)).one().metrics[
            "reward_model_path"] == run.metrics["reward_model_path"]
    close(app)

    move(a, b)
    app = make_app(b)
    version_id = activate(app, name)
    with app.app_context():
        version = db.session.get(ModelVersion, version_id)
        assert version.path == f"models/{name}"  # no row was changed by the move
        assert Path(version.location) == b / "models" / name and registry.is_complete(version.location)
        assert resolve(version.metrics["reward_model_path"]).is_relative_to(b)
    # the trained version answers (not a fallback: that would be another version's id)
    assert answer_version(app) == version_id

    # a training cycle from B, on the moved version, registers a new version stored relative
    seed_feedback(app, 20, seed=3)
    close(app)
    use_instance(monkeypatch, b)
    again = flask_cli("rl-train", "--min-feedback", "10", "--max-steps", "2", "--json")
    assert again.exit_code in (0, 3), again.output
    out = json.loads(again.stdout)
    assert Path(out["version"]["path"]).is_relative_to(b) and Path(out["reward_model"]["path"]).is_relative_to(b)
    app = make_app(b)
    with app.app_context():
        new = db.session.scalars(db.select(ModelVersion).filter_by(name=out["version"]["name"])).one()
        assert new.parent_id == version_id and new.path == f"models/{new.name}"
        assert registry.is_complete(new.location) and Path(new.location).is_relative_to(b)
        assert new.metrics["reward_model_path"] == f"runs/run-{out['run_id']}/reward_model"
        assert json.loads((Path(new.location) / "version.json").read_text())["reward_model"] == \
            new.metrics["reward_model_path"]
    close(app)
    assert not a.exists()


def test_rows_with_absolute_paths_as_written_before_still_read(tmp_path, micro_model_dir):
    a, b = tmp_path / "a" / "instance", tmp_path / "b" / "moved"
    app = make_app(a)
    register_model(app, micro_model_dir)  # an absolute path, as rows were written before
    reward = a / "runs" / "run-1" / "reward_model"
    reward.mkdir(parents=True)
    with app.app_context():
        version = db.session.scalars(db.select(ModelVersion)).one()
        version.metrics = {"reward_model_path": str(reward)}
        db.session.commit()
        assert version.path == str(a / "models" / "v1-base")
        assert version.location == version.path  # an absolute path that exists: as it is
        version_id = version.id
    assert answer_version(app) == version_id
    close(app)

    move(a, b)
    app = make_app(b)
    with app.app_context():
        version = db.session.get(ModelVersion, version_id)
        assert version.path == str(a / "models" / "v1-base")  # the row still names the old folder ...
        assert version.location == str(b / "models" / "v1-base")  # ... and reads in the new one
        assert resolve(version.metrics["reward_model_path"]) == b / "runs" / "run-1" / "reward_model"
        assert display_path(version.path) == "models/v1-base"  # the dashboard shows where it is now
    assert answer_version(app) == version_id
    close(app)


def test_stored_form(tmp_path):
    instance = tmp_path / "instance"
    app = make_app(instance)
    with app.app_context():
        assert to_stored(instance / "models" / "v2-ppo") == "models/v2-ppo"
        assert to_stored(instance / "runs" / ".." / "models" / "v1-base") == "models/v1-base"
        assert to_stored(tmp_path / "elsewhere" / "model") == str(tmp_path / "elsewhere" / "model")  # outside: as given
        assert to_stored("gpt2") == "gpt2"  # a hub id
        assert resolve("models/v2-ppo") == instance / "models" / "v2-ppo"
        assert resolve(tmp_path / "elsewhere" / "model") == tmp_path / "elsewhere" / "model"
        # a missing absolute path whose file is not in this instance either stays as it was
        assert resolve("/gone/instance/models/v9-ppo") == Path("/gone/instance/models/v9-ppo")
    close(app)
