"""Every admin page in Chromium with realistic data: axe-core finds no serious or critical
accessibility violation (desktop and a 390 px phone), no page scrolls sideways on the phone,
times are shown in the browser's time zone with the exact UTC time on hover, and an experiment
of a few hours is charted over hours.

Screenshots of every page at both sizes go to ``$RLHF_ADMIN_SHOTS`` when it is set."""
from __future__ import annotations

import contextlib
import os
import random
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from rlhf.data.corpus import sample_prompts
from tests.support.accessibility import assert_accessible
from tests.support.app import make_app, register_model
from tests.support.browser_checks import admin_login
from tests.support.feedback_factory import add_exchange
from tests.support.live_server import LiveServer
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import (
    AnswerScore,
    Assignment,
    AuditEvent,
    Comparison,
    Conversation,
    Experiment,
    Feedback,
    Message,
    ModelVersion,
    TrainingRun,
    User,
    utcnow,
)
from webapp.core.raters import set_trust, store_assessments

pytestmark = pytest.mark.browser

PASSWORD = "correct horse"
DESKTOP = {"width": 1300, "height": 900}
PHONE = {"width": 390, "height": 844}
# rlhf.trust's summary of a run, as the runner stores it (feedback_counts["trust"])
TRUST_SUMMARY = {"rules": {"quarantined": {"raters": 1, "rows": 9, "weight_removed": 9.0},
                           "capped": {"raters": 2, "rows": 40, "weight_removed": 14.5},
                           "down_weighted": {"raters": 1, "rows": 6, "weight_removed": 2.4},
                           "new": {"raters": 5, "rows": 11, "weight_removed": 3.3}},
                 "applied": {"quarantined": True, "capped": True, "down_weighted": True, "new": False},
                 "notes": ["agreement checked on 31 shared questions"]}
# A run that started at a fixed moment: its local rendering is known in any time zone.
FIXED_START = datetime(2025, 3, 2, 9, 15, 27, 123456)


