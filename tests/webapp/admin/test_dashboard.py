"""What the dashboard's pages show: answer and feedback counts, the scheduler card, times, paths, charts,
forms, runs and settings."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

from tests.support.admin import PASSWORD, Admin
from tests.support.app import make_app, register_model
from tests.support.feedback_factory import add_exchange
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import (
    AnswerScore,
    Comparison,
    Conversation,
    Experiment,
    Feedback,
    ModelVersion,
    TrainingRun,
    User,
    utcnow,
)

ISO_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def answer_at(user_id: int, when: datetime, thumb: str | None = "up", rating: int | None = 4,
              correction: str | None = None, experiment_id: int | None = None, arm: str | None = None,
              version_id: int | None = 1):
    """One conversation whose answer (and its feedback, if any) were written at ``when``."""
    q, (a,) = add_exchange(user_id, "How do I boil rice?", ["Rinse it, then simmer."], version_id)
    q.created_at = a.created_at = when
    a.experiment_id, a.arm = experiment_id, arm
    if thumb or rating or correction:
        db.session.add(Feedback(user_id=user_id, message_id=a.id, thumb=thumb, rating=rating, correction=correction,
                                created_at=when, updated_at=when))
    return q, a


def damaged_reward_model(inst) -> Path:
    """A reward model directory of run 1 holding an empty config.json only (nothing can load it)."""
    reward = inst / "runs" / "run-1" / "reward_model"
    reward.mkdir(parents=True)
    (reward / "config.json").write_text("{}")
    return reward


def anon_user(name: str) -> int:
    user = User(anon_id=name)
    db.session.add(user)
    db.session.flush()
    return user.id


def test_answers_card_counts_the_last_24_hours(setup):
    app, _ = setup
    now = utcnow()
    with app.app_context():
        uid = anon_user("u1")
        for hours in (0.1, 5, 23.5):  # inside the last day
            answer_at(uid, now - timedelta(hours=hours))
        for hours in (24.5, 30, 24 * 9):  # older
            answer_at(uid, now - timedelta(hours=hours))
        db.session.commit()
    html = Admin(app).get("/admin/").get_data(as_text=True)
    assert re.search(r'data-testid="answers-24h">3<', html)
    assert "6 all time" in html


def test_overview_counts_feedback_events_as_training_does(setup):
    """3 rated answers and 2 compare votes are 5 events on the overview, as training counts them;
    comment-only feedback and deleted conversations are not events."""
    from webapp.training.records import feedback_events

    app, _ = setup
    now = utcnow()
    with app.app_context():
        uid = anon_user("u1")
        answer_at(uid, now - timedelta(hours=1), thumb="up", rating=5)
        answer_at(uid, now - timedelta(hours=2), thumb="down", rating=None, correction="Rinse, then simmer 12 min.")
        answer_at(uid, now - timedelta(days=3), thumb=None, rating=2)
        _, silent = answer_at(uid, now, thumb=None, rating=None)
        db.session.add(Feedback(user_id=uid, message_id=silent.id, comment="just a comment"))
        gone_q, gone_a = answer_at(uid, now, thumb="up")
        db.session.get(Conversation, gone_q.conversation_id).deleted_at = now
        for days in (0, 2):
            q, (a, b) = add_exchange(uid, "Which is better?", ["A", "B"], 1)
            db.session.add(Comparison(user_id=uid, prompt_message_id=q.id, message_a_id=a.id, message_b_id=b.id,
                                      winner="a", voted_at=now - timedelta(days=days, minutes=5)))
        db.session.commit()
        expected = feedback_events()
    assert expected["total"] == 5 and expected["votes"] == 2
    html = Admin(app).get("/admin/").get_data(as_text=True)
    assert re.search(r'data-testid="feedback-total">5<', html)
    assert re.search(r'data-testid="feedback-24h">3<', html)  # two rated answers and one vote today
    for kind in ("thumbs", "ratings", "corrections", "votes"):
        assert re.search(rf'data-kind="{kind}">{expected[kind]}<', html), kind


def test_scheduler_card(setup, monkeypatch):
    import webapp.training.scheduler as scheduler

    app, _ = setup
    admin = Admin(app)
    monkeypatch.setattr(scheduler, "scheduler_status", lambda: {
        "running": True, "where": "web process (pid 4242)",
        "jobs": [{"id": "retrain", "name": "retrain", "next_run": datetime(2026, 11, 23, 14, 5, 7, 123456)},
                 {"id": "housekeeping", "name": "housekeeping", "next_run": None}],
        "last_retrain": {"at": datetime(2026, 11, 23, 13, 5, 0), "action": "skip",
                         "reason": "12 of 50 feedback events"}}, raising=False)
    html = admin.get("/admin/").get_data(as_text=True)
    card = html[html.index('data-testid="scheduler-card"'):]
    card = card[:card.index("</section>")]
    assert "running</span> in the web process (pid 4242)" in card
    assert ('<time datetime="2026-11-23T14:05:07Z" title="2026-11-23T14:05:07Z" data-local>'
            '23 Nov 2026, 14:05 UTC</time>') in card
    assert "housekeeping</b>: paused" in card
    assert "no run" in card and "12 of 50 feedback events" in card

    monkeypatch.setattr(scheduler, "scheduler_status", lambda: {
        "running": False, "where": None, "jobs": [], "last_retrain": {
            "at": datetime(2026, 11, 23, 13, 5), "action": "train", "reason": "60 of 50 feedback events"}},
        raising=False)
    card = admin.get("/admin/").get_data(as_text=True)
    assert "not running" in card and "started a training run" in card and "60 of 50" in card

    # the training lock stopped the check: it says who held it
    for held_by, reason in [
            ({"job": "housekeeping", "doing": "cleaning up stale runs", "run_id": None, "pid": 7, "since": None},
             "housekeeping was cleaning up stale runs and still held the training lock after 10 s (pid 7)"),
            ({"job": "training run", "doing": "training", "run_id": 12, "pid": 8, "since": None},
             "a training run (#12) is in progress")]:
        monkeypatch.setattr(scheduler, "scheduler_status", lambda: {
            "running": True, "where": "web process (pid 4242)", "jobs": [], "last_retrain": {
                "at": datetime(2026, 11, 23, 13, 5), "action": "skip", "reason": reason, "held_by": held_by}},
            raising=False)
        html = admin.get("/admin/").get_data(as_text=True)
        last = re.search(r'data-testid="last-retrain">(.*?)</p>', html, re.S).group(1)
        assert "<b>skipped</b>: " + reason in last and "no run" not in last

    def broken():
        raise RuntimeError("job store unreadable")
    monkeypatch.setattr(scheduler, "scheduler_status", broken, raising=False)
    resp = admin.get("/admin/")
    assert resp.status_code == 200 and "job store unreadable" in resp.get_data(as_text=True)
    assert 'data-testid="active-version">v1-base<' in resp.get_data(as_text=True)  # the rest still renders


def test_admin_pages_show_readable_times_with_the_exact_time_on_hover(setup):
    app, _ = setup
    admin = Admin(app)
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    with app.app_context():
        uid = anon_user("u1")
        answer_at(uid, utcnow() - timedelta(minutes=3))
        db.session.add(TrainingRun(status="succeeded", started_at=datetime(2026, 1, 2, 3, 4, 5, 678901),
                                   finished_at=datetime(2026, 1, 2, 3, 9, 0, 1)))
        db.session.commit()
    for url in ("/admin/", "/admin/experiments", "/admin/experiments/e1", "/admin/runs", "/admin/runs/1",
                "/admin/versions", "/admin/feedback"):
        html = admin.get(url).get_data(as_text=True)
        times = re.findall(r'<time datetime="([^"]+)" title="([^"]+)" data-local>([^<]+)</time>', html)
        assert times, url
        for exact, title, text in times:
            assert ISO_SECONDS.match(exact) and title == exact, (url, exact)
            assert re.match(r"^\d{1,2} [A-Z][a-z]{2} \d{4}, \d\d:\d\d UTC$", text), (url, text)
        assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", html), url  # no microseconds anywhere
    runs = admin.get("/admin/runs").get_data(as_text=True)
    assert ('<time datetime="2026-01-02T03:04:05Z" title="2026-01-02T03:04:05Z" data-local>'
            '2 Jan 2026, 03:04 UTC</time>') in runs


def test_paths_are_relative_to_the_instance_folder(setup):
    app, inst = setup
    admin = Admin(app)
    reward = damaged_reward_model(inst)
    with app.app_context():
        run = TrainingRun(status="succeeded", algorithm="ppo", log=f"saved the reward model to {reward}\n",
                          metrics={"reward_model_path": str(reward), "decision": "candidate",
                                   "reward_model": {"heldout_accuracy": 0.8, "eval_pairs": 10, "train_pairs": 40},
                                   "evaluation": {"parent": {"mean_reward": 0.1}, "candidate": {"mean_reward": 0.3},
                                                  "reward_gain": 0.2, "kl_from_parent": 0.01, "passed": True,
                                                  "reasons": []}})
        db.session.add(run)
        db.session.flush()
        v2 = db.session.get(ModelVersion, 2)
        v2.training_run_id, v2.metrics = run.id, {"reward_model_path": str(reward)}
        db.session.commit()
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    with app.app_context():  # one answer, already scored (no reward model is loaded)
        uid = anon_user("u1")
        _, a = answer_at(uid, utcnow(), experiment_id=1, arm="variant", version_id=2)
        db.session.add(AnswerScore(message_id=a.id, reward_model=str(reward), score=0.5))
        db.session.commit()
    absolute = str(inst)
    pages = {url: admin.get(url).get_data(as_text=True)
             for url in ("/admin/experiments/e1", "/admin/runs/1", "/admin/versions", "/admin/", "/admin/runs")}
    assert "<code>runs/run-1/reward_model</code>" in pages["/admin/experiments/e1"]
    assert "runs/run-1/reward_model" in pages["/admin/runs/1"]
    assert "models/v2-ppo" in pages["/admin/versions"]
    for url, html in pages.items():
        assert absolute not in html, url
    metrics = admin.get("/api/admin/metrics?experiment=e1").get_json()
    assert metrics["reward_model"] == "runs/run-1/reward_model"
    versions_api = admin.get("/api/admin/versions").get_json()
    assert absolute not in json.dumps(versions_api)
    assert versions_api["versions"][1]["metrics"]["reward_model_path"] == "runs/run-1/reward_model"
    run_api = admin.get("/api/admin/runs/1").get_json()
    assert absolute not in json.dumps(run_api)
    assert run_api["log"] == "saved the reward model to runs/run-1/reward_model\n"


def test_charts_of_a_few_hours_have_several_points(setup):
    from webapp.experiments.metrics import bucket_size

    app, _ = setup
    assert bucket_size(timedelta(hours=2)) == (timedelta(minutes=10), "10 min")
    assert bucket_size(timedelta(hours=5)) == (timedelta(hours=1), "hour")
    assert bucket_size(timedelta(days=3)) == (timedelta(hours=1), "hour")
    assert bucket_size(timedelta(days=4)) == (timedelta(days=1), "day")
    admin = Admin(app)
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    now = utcnow()
    with app.app_context():
        exp = db.session.scalars(db.select(Experiment)).one()
        exp.started_at = now - timedelta(hours=5)
        for i in range(30):  # answers over the last 5 hours, alternating arms
            uid = anon_user(f"u{i}")
            arm = ("control", "variant")[i % 2]
            answer_at(uid, now - timedelta(minutes=5 + 9 * i), thumb=("up", "down")[i % 3 == 0], rating=1 + i % 5,
                      experiment_id=exp.id, arm=arm, version_id=1 + i % 2)
        db.session.commit()
    data = admin.get("/api/admin/metrics?experiment=e1").get_json()
    timeline = data["timeline"]
    assert timeline["unit"] == "hour" and timeline["bucket_seconds"] == 3600
    assert 5 <= len(timeline["starts"]) <= 7
    assert all(ISO_SECONDS.match(s) for s in timeline["starts"])
    for arm in ("control", "variant"):
        assert sum(timeline["series"]["answers"][arm]) == 15
        rates = [r for r in timeline["series"]["thumbs_up_rate"][arm] if r is not None]
        assert len(rates) >= 4 and all(0 <= r <= 1 for r in rates)
    assert len(data["daily"]["dates"]) <= 2  # what the old per-day charts had to draw
    html = admin.get("/admin/experiments/e1").get_data(as_text=True)
    answers_chart = html[html.index('data-chart="answers"'):]
    answers_chart = answers_chart[:answers_chart.index("</figure>")]
    assert "Answers per hour" in answers_chart
    assert answers_chart.count('class="chart-dot series-variant"') >= 5
    assert answers_chart.count('<polyline class="chart-line series-control"') == 1
    assert " style=" not in html and "fill=\"#" not in html  # styled by classes (CSP: no inline styles)


def test_new_experiment_form_defaults_to_two_different_versions(setup):
    app, _ = setup
    admin = Admin(app)

    def selected(html, name):
        select = re.search(rf'<select [^>]*name="{name}".*?</select>', html, re.S).group(0)
        return re.search(r'<option value="(\d+)" selected>', select).group(1)

    html = admin.get("/admin/experiments").get_data(as_text=True)
    assert (selected(html, "control_version_id"), selected(html, "variant_version_id")) == ("1", "2")
    with app.app_context():  # no candidate: the newest other version
        db.session.get(ModelVersion, 2).status = "retired"
        db.session.commit()
    html = admin.get("/admin/experiments").get_data(as_text=True)
    assert (selected(html, "control_version_id"), selected(html, "variant_version_id")) == ("1", "2")
    with app.app_context():  # only one usable version: no form, a sentence instead
        db.session.delete(db.session.get(ModelVersion, 2))
        db.session.commit()
    html = admin.get("/admin/experiments").get_data(as_text=True)
    assert 'data-testid="one-version"' in html and "Only one model version (v1-base)" in html
    assert 'data-action="create-experiment"' not in html


def test_new_experiment_form_prefers_the_newest_candidate(setup, micro_model_dir):
    app, _ = setup
    newest = register_model(app, micro_model_dir, name="v4-dpo", status="candidate")
    html = Admin(app).get("/admin/experiments").get_data(as_text=True)
    variant = re.search(r'<select [^>]*name="variant_version_id".*?</select>', html, re.S).group(0)
    assert f'<option value="{newest}" selected>v4-dpo (candidate)' in variant


def test_a_quiet_run_is_shown_late_before_the_watchdog_stops_it(setup):
    from datetime import timedelta

    from webapp.core.models import TrainingRun, utcnow

    app, _ = setup
    admin = Admin(app)
    now = utcnow()
    with app.app_context():
        quiet = TrainingRun(status="running", stage="policy", started_at=now - timedelta(seconds=300),
                            heartbeat_at=now - timedelta(seconds=250),
                            config={"limits": {"stall_seconds": 600, "max_seconds": 3600}})
        busy = TrainingRun(status="running", stage="policy", started_at=now, heartbeat_at=now,
                           config={"limits": {"stall_seconds": 600, "max_seconds": 3600}})
        db.session.add_all([quiet, busy])
        db.session.commit()
        quiet_id, busy_id = quiet.id, busy.id
    late = admin.get(f"/api/admin/runs/{quiet_id}").get_json()["late"]
    assert late.startswith("no progress for 25") and late.endswith("stopped after 600 s without progress")
    assert admin.get(f"/api/admin/runs/{busy_id}").get_json()["late"] is None
    page = admin.get(f"/admin/runs/{quiet_id}").get_data(as_text=True)
    notice = page[page.index('data-testid="run-late"'):]
    assert notice.split(">", 1)[0].find("hidden") == -1 and "Late: no progress for 25" in notice
    assert 'data-testid="run-late" hidden' in admin.get(f"/admin/runs/{busy_id}").get_data(as_text=True)


def test_starting_a_run_shows_it_queued_at_once(setup, monkeypatch):
    import subprocess

    from webapp.core.models import TrainingRun

    app, _ = setup
    app.config["RLHF_RETRAIN_MIN_FEEDBACK"] = 0
    admin = Admin(app)
    started = []

    class Child:  # stands in for the rl-train process: what was started, and with which run
        pid = 4321

        def __init__(self, cmd, **kwargs):
            started.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Child)
    resp = admin.post("/api/admin/runs", {"algorithm": "dpo"})
    assert resp.status_code == 202 and resp.get_json()["status"] == "queued"
    run_id = resp.get_json()["run_id"]
    assert started and started[0][started[0].index("--run-id") + 1] == str(run_id)
    with app.app_context():
        run = db.session.get(TrainingRun, run_id)
        assert (run.status, run.algorithm, run.trigger, run.pid) == ("queued", "dpo", "manual", 4321)
    assert f'href="/admin/runs/{run_id}"' in admin.get("/admin/runs").get_data(as_text=True)


def test_settings_page_shows_effective_values_and_sources_read_only(tmp_path, micro_model_dir, monkeypatch):
    inst = tmp_path / "instance"
    inst.mkdir()
    (inst / "config.toml").write_text("[training.policy]\nlora_r = 8\n")
    monkeypatch.setenv("RLHF_TEMPERATURE", "0.6")
    app = make_app(inst, RLHF_BASE_MODEL="<img src=x onerror=alert(1)>")
    with app.app_context():
        set_admin_password("root", PASSWORD)
    assert app.test_client().get("/admin/settings").status_code == 302  # admins only
    admin = Admin(app)
    html = admin.get("/admin/settings").get_data(as_text=True)

    def row(name):
        return re.search(rf'<tr data-setting="{re.escape(name)}"[^>]*>(.*?)</tr>', html, re.S).group(1)

    assert ("<code class=\"value\">8</code>" in row("training.policy.lora_r")
            and "config.toml" in row("training.policy.lora_r"))
    assert "RLHF_TRAINING_POLICY_LORA_R" in row("training.policy.lora_r")
    assert "0.6" in row("temperature") and "environment" in row("temperature") and "default 0.8" in row("temperature")
    assert "create_app(config)" in row("base_model") and "&lt;img src=x onerror=alert(1)&gt;" in row("base_model")
    assert "<img src=x" not in html  # escaped, like all text
    assert "********" in row("secret_key") and (inst / "secret_key").read_text() not in html
    assert str(inst) not in html  # sources inside the instance are shown relative to it
    assert 'data-setting="training.gate.max_kl"' in html and 'method="post"' not in html.split("<main")[1]


def test_settings_page_masks_credentials_inside_urls(tmp_path, monkeypatch):
    """Not only the settings marked secret: a URL's user and password (``https://user:pass@host``)
    and the values of token-like query parameters are masked wherever a setting holds a URL, on
    the page and in ``flask settings`` (one function shows both)."""
    from webapp.core.settings import effective, resolve

    monkeypatch.setenv("RLHF_OPENWEBUI_URL", "https://owui-user:owui-pass@openwebui.example:8080/base?token=abc1&page=2")
    monkeypatch.setenv("RLHF_INFERENCE_URL", "http://sk-live-123@gpu.example:8000")
    resolved = resolve({"INSTANCE_DIR": str(tmp_path / "x")})
    rows = {r["name"]: r["value"] for r in effective(resolved.settings, resolved.sources)}
    assert rows["openwebui_url"] == "https://***@openwebui.example:8080/base?token=***&page=2"
    assert rows["inference_url"] == "http://***@gpu.example:8000"
    assert not any(word in json.dumps(rows) for word in ("owui-user", "owui-pass", "abc1", "sk-live-123"))
    app = make_app(tmp_path / "instance")
    with app.app_context():
        set_admin_password("root", PASSWORD)
    html = Admin(app).get("/admin/settings").get_data(as_text=True)
    row = re.search(r'<tr data-setting="openwebui_url"[^>]*>(.*?)</tr>', html, re.S).group(1)
    assert "https://***@openwebui.example:8080/base?token=***&amp;page=2" in row
    assert not any(word in html for word in ("owui-user", "owui-pass", "abc1", "sk-live-123"))
    with app.app_context():
        db.engine.dispose()


def test_run_page_shows_the_settings_the_run_trained_with(setup):
    from dataclasses import replace

    from rlhf.settings import CycleSettings, PolicySettings

    app, _ = setup
    config = replace(CycleSettings(algorithm="dpo"), policy=PolicySettings(lora=True, lora_r=4)).to_dict()
    with app.app_context():
        run = TrainingRun(trigger="cli", algorithm="dpo", status="succeeded",
                          config={**config, "limits": {"stall_seconds": 9}})
        db.session.add(run)
        db.session.commit()
        run_id = run.id
    html = Admin(app).get(f"/admin/runs/{run_id}").get_data(as_text=True)
    assert 'data-testid="run-settings"' in html
    assert re.search(r'<tr data-setting="training.policy.lora_r" class="changed">.*?<code>4</code>', html)
    assert re.search(r'<tr data-setting="training.algorithm" class="changed">.*?<code>dpo</code>', html)
    assert re.search(r'<tr data-setting="training.policy.beta">.*?<code>0.1</code>', html)  # a default, recorded too
    assert "stall_seconds" not in html.split('data-testid="run-settings"')[1].split("</details>")[0]


def test_run_page_shows_what_judged_the_candidate_and_labels_the_optimized_against_gain(setup):
    """The gate's evidence as the run stored it (rlhf.gate.evaluation): held-out pairs, their share
    with its interval and p-value, the judge's gain; the optimized-against gain only labelled."""
    from webapp.training.runner import gate_summary

    app, _ = setup
    row = {"mean_reward": 0.1, "empty_rate": 0.0, "repetition": 0.0, "distinct2": 0.6, "mean_words": 20.0}
    evaluation = {
        "passed": True, "verdict": "passed", "reasons": [], "reward_gain": 0.912, "kl_from_parent": 1.5,
        "max_length": 384,
        "judged_by": ["held-out preferences: implicit reward margin vs the parent on 14 pairs (sign test, alpha 0.05)",
                      "judge reward model trained on 14 held-out pairs (gain > 0.0)",
                      "KL from the parent and degeneration checks"],
        "heldout": {"pairs": 14, "wins": 12, "losses": 2, "ties": 0, "share": 0.8571, "ci95": [0.6006, 0.9599],
                    "p_value": 0.006470, "mean_margin": 2.31, "alpha": 0.05, "min_pairs": 8},
        "judge": {"trained_on_pairs": 14, "steps": 40, "accuracy": 0.93, "accuracy_pairs": 61, "trusted": True,
                  "trust_p": 1e-12, "parent_mean": -0.2, "candidate_mean": 0.35, "gain": 0.55, "prompts": 19,
                  "p_value": 0.0004, "p_worse": 0.99},
        "evidence_p": 0.0008,
        "parent": {**row, "judge_reward": -0.2}, "candidate": {**row, "mean_reward": 1.012, "judge_reward": 0.35}}
    short = {**evaluation, "passed": False, "verdict": "not enough evidence", "judge": None,
             "reasons": ["not enough evidence: 3 held-out preference pairs, the gate needs at least 8 "
                         "(training.gate.min_heldout_pairs)"],
             "judged_by": ["nothing: 3 held-out preference pairs, fewer than the 8 the gate needs"],
             "heldout": {**evaluation["heldout"], "pairs": 3, "wins": 3, "losses": 0, "share": 1.0}}
    with app.app_context():
        runs = [TrainingRun(trigger="cli", algorithm="ppo", status="succeeded",
                            metrics={"decision": decision, "evaluation": ev})
                for decision, ev in (("candidate", evaluation), ("rejected_by_gate", short))]
        db.session.add_all(runs)
        db.session.commit()
        ids = [r.id for r in runs]
    admin = Admin(app)
    html = admin.get(f"/admin/runs/{ids[0]}").get_data(as_text=True)
    verdict = html.split('data-testid="gate-verdict">')[1].split("</p>")[0]
    assert "<b>passed</b>" in verdict
    assert "Judged by: held-out preferences: implicit reward margin vs the parent on 14 pairs" in html
    evidence = html.split('data-testid="gate-evidence"')[1].split("</table>")[0]
    assert re.search(r'data-evidence="heldout-pairs">.*?<td>14 \(the gate needs at least 8\)</td>', evidence)
    assert "12 of 14 pairs (2 less, 0 tied) · share 85.7% [95% CI 60.1%, 96.0%]" in evidence
    assert "p = 0.00647 · mean margin 2.310 nats" in evidence
    assert ("gain 0.550 (-0.200 → 0.350), signed-rank p = 0.0004 over 19 prompts · trained on 14 held-out pairs, "
            "accuracy 93.0% on 61 training pairs it never saw</td>") in evidence
    assert re.search(r'data-evidence="combined">.*?<td>p = 0.0008 \(must be below 0.05\)</td>', evidence)
    optimized = html.split('data-testid="optimized-gain">')[1].split("</p>")[0]
    assert "optimized against 0.912 (reported only: it never decides)" in optimized
    assert "read as the policy trained: the end of each prompt within 384 tokens of prompt + answer" in optimized
    html = admin.get(f"/admin/runs/{ids[1]}").get_data(as_text=True)
    verdict = html.split('data-testid="gate-verdict">')[1].split("</p>")[0]
    assert ("<b>not enough evidence</b>" in verdict
            and "3 held-out preference pairs, the gate needs at least 8" in verdict)
    assert "not trained (too few held-out pairs)" in html
    # rl-train --json carries the same evidence
    out = gate_summary(evaluation)
    assert out["heldout"]["pairs"] == 14 and out["judge"]["gain"] == 0.55 and out["verdict"] == "passed"
    assert out["evidence_p"] == 0.0008
    assert out["optimized_against"] == {"reward_gain": 0.912, "decides": False}


