"""Training curves: every run writes its trainers' per-step logs (runs/run-<id>/curves.jsonl) as it
trains; the admin API serves them as series; RLHF_TENSORBOARD=1 adds TensorBoard event files."""
from __future__ import annotations

import json

import pytest

from rlhf.training.curves import CurvesFile, read_curves, series
from tests.support.app import flask_cli as cli
from tests.support.app import login_admin, make_app, register_model, seeded_instance
from webapp.core.extensions import db
from webapp.core.models import TrainingRun

FAST = {"RLHF_PPO_EPISODES": "32", "RLHF_POLICY_LR": "1e-3"}
PASSWORD = "correct horse battery"
PPO_KEYS = {"objective/scores", "objective/rlhf_reward", "objective/kl", "objective/entropy", "loss/policy_avg",
            "loss/value_avg", "policy/clipfrac_avg", "val/num_eos_tokens"}
REWARD_KEYS = {"loss", "accuracy", "margin"}


# ---------------------------------------------------------------------------- the file format

def test_curves_file_keeps_numbers_skips_the_summary_and_half_written_lines(tmp_path):
    path = tmp_path / "curves.jsonl"
    write = CurvesFile(path)
    write("reward", "reward", 1, {"loss": 0.7, "accuracy": 0.5, "epoch": 0.25, "note": "x", "flag": True,
                                  "bad": float("nan")})
    write("reward", "reward", 2, {"loss": 0.6, "accuracy": 0.75})
    write("reward", "reward", 2, {"train_runtime": 3.0, "train_loss": 0.65})  # Trainer's summary: not a step
    write("policy", "ppo", 1, {"objective/kl": 0.01})
    with open(path, "a") as f:
        f.write('{"stage": "policy", "step": 2, "metr')  # a line being written while it is read
    rows = read_curves(path)
    assert [(r["stage"], r["step"]) for r in rows] == [("reward", 1), ("reward", 2), ("policy", 1)]
    assert rows[0]["metrics"] == {"loss": 0.7, "accuracy": 0.5, "epoch": 0.25}
    assert series(rows)["reward"]["loss"] == [{"step": 1, "value": 0.7}, {"step": 2, "value": 0.6}]
    assert read_curves(tmp_path / "missing.jsonl") == []


# ---------------------------------------------------------------------------- a real cycle

@pytest.fixture
def instance(tmp_path, micro_model_dir, monkeypatch):
    return seeded_instance(tmp_path, micro_model_dir, monkeypatch, {"RLHF_DEVICE": "cpu", **FAST})


def increasing(steps: list[int]) -> bool:
    return len(steps) >= 2 and all(a < b for a, b in zip(steps, steps[1:]))


def _login(client) -> None:
    login_admin(client, "root", PASSWORD)


@pytest.mark.slow
def test_ppo_run_writes_reward_and_ppo_curves(instance):
    result = cli("rl-train", "--min-feedback", "10", "--json")
    assert result.exit_code in (0, 3), result.output
    run_id = json.loads(result.stdout)["run_id"]
    path = instance / "runs" / f"run-{run_id}" / "curves.jsonl"
    assert path.is_file()
    assert not (instance / "runs" / f".tmp-run-{run_id}").exists()
    rows = read_curves(path)
    reward = [r for r in rows if r["stage"] == "reward"]
    policy = [r for r in rows if r["stage"] == "policy"]
    assert reward and policy and {r["trainer"] for r in policy} == {"ppo"}
    assert REWARD_KEYS <= set(reward[0]["metrics"]), reward[0]
    assert PPO_KEYS <= set(policy[0]["metrics"]), policy[0]
    assert increasing([r["step"] for r in reward]) and increasing([r["step"] for r in policy])
    assert not any("train_runtime" in r["metrics"] for r in rows)
    app = make_app(instance)
    with app.app_context():  # the run's metrics still tell the reward model's training accuracy
        run = db.session.get(TrainingRun, run_id)
        assert 0 <= run.metrics["reward_model"]["train_accuracy"] <= 1
        from webapp.admin.auth import set_admin_password
        set_admin_password("root", PASSWORD)
    client = app.test_client()  # the admin API serves the same numbers as series
    _login(client)
    data = client.get(f"/api/admin/runs/{run_id}/curves").get_json()
    kl = data["series"]["policy"]["objective/kl"]
    assert [p["step"] for p in kl] == [r["step"] for r in policy]
    assert [p["value"] for p in kl] == [r["metrics"]["objective/kl"] for r in policy]
    assert {c["metrics"][0] for c in data["charts"] if c["stage"] == "policy"} >= {
        "objective/scores", "objective/kl", "objective/entropy", "loss/policy_avg", "loss/value_avg",
        "policy/clipfrac_avg"}