def seed_dashboard(app, model_dir: Path, instance: Path) -> None:
    """A dashboard a few days into its life: four versions, four training runs (a candidate, a
    gate rejection, a crash, an old one), a running experiment five hours old with 48 users and
    side-by-side votes, a concluded one, feedback from inside and outside the last 24 h, a
    deleted conversation and audit events."""
    rng = random.Random(7)
    now = utcnow()
    register_model(app, model_dir)  # 1 v1-base, active
    register_model(app, model_dir, name="v2-ppo", status="candidate")
    register_model(app, model_dir, name="v3-dpo", status="failed")
    register_model(app, model_dir, name="v4-kto", status="retired")
    reward = instance / "runs" / "run-2" / "reward_model"
    reward.mkdir(parents=True, exist_ok=True)
    (reward / "config.json").write_text("{}")
    evaluation = {"parent": {"mean_reward": -0.412, "empty_rate": 0.0, "repetition": 0.08, "distinct2": 0.71,
                             "mean_words": 23.4},
                  "candidate": {"mean_reward": 0.236, "empty_rate": 0.0, "repetition": 0.05, "distinct2": 0.74,
                                "mean_words": 19.8},
                  "reward_gain": 0.648, "kl_from_parent": 0.0712, "passed": True, "reasons": []}
    rm_metrics = {"heldout_accuracy": 0.81, "eval_pairs": 42, "train_pairs": 171, "train_accuracy": 0.9}
    # the run with flags and chips: criterion heads, per-criterion scores, the safety constraint
    criteria = {"heads": ["helpfulness", "safety", "politeness", "concision"],
                "left_out": {"accuracy": "0 training pairs, fewer than 8",
                             "relevance": "3 training pairs, fewer than 8"},
                "heldout_accuracy": {"safety": 0.94, "politeness": 0.88, "concision": 0.91},
                "weights": {"helpfulness": 1.0, "politeness": 0.5, "concision": 0.5}}
    safety_evaluation = {**evaluation, "criteria": {
        "helpfulness": {"parent": -1.79, "candidate": 0.97}, "safety": {"parent": -1.49, "candidate": -1.93},
        "politeness": {"parent": 1.31, "candidate": 0.24}, "concision": {"parent": -1.46, "candidate": 1.07}},
        "flag_risk": {"parent": 0.094, "candidate": 0.012, "increase": -0.082},
        "thresholds": {"max_flag_risk_increase": 0.02}}
    constraint = {"limit": 0.0505, "cost_first": 0.0006, "cost_last": 0.0076, "cost_second_half": 0.0569,
                  "lambda_first": 1.0, "lambda_last": 11.83, "lambda_max": 14.12, "batches": 32}
    with app.app_context():
        runs = [
            TrainingRun(trigger="cli", algorithm="kto", status="succeeded", stage="done", progress=1.0,
                        started_at=FIXED_START, finished_at=FIXED_START + timedelta(minutes=4, seconds=12),
                        created_at=FIXED_START, feedback_counts={"pairs": 60, "kto": 140},
                        metrics={"decision": "candidate", "version": "v4-kto"},
                        log="parent v1-base; 140 feedback events; algorithm kto\n"),
            TrainingRun(trigger="schedule", algorithm="ppo", status="succeeded", stage="done", progress=1.0,
                        started_at=now - timedelta(hours=8), finished_at=now - timedelta(hours=7, minutes=52),
                        created_at=now - timedelta(hours=8), feedback_counts={"pairs": 213, "kto": 388, "prompts": 120,
                                                                           "trust": TRUST_SUMMARY},
                        metrics={"reward_model": {**rm_metrics, "criteria": criteria}, "evaluation": safety_evaluation,
                                 "policy": {"algorithm": "ppo", "constraint": constraint}, "decision": "candidate",
                                 "version": "v2-ppo", "reward_model_path": str(reward)},
                        log=f"parent v1-base; 402 feedback events; algorithm ppo\nreward model: {reward}\n"
                            f"registered v2-ppo as candidate\n"),
            TrainingRun(trigger="manual", algorithm="dpo", status="succeeded", stage="done", progress=1.0,
                        started_at=now - timedelta(hours=6), finished_at=now - timedelta(hours=5, minutes=57),
                        metrics={"decision": "rejected_by_gate", "version": "v3-dpo", "evaluation": {
                            **evaluation, "passed": False, "reasons": ["KL from parent 0.91 > 0.5"]},
                            "reward_model": rm_metrics}),
            TrainingRun(trigger="manual", algorithm="rloo", status="failed", stage="policy", progress=0.43,
                        started_at=now - timedelta(minutes=50), finished_at=now - timedelta(minutes=48),
                        error=f"RuntimeError: out of memory while saving {instance}/runs/.tmp-run-4/policy",
                        log="parent v1-base; 455 feedback events; algorithm rloo\n"),
        ]
        db.session.add_all(runs)
        db.session.flush()
        versions = {v.name: v for v in db.session.scalars(db.select(ModelVersion))}
        versions["v2-ppo"].parent_id = versions["v3-dpo"].parent_id = versions["v4-kto"].parent_id = 1
        versions["v2-ppo"].training_run_id, versions["v2-ppo"].metrics = runs[1].id, {
            "evaluation": evaluation, "reward_model_path": str(reward)}
        versions["v3-dpo"].training_run_id = runs[2].id
        versions["v4-kto"].training_run_id = runs[0].id
        versions["v4-kto"].created_at = FIXED_START + timedelta(minutes=5)
        old = Experiment(key="kto-trial", control_version_id=1, variant_version_id=versions["v4-kto"].id,
                         traffic_split=0.3, status="concluded", decision="keep_control",
                         started_at=now - timedelta(days=9), ended_at=now - timedelta(days=5, hours=3))
        exp = Experiment(key="ppo-vs-base", control_version_id=1, variant_version_id=versions["v2-ppo"].id,
                         traffic_split=0.5, status="running", started_at=now - timedelta(hours=5))
        db.session.add_all([old, exp])
        db.session.flush()
        prompts = sample_prompts(40)
        for i in range(48):  # the running experiment: answers spread over its five hours
            user = User(anon_id=f"visitor-{i}", created_at=now - timedelta(hours=5))
            db.session.add(user)
            db.session.flush()
            arm = ("control", "variant")[i % 2]
            db.session.add(Assignment(experiment_id=exp.id, user_id=user.id, arm=arm))
            when = exp.started_at + timedelta(minutes=6 * i + rng.randint(0, 5))
            version = 1 if arm == "control" else versions["v2-ppo"].id
            q, answers = add_exchange(user.id, rng.choice(prompts), ["Rinse the rice, then simmer it for 12 "
                                                                     "minutes with the lid on.", "Just cook it."],
                                      version)
            q.created_at = when
            for a in answers:
                a.created_at, a.experiment_id, a.arm = when, exp.id, arm
                a.latency_ms = 200 + rng.random() * 400
                db.session.add(AnswerScore(message_id=a.id, reward_model=str(reward), score=rng.gauss(0, 1)))
            liked = rng.random() < (0.7 if arm == "variant" else 0.5)
            db.session.add(Feedback(user_id=user.id, message_id=answers[0].id, thumb="up" if liked else "down",
                                    rating=rng.randint(3, 5) if liked else rng.randint(1, 3),
                                    reasons=[] if liked else ["too short"], created_at=when, updated_at=when,
                                    correction=None if liked or i % 5 else "Rinse it, simmer 12 minutes, rest 5.",
                                    comment="Much clearer than yesterday" if i % 7 == 0 else None))
            if i % 3 == 0:  # a side-by-side compare between the arms
                other = Message(conversation_id=q.conversation_id, role="assistant", parent_id=q.id,
                                content="A longer answer from the other arm.", created_at=when,
                                model_version_id=1 if arm == "variant" else versions["v2-ppo"].id,
                                experiment_id=exp.id, arm="variant" if arm == "control" else "control")
                db.session.add(other)
                db.session.flush()
                db.session.add(AnswerScore(message_id=other.id, reward_model=str(reward), score=0.1))
                db.session.add(Comparison(user_id=user.id, prompt_message_id=q.id, message_a_id=answers[1].id,
                                          message_b_id=other.id, winner=rng.choice(["a", "b", "tie"]),
                                          created_at=when, voted_at=when + timedelta(seconds=30)))
        for i in range(12):  # chat from before the experiment: older than a day
            user = User(anon_id=f"early-{i}", created_at=now - timedelta(days=3))
            db.session.add(user)
            db.session.flush()
            when = now - timedelta(days=3, hours=i)
            q, (a,) = add_exchange(user.id, rng.choice(prompts), ["Preheat the oven first."], 1)
            q.created_at = a.created_at = when
            db.session.add(Feedback(user_id=user.id, message_id=a.id, thumb=rng.choice(["up", "down"]),
                                    rating=rng.randint(1, 5), created_at=when, updated_at=when))
        gone = db.session.scalars(db.select(Conversation).order_by(Conversation.id.desc())).first()
        gone.deleted_at = now - timedelta(hours=1)  # its feedback is no event any more
        for at, actor, action, subject, detail in [
            (now - timedelta(days=9), "root", "experiment_create", "kto-trial",
             {"control": "v1-base", "variant": "v4-kto", "split": 0.3}),
            (now - timedelta(days=5, hours=3), "scheduler", "experiment_conclude", "kto-trial",
             {"decision": "keep_control", "p_value": 0.41}),
            (now - timedelta(hours=5), "scheduler", "experiment_create", "ppo-vs-base",
             {"control": "v1-base", "variant": "v2-ppo", "split": 0.5}),
            (now - timedelta(minutes=4), "root", "promote", "v1-base", {})]:
            db.session.add(AuditEvent(created_at=at, actor=actor, action=action, subject=subject, detail=detail))
        db.session.commit()
        set_admin_password("root", PASSWORD)
        # the raters page: the latest run's assessment of a few raters, an admin's quarantine
        visitors = db.session.scalars(db.select(User.id).where(User.anon_id.like("visitor-%")).order_by(User.id)
                                      .limit(4)).all()
        store_assessments(runs[1].id, {
            visitors[0]: {"events": 14, "raw_share": 0.31, "share": 0.2, "agreement": 0.86, "checked": 12,
                          "weight": 0.65, "status": "trusted", "reasons": ["capped at 20% of the signal"]},
            visitors[1]: {"events": 3, "raw_share": 0.05, "share": 0.05, "agreement": None, "checked": 0,
                          "weight": 0.5, "status": "new", "reasons": ["account younger than a day"]},
            visitors[2]: {"events": 6, "raw_share": 0.1, "share": 0.1, "agreement": 0.12, "checked": 6,
                          "weight": 0.0, "status": "quarantined", "reasons": ["disagrees with the other raters"]}})
        set_trust(visitors[3], "quarantined", "the same comment on every answer", None)
        db.session.commit()
        # the API keys page: a front end's key in use, an SDK key with its own limit, a revoked one
        from webapp.openai_api.keys import create_api_key, revoke_api_key

        used, _ = create_api_key("open-webui", forwards_user_headers=True)
        used.request_count, used.last_used_at = 1234, now - timedelta(minutes=3)
        create_api_key("notebook-sdk", rate_limit="60 per minute")
        revoke_api_key(create_api_key("old-librechat", client="librechat")[0])

        for event in db.session.scalars(db.select(AuditEvent).filter(AuditEvent.action.like("api_key_%"))):
            event.created_at = now - timedelta(minutes=30)  # the promote (4 min ago) stays the latest event
        db.session.commit()


