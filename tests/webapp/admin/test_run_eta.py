"""How long a running run has left: the running stage at its own pace, the later stages as long as the
last finished run of the same algorithm took them; on the run page, in the admin API and from the
tracker that a real run reports through."""
from __future__ import annotations

from datetime import timedelta

from tests.support.admin import Admin
from webapp.core.extensions import db
from webapp.core.models import TrainingRun, utcnow
from webapp.training.eta import duration_words, time_left
from webapp.training.runner import RunTracker


def test_duration_words():
    assert duration_words(20) == "under a minute"
    assert duration_words(7 * 60 + 10) == "about 7 min"
    assert duration_words(85 * 60) == "about 1 h 25 min"
    assert duration_words(120 * 60) == "about 2 h"


def test_the_running_stage_at_its_own_pace_and_the_later_ones_as_last_time():
    now = utcnow()
    run = TrainingRun(status="running", algorithm="ppo", stage="reward",
                      stage_started_at=now - timedelta(seconds=120), stage_done=10, stage_total=40)
    earlier = (7, {"data": 1.0, "reward": 300.0, "policy": 900.0, "judge": 60.0, "evaluate": 240.0})
    eta = time_left(run, now, earlier)
    assert eta["stage_seconds"] == 360.0  # 12 s a step, 30 steps to go
    assert eta["run_seconds"] == 360.0 + 900 + 60 + 240  # the stages after reward, not reward's old time
    assert eta["text"] == ("about 6 min left in reward; about 26 min for the whole run "
                           "(later stages as long as in run #7)")

    alone = time_left(
        TrainingRun(status="running", algorithm="ppo", stage="evaluate", stage_started_at=now - timedelta(seconds=30),
                    stage_done=3, stage_total=4), now, earlier)
    assert alone["run_seconds"] is None and alone["text"] == "under a minute left in evaluate (the last stage)"

    first = time_left(TrainingRun(status="running", stage="policy", stage_started_at=now, stage_done=0,
                                  stage_total=8), now, earlier)
    assert first["stage_seconds"] is None and first["text"] == "policy: timing its first step"
    assert time_left(TrainingRun(status="succeeded", stage="done", stage_started_at=now), now, earlier) is None


def test_the_page_and_the_api_say_how_long_is_left(setup):
    app, _ = setup
    admin = Admin(app)
    now = utcnow()
    with app.app_context():
        finished = TrainingRun(status="succeeded", algorithm="ppo", stage="done",
                               metrics={"timings": {"data": 0.5, "reward": 50.0, "policy": 1200.0, "judge": 30.0,
                                                    "evaluate": 400.0}})
        other = TrainingRun(status="succeeded", algorithm="dpo", stage="done",
                            metrics={"timings": {"policy": 9999.0, "judge": 9999.0, "evaluate": 9999.0}})
        db.session.add_all([finished, other])
        db.session.flush()
        running = TrainingRun(status="running", algorithm="ppo", stage="reward", started_at=now, heartbeat_at=now,
                              stage_started_at=now - timedelta(seconds=100), stage_done=20, stage_total=40,
                              config={"limits": {"stall_seconds": 600, "max_seconds": 7200}})
        db.session.add(running)
        db.session.commit()
        finished_id, running_id = finished.id, running.id
    eta = admin.get(f"/api/admin/runs/{running_id}").get_json()["eta"]
    assert eta["based_on_run"] == finished_id  # the same algorithm's, not the later dpo run's
    assert 100 <= eta["stage_seconds"] <= 110 and 1730 <= eta["run_seconds"] <= 1740
    page = admin.get(f"/admin/runs/{running_id}").get_data(as_text=True)
    shown = page[page.index('data-testid="run-eta"'):].split("</span>", 1)[0]
    assert "hidden" not in shown.split(">", 1)[0]
    assert ("about 2 min left in reward; about 29 min for the whole run "
            f"(later stages as long as in run #{finished_id})") in shown
    assert admin.get(f"/api/admin/runs/{finished_id}").get_json().get("eta") is None
    assert 'data-testid="run-eta" hidden' in admin.get(f"/admin/runs/{finished_id}").get_data(as_text=True)


def test_the_tracker_keeps_the_stage_clock_and_steps(setup):
    app, _ = setup
    with app.app_context():
        run = TrainingRun(status="running", algorithm="ppo", stage="data")
        db.session.add(run)
        db.session.commit()
        tracker = RunTracker(run.id, min_interval=0.0)
        tracker("reward", 0, 40)
        db.session.expire_all()
        started = db.session.get(TrainingRun, run.id).stage_started_at
        tracker("reward", 12, 40)
        db.session.expire_all()
        row = db.session.get(TrainingRun, run.id)
        assert (row.stage, row.stage_done, row.stage_total, row.stage_started_at) == ("reward", 12, 40, started)
        tracker("policy", 1, 8)
        db.session.expire_all()
        row = db.session.get(TrainingRun, run.id)
        assert (row.stage, row.stage_done, row.stage_total) == ("policy", 1, 8)
        assert row.stage_started_at >= started