@pytest.mark.slow
def test_dpo_run_writes_dpo_curves(instance):
    result = cli("rl-train", "--algorithm", "dpo", "--min-feedback", "10", "--max-steps", "3", "--json")
    assert result.exit_code in (0, 3), result.output
    run_id = json.loads(result.stdout)["run_id"]
    policy = [r for r in read_curves(instance / "runs" / f"run-{run_id}" / "curves.jsonl") if r["stage"] == "policy"]
    assert {r["trainer"] for r in policy} == {"dpo"}
    assert {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"} <= set(
        policy[0]["metrics"])
    assert [r["step"] for r in policy] == [1, 2, 3]


@pytest.mark.slow
def test_tensorboard_event_files_when_asked(instance, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("RLHF_TENSORBOARD", "1")
    result = cli("rl-train", "--min-feedback", "10", "--max-steps", "1", "--json")
    assert result.exit_code in (0, 3), result.output
    run_id = json.loads(result.stdout)["run_id"]
    board = instance / "runs" / f"run-{run_id}" / "tensorboard"
    for stage in ("reward", "policy"):
        events = list((board / stage).glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 0, stage
    assert (instance / "runs" / f"run-{run_id}" / "curves.jsonl").is_file()  # the curves as well


def test_tensorboard_without_the_package_refuses_the_run(instance, monkeypatch):
    import webapp.training.runner

    monkeypatch.setenv("RLHF_TENSORBOARD", "1")
    monkeypatch.setattr(webapp.training.runner, "tensorboard_available", lambda: False)
    result = cli("rl-train", "--min-feedback", "10")
    assert result.exit_code == 2
    assert "Error: RLHF_TENSORBOARD=1 needs the tensorboard package" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (instance / "runs").exists() or not any((instance / "runs").iterdir())


# ---------------------------------------------------------------------------- the API and the page

@pytest.fixture
def admin_client(tmp_path, micro_model_dir):
    from webapp.admin.auth import set_admin_password

    app = make_app(tmp_path / "instance")
    register_model(app, micro_model_dir)
    with app.app_context():
        set_admin_password("root", PASSWORD)
        for algorithm in ("ppo", "dpo"):
            db.session.add(TrainingRun(status="succeeded", algorithm=algorithm))
        db.session.commit()
    folder = tmp_path / "instance" / "runs" / "run-1"
    folder.mkdir(parents=True)
    write = CurvesFile(folder / "curves.jsonl")
    for step in (1, 2, 3):
        write("reward", "reward", step, {"loss": 1.0 / step, "accuracy": 0.5 + step / 10})
    for step in (1, 2):
        write("policy", "ppo", step, {"objective/kl": 0.1 * step, "objective/scores": -1.0 + step})
    return app.test_client()


def test_curves_api_gives_series_per_metric(admin_client):
    assert admin_client.get("/api/admin/runs/1/curves").status_code == 401
    _login(admin_client)
    data = admin_client.get("/api/admin/runs/1/curves").get_json()
    assert data["run_id"] == 1 and data["algorithm"] == "ppo" and data["status"] == "succeeded"
    assert data["series"]["reward"]["loss"] == [{"step": 1, "value": 1.0}, {"step": 2, "value": 0.5},
                                                {"step": 3, "value": 1 / 3}]
    assert data["series"]["policy"]["objective/kl"][-1] == {"step": 2, "value": 0.2}
    charts = {(c["stage"], c["metrics"][0]): c for c in data["charts"]}
    assert charts[("reward", "accuracy")]["percent"] is True
    assert ("policy", "objective/kl") in charts and ("policy", "loss/value_avg") in charts
    # a run without curves (older, or not started yet): empty series, DPO's charts
    dpo = admin_client.get("/api/admin/runs/2/curves").get_json()
    assert dpo["series"] == {} and ("policy", "rewards/margins") in {(c["stage"], c["metrics"][0])
                                                                      for c in dpo["charts"]}
    assert admin_client.get("/api/admin/runs/99/curves").status_code == 404


def test_run_page_draws_the_curves_and_compares(admin_client):
    _login(admin_client)
    html = admin_client.get("/admin/runs/1").get_data(as_text=True)
    assert 'data-chart="policy:objective/kl"' in html and 'data-chart="reward:loss"' in html
    assert "<polyline" in html and "style=" not in html
    compared = admin_client.get("/admin/runs/2?compare=1").get_data(as_text=True)
    assert "series-b0" in compared and "run #1" in compared  # DPO's reward charts overlay run 1's
    assert admin_client.get("/admin/runs/1?compare=abc").status_code == 200