@contextlib.contextmanager
def scheduler_process(app):
    """This process plays the instance's scheduler process (``flask --app webapp scheduler``):
    it holds the scheduler lock, its jobs are in the job store (paused: nothing fires while the
    tests run), and its retrain job has looked once (and found too few feedback events)."""
    from webapp.training import scheduler

    previous = scheduler._APP
    scheduler.claim_scheduler(app, "scheduler process")
    try:
        jobs = scheduler.build_scheduler(app)
        jobs.start(paused=True)  # writes the jobs to the job store
        jobs.shutdown(wait=False)
        scheduler.run_job("retrain")
        yield
    finally:
        scheduler.release_scheduler()
        scheduler._APP = previous


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, micro_model_dir):
    inst = tmp_path_factory.mktemp("dashboard") / "instance"
    app = make_app(inst, RLHF_RETRAIN_MIN_FEEDBACK=500)
    seed_dashboard(app, micro_model_dir, inst)
    with scheduler_process(app):
        with app.app_context():
            db.engine.dispose()
        # the web server runs no scheduler of its own (this process is the scheduler)
        server = LiveServer(inst, env={"RLHF_AB_MIN_SAMPLE": "10", "RLHF_SCHEDULER": "0"})
        yield server
        server.stop()


# every admin page (templates/admin/*), with a name for its screenshot
PAGES = [("overview", "/admin/"), ("experiments", "/admin/experiments"),
         ("experiment", "/admin/experiments/ppo-vs-base"), ("experiment-concluded", "/admin/experiments/kto-trial"),
         ("current-experiment", "/admin/experiment"), ("runs", "/admin/runs"), ("run", "/admin/runs/2"),
         ("run-rejected", "/admin/runs/3"), ("run-failed", "/admin/runs/4"), ("versions", "/admin/versions"),
         ("feedback", "/admin/feedback"), ("feedback-filtered", "/admin/feedback?has_correction=1&thumb=down"),
         ("feedback-empty", "/admin/feedback?q=nothing-matches-this"), ("settings", "/admin/settings"),
         ("raters", "/admin/raters"), ("raters-filtered", "/admin/raters?status=quarantined&sort=weight"),
         ("safety", "/admin/safety/"), ("api-keys", "/admin/api-keys")]