def test_run_page_says_which_evidence_carried_the_verdict_with_the_effect_and_its_bound(setup):
    """The gate's evidence as rlhf.gate stores it now: the page says, in words, what carried a pass
    (the held-out pairs' mean margin and its lower bound against the minimum) and why a candidate the
    trusted judge found flat was not passed on the pairs alone; the effect has its own row."""
    from rlhf.gate.instruments import heldout_summary, judge_trust
    from rlhf.gate.verdict import decided_by, evidence_reasons, judged_by
    from rlhf.settings import GateThresholds

    app, _ = setup
    t = GateThresholds()
    row = {"mean_reward": 0.1, "empty_rate": 0.0, "repetition": 0.0, "distinct2": 0.6, "mean_words": 20.0}
    judge = {"trained_on_pairs": 21, "accuracy": 0.9, "accuracy_pairs": 60, **judge_trust(0.9, 60, t.alpha),
             "parent_mean": -0.2, "candidate_mean": -0.16, "gain": 0.038, "prompts": 18, "p_value": 0.70,
             "p_worse": 0.31}
    runs = []
    for margins, j in (([1.2, 0.9, 1.8, 0.7, 1.1, 1.5, 0.6, 1.3, 1.0, 1.4, 0.8, 1.6], None),
                       ([0.2] * 18 + [-0.1] * 3, judge)):
        h = {**heldout_summary(margins, t.min_margin, t.alpha), "alpha": t.alpha, "min_pairs": t.min_heldout_pairs}
        reasons = evidence_reasons(h, j, t)
        runs.append({"passed": not reasons, "verdict": "rejected" if reasons else "passed", "reasons": reasons,
                     "judged_by": judged_by(h, j, t), "decided_by": decided_by(h, j, t), "heldout": h, "judge": j,
                     "evidence_p": 0.01, "reward_gain": 0.5, "kl_from_parent": 1.0, "parent": row, "candidate": row})
    with app.app_context():
        rows = [TrainingRun(trigger="cli", algorithm="ppo", status="succeeded",
                            metrics={"decision": "candidate" if ev["passed"] else "rejected_by_gate", "evaluation": ev})
                for ev in runs]
        db.session.add_all(rows)
        db.session.commit()
        ids = [r.id for r in rows]
    admin = Admin(app)
    html = admin.get(f"/admin/runs/{ids[0]}").get_data(as_text=True)
    carried = html.split('data-testid="gate-decided-by">')[1].split("</p>")[0]
    low = runs[0]["heldout"]["margin_low"]
    assert carried.startswith("<b>What carried it:</b> Better, carried by the held-out pairs: on 12 held-out pairs "
                              "the candidate moved towards the answer people preferred by 1.16 nats on average (12 of "
                              f"12 pairs the right way); with 95% confidence at least {low:.2f}, above the 0.75 the "
                              "gate needs")
    effect = html.split('data-evidence="heldout-effect">')[1].split("</tr>")[0]
    assert f"1.158 nats, at least {low:.3f} (the gate needs more than 0.75)" in effect
    html = admin.get(f"/admin/runs/{ids[1]}").get_data(as_text=True)
    why = html.split('data-testid="gate-decided-by">')[1].split("</p>")[0]
    assert why.startswith("<b>Why not:</b> Not shown better: the trusted judge found no gain, and the pairs alone "
                          "cannot outvote it: on 21 held-out pairs the candidate moved towards the answer people "
                          "preferred by 0.16 nats on average (18 of 21 pairs the right way)")
    assert "not above the 0.75 the gate needs; the judge scored the candidate&#39;s own answers +0.038" in why
    assert admin.get(f"/api/admin/runs/{ids[1]}").get_json()["gate"]["better"] is False