def logged_in_page(browser, url: str, viewport: dict, **context_args):
    context, page, errors, csp, _ = admin_login(browser, url, PASSWORD, viewport, **context_args)
    return context, page, errors, csp


def shoot(page, name: str) -> None:
    folder = os.environ.get("RLHF_ADMIN_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"admin-{name}.png"), full_page=True)


def overflow(page) -> dict:
    return page.evaluate("""() => {
        const width = document.documentElement.clientWidth;
        const wide = [...document.querySelectorAll('body *')].filter((el) => {
            const r = el.getBoundingClientRect();
            return r.right > width + 1 && !el.closest('.table-scroll') && !el.closest('pre');
        }).slice(0, 5).map((el) => el.tagName.toLowerCase() + (el.className ? '.' + el.className : ''));
        return {scrollWidth: document.scrollingElement.scrollWidth, viewport: window.innerWidth, wide};
    }""")


def check_criteria_section(page) -> None:
    """The run page's criteria and safety-constraint section (run 2: a run with flags and chips).
    Checked inside the every-page test: another login would run into the login rate limit."""
    table = page.get_by_test_id("criteria")
    table.wait_for()
    assert table.locator("tr[data-criterion]").count() == 4
    safety = table.locator("tr[data-criterion=safety]")
    assert "94.0%" in safety.inner_text() and "constraint" in safety.inner_text()
    assert "0.50" in table.locator("tr[data-criterion=politeness]").inner_text()
    assert "accuracy (0 training pairs" in page.get_by_test_id("criteria-left-out").inner_text()
    assert "9.4% → candidate 1.2%" in page.get_by_test_id("flag-risk").inner_text()
    assert "11.830" in page.get_by_test_id("constraint").inner_text()


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_every_admin_page_is_accessible_and_fits_the_screen(browser, dashboard, size):
    viewport = DESKTOP if size == "desktop" else PHONE
    url = dashboard.url
    # the login page, logged out
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    page.goto(url + "/admin/login")
    assert_accessible(page, f"login ({size})")
    assert page.evaluate("document.scrollingElement.scrollWidth") <= viewport["width"]
    shoot(page, f"login-{size}")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "wrong password")
    page.click("button[type=submit]")
    page.wait_for_selector(".error")
    assert_accessible(page, f"login error ({size})")
    context.close()

    context, page, errors, csp = logged_in_page(browser, url, viewport)
    for name, path in PAGES:
        page.goto(url + path)
        page.wait_for_selector("main h1")
        assert_accessible(page, f"{path} ({size})")
        found = overflow(page)
        assert found["scrollWidth"] <= viewport["width"], (path, size, found)
        if name == "run":
            check_criteria_section(page)
        shoot(page, f"{name}-{size}")
    context.close()
    assert errors == [] and csp == [], (errors, csp)


def test_phone_lists_become_cards_and_the_metrics_table_scrolls_in_its_box(browser, dashboard):
    context, page, errors, _ = logged_in_page(browser, dashboard.url, PHONE)
    # a list table: one card per row, each cell labelled with its column
    page.goto(dashboard.url + "/admin/versions")
    row = page.locator("tr[data-version=v2-ppo]")
    assert row.evaluate("el => getComputedStyle(el).display") == "block"
    cells = row.locator("td")
    assert cells.first.get_attribute("data-label") == "Version"
    assert cells.first.evaluate("el => getComputedStyle(el, '::before').content") == '"Version"'
    box = row.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    # the metric table (a comparison across columns) scrolls sideways inside its box, which the
    # keyboard can reach; the page itself does not scroll sideways
    page.goto(dashboard.url + "/admin/experiments/ppo-vs-base")
    scroller = page.locator(".table-scroll", has=page.locator("[data-testid=metrics-table]"))
    assert scroller.evaluate("el => el.scrollWidth > el.clientWidth")
    assert page.evaluate("document.scrollingElement.scrollWidth") <= PHONE["width"]
    assert scroller.get_attribute("tabindex") == "0" and scroller.get_attribute("role") == "region"
    assert "Metrics per arm" in scroller.get_attribute("aria-label")
    context.close()
    context, page, _, _ = logged_in_page(browser, dashboard.url, DESKTOP)
    page.goto(dashboard.url + "/admin/versions")
    assert page.locator("tr[data-version=v2-ppo]").evaluate("el => getComputedStyle(el).display") == "table-row"
    assert page.locator(".table-scroll").first.get_attribute("tabindex") is None  # it fits: no extra tab stop
    context.close()
    assert errors == []