def test_a_reward_model_that_cannot_be_loaded_leaves_the_pages_up(setup):
    """An experiment whose variant's reward model directory is damaged (a config.json only):
    the overview, the experiment page and the metrics API answer, and say why scores are missing."""
    app, inst = setup
    admin = Admin(app)
    damaged_reward_model(inst)
    with app.app_context():
        db.session.get(ModelVersion, 2).metrics = {"reward_model_path": "runs/run-1/reward_model"}
        db.session.commit()
    assert admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1,
                                                 "variant_version_id": 2}).status_code == 201
    with app.app_context():  # an answer nobody scored yet: showing the metrics would load the reward model
        answer_at(anon_user("u1"), utcnow(), experiment_id=1, arm="variant", version_id=2)
        db.session.commit()
    for url in ("/admin/", "/admin/experiments/e1"):
        assert admin.get(url).status_code == 200, url
    assert "cannot be loaded" in admin.get("/admin/experiments/e1").get_data(as_text=True)
    metrics = admin.get("/api/admin/metrics?experiment=e1")
    assert metrics.status_code == 200
    assert metrics.get_json()["reward_model_problem"].startswith("the reward model cannot be loaded")
    with app.app_context():
        assert db.session.scalars(db.select(AnswerScore)).all() == []  # nothing stored for it