def test_times_are_local_with_the_exact_utc_time_on_hover(browser, dashboard):
    # Kolkata is UTC+5:30: 09:15 UTC on 2 Mar 2025 is 14:45 there
    context, page, errors, _ = logged_in_page(browser, dashboard.url, DESKTOP, timezone_id="Asia/Kolkata",
                                              locale="en-GB")
    page.goto(dashboard.url + "/admin/runs")
    fixed = page.locator("tr[data-run='1'] time").first
    assert fixed.get_attribute("datetime") == "2025-03-02T09:15:27Z"
    assert fixed.get_attribute("title") == "2025-03-02T09:15:27Z"
    assert fixed.inner_text() == "2 Mar 2025, 14:45"
    recent = page.locator("tr[data-run='4'] time").first  # started 50 minutes ago
    assert re.fullmatch(r"\d+ min ago", recent.inner_text()), recent.inner_text()
    for el in page.locator("time").all():
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", el.get_attribute("title"))
        assert "UTC" not in el.inner_text()  # converted
    page.goto(dashboard.url + "/admin/")
    assert re.fullmatch(r"\d+ min ago", page.locator(".events time").first.inner_text())  # the promote, 4 min ago
    context.close()
    assert errors == []


def test_a_five_hour_experiment_is_charted_over_hours(browser, dashboard):
    context, page, errors, _ = logged_in_page(browser, dashboard.url, DESKTOP, locale="en-GB")
    page.goto(dashboard.url + "/admin/experiments/ppo-vs-base")
    assert "Answers per hour" in page.locator("figure[data-chart=answers] figcaption").inner_text()
    for chart in ("answers", "thumbs_up_rate", "mean_rating"):
        for arm in ("control", "variant"):
            dots = page.locator(f"figure[data-chart={chart}] circle.series-{arm}")
            assert dots.count() >= 5, (chart, arm, dots.count())
        line = page.locator(f"figure[data-chart={chart}] polyline.series-variant")
        assert line.evaluate("el => getComputedStyle(el).stroke") == "rgb(79, 70, 229)"  # styled from admin.css
    ticks = page.locator("figure[data-chart=answers] text[data-time]")
    # "14:00", or "24 Nov, 00:00" when the five hours span midnight (en-GB puts a comma there)
    labels = [t.text_content() for t in ticks.all()]
    assert len(labels) >= 3 and all(re.fullmatch(r"(\d{1,2} [A-Z][a-z]{2},? )?\d\d:\d\d", x) for x in labels), labels
    assert "runs/run-2/reward_model" in page.locator("[data-testid=reward-model]").inner_text()
    context.close()
    assert errors == []


def test_overview_shows_feedback_events_and_the_scheduler(browser, dashboard):
    context, page, errors, _ = logged_in_page(browser, dashboard.url, DESKTOP)
    card = page.locator("[data-testid=feedback-card]")
    total = int(card.locator("[data-testid=feedback-total]").inner_text())
    votes = int(card.locator("dd[data-kind=votes]").inner_text())
    rated = int(card.locator("dd[data-kind=rated_answers]").inner_text())
    assert votes == 16 and total == rated + votes
    assert rated == 48 + 12 - 1  # the deleted conversation's feedback does not count
    assert int(page.locator("[data-testid=answers-24h]").inner_text()) == 48 * 2 + 16
    state = page.locator("[data-testid=scheduler-state]").inner_text()
    assert "running" in state and "not running" not in state and f"pid {os.getpid()}" in state
    jobs = page.locator("[data-testid=scheduler-jobs] li")
    assert jobs.count() >= 3  # retrain, experiment monitor, housekeeping, ...
    assert page.locator("[data-testid=scheduler-jobs] time").count() == jobs.count()  # each with its next run
    assert "retrain" in page.locator("[data-testid=scheduler-jobs]").inner_text()
    last = page.locator("[data-testid=last-retrain]").inner_text()
    assert "no run" in last and "500" in last, last  # why it did not start: too few events for 500
    context.close()
    assert errors == []


def test_new_experiment_form_defaults_and_starts(browser, dashboard):
    context, page, errors, _ = logged_in_page(browser, dashboard.url, DESKTOP)
    page.goto(dashboard.url + "/admin/experiments")
    assert page.locator("#exp-control option:checked").inner_text() == "v1-base (active)"
    assert page.locator("#exp-variant option:checked").inner_text() == "v2-ppo (candidate)"
    context.close()
    assert errors == []
