"""Admin accounts, authorization of every admin route, experiment/version lifecycle, metrics."""
from __future__ import annotations

import json
import random
import re

import pytest
from click.testing import CliRunner
from flask.cli import FlaskGroup

from rlhf.data.corpus import sample_prompts
from tests.support.app import ApiClient, make_app, register_model
from webapp import create_app
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Assignment, AuditEvent, Experiment, ModelVersion, User

PASSWORD = "correct horse"


@pytest.fixture
def setup(tmp_path, micro_model_dir):
    inst = tmp_path / "instance"
    app = make_app(inst, RLHF_AB_MIN_SAMPLE=5)
    register_model(app, micro_model_dir)
    register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    register_model(app, micro_model_dir, name="v3-ppo", status="failed")
    with app.app_context():
        db.session.get(ModelVersion, 2).parent_id = 1
        db.session.commit()
        set_admin_password("root", PASSWORD)
    return app, inst


def login(app, username="root", password=PASSWORD):
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    resp = client.post("/admin/login", data={"username": username, "password": password, "csrf_token": token})
    if resp.status_code == 302:  # signed in: a new CSRF token (the login page's no longer works)
        token = client.get("/api/session").get_json()["csrf_token"]
    return client, token, resp


class Admin:
    def __init__(self, app):
        self.client, self.token, resp = login(app)
        assert resp.status_code == 302

    def get(self, url):
        return self.client.get(url)

    def post(self, url, body=None, method="post"):
        return getattr(self.client, method)(url, json=body, headers={"X-CSRFToken": self.token})


def versions(app):
    with app.app_context():
        return {v.name: v.status for v in db.session.scalars(db.select(ModelVersion))}


# ---------------------------------------------------------------------------- accounts

def test_create_admin_cli_hashes_the_password(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(tmp_path))
    run = lambda *a, **k: CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), list(a), **k)  # noqa: E731
    result = run("create-admin", "alice", "--password-stdin", input="s3cret-pass\n")
    assert result.exit_code == 0 and "Created admin 'alice'" in result.output
    prompted = run("create-admin", "bob", input="another-pass\nanother-pass\n")
    assert prompted.exit_code == 0, prompted.output
    short = run("create-admin", "carol", "--password-stdin", input="short\n")
    assert short.exit_code == 1 and "at least 8 characters" in short.output
    bad = run("create-admin", "no spaces", "--password-stdin", input="long-enough\n")
    assert bad.exit_code == 1 and "username" in bad.output
    app = create_app({"INSTANCE_DIR": str(tmp_path)})
    with app.app_context():
        alice = db.session.scalars(db.select(User).filter_by(username="alice")).one()
        assert alice.is_admin and alice.password_hash != "s3cret-pass" and "s3cret-pass" not in alice.password_hash
        assert db.session.scalars(db.select(User).filter_by(username="carol")).first() is None
    assert login(app, "alice", "s3cret-pass")[2].status_code == 302


def test_login_logout_and_wrong_password(setup):
    app, _ = setup
    client, token, resp = login(app, password="wrong password")
    assert resp.status_code == 401 and "Wrong username or password." in resp.get_data(as_text=True)
    assert client.get("/api/admin/versions").status_code == 401
    client, token, resp = login(app)
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/admin/")
    assert client.get("/api/admin/versions").status_code == 200
    assert client.get("/api/session").get_json()["is_admin"] is True
    assert client.post("/admin/logout", data={"csrf_token": token}).status_code == 302
    assert client.get("/api/admin/versions").status_code == 401


def test_login_redirect_stays_on_site(setup):
    app, _ = setup
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    resp = client.post("/admin/login?next=//evil.example/admin", data={"username": "root", "password": PASSWORD,
                                                                       "csrf_token": token})
    assert resp.headers["Location"].endswith("/admin/")


def test_login_is_rate_limited(setup):
    app, _ = setup
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    codes = [client.post("/admin/login", data={"username": "root", "password": f"guess{i}", "csrf_token": token}).status_code
             for i in range(12)]
    assert codes[:10] == [401] * 10 and codes[10] == 429
    limited = client.post("/admin/login", data={"username": "root", "password": PASSWORD, "csrf_token": token})
    assert limited.status_code == 429 and "Retry-After" in limited.headers
    assert client.get("/api/admin/versions").status_code == 401  # even the right password did not get in


def test_anonymous_visitors_cannot_log_in_without_a_password(setup):
    app, _ = setup
    anon = app.test_client()
    uid = anon.get("/api/session").get_json()["user_id"]
    with app.app_context():
        name = db.session.get(User, uid).anon_id
    assert login(app, username=name, password="")[2].status_code == 401


# ---------------------------------------------------------------------------- authorization matrix

ADMIN_GETS = ["/api/admin/metrics", "/api/admin/experiments", "/api/admin/versions", "/api/admin/runs",
              "/api/admin/runs/1", "/api/admin/feedback", "/api/admin/export?format=pairs", "/api/admin/audit"]
ADMIN_WRITES = [("post", "/api/admin/experiments", {"key": "x", "control_version_id": 1, "variant_version_id": 2}),
                ("patch", "/api/admin/experiments/x", {"traffic_split": 0.3}),
                ("post", "/api/admin/experiments/x/start", None), ("post", "/api/admin/experiments/x/stop", None),
                ("post", "/api/admin/experiments/x/conclude", {"decision": "promote"}),
                ("post", "/api/admin/versions/2/promote", None), ("post", "/api/admin/versions/1/rollback", None),
                ("post", "/api/admin/runs", {})]
ADMIN_PAGES = ["/admin/", "/admin/experiments", "/admin/experiments/x", "/admin/experiment", "/admin/runs",
               "/admin/runs/1", "/admin/versions", "/admin/settings", "/admin/feedback"]


def test_every_admin_route_needs_an_admin(setup):
    app, _ = setup
    visitor = ApiClient(app.test_client())  # a chat user with a session and a valid CSRF token
    for url in ADMIN_GETS:
        for client in (app.test_client(), visitor.client):
            resp = client.get(url)
            assert resp.status_code == 401 and resp.is_json, url
    for method, url, body in ADMIN_WRITES:
        resp = getattr(visitor.client, method)(url, json=body, headers={"X-CSRFToken": visitor.csrf})
        assert resp.status_code == 401, (method, url)
    for url in ADMIN_PAGES:
        resp = app.test_client().get(url)
        assert resp.status_code == 302 and "/admin/login" in resp.headers["Location"], url
    assert versions(app) == {"v1-base": "active", "v2-ppo": "candidate", "v3-ppo": "failed"}


def test_admin_writes_need_the_csrf_token(setup):
    app, _ = setup
    admin = Admin(app)
    for method, url, body in ADMIN_WRITES:
        resp = getattr(admin.client, method)(url, json=body)
        assert resp.status_code == 400 and "CSRF" in resp.get_json()["error"], url
    assert versions(app) == {"v1-base": "active", "v2-ppo": "candidate", "v3-ppo": "failed"}
    with app.app_context():
        assert db.session.query(Experiment).count() == 0


def test_admin_pages_render(setup):
    app, _ = setup
    admin = Admin(app)
    assert admin.post("/api/admin/experiments", {"key": "x", "control_version_id": 1,
                                                 "variant_version_id": 2}).status_code == 201
    for url in ADMIN_PAGES[:-4] + ["/admin/versions", "/admin/settings", "/admin/feedback?thumb=up&q=rice"]:
        if url == "/admin/runs/1":
            continue
        resp = admin.get(url)
        assert resp.status_code == 200, url
        assert b"<h1>" in resp.data
    assert admin.get("/admin/runs/999").status_code == 404
    assert admin.get("/admin/feedback?rating=9").status_code == 400


# ---------------------------------------------------------------------------- lifecycle and bad input

@pytest.mark.parametrize("body,code,needle", [
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 99}, 404, "not found"),
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 2, "traffic_split": 0}, 400, "traffic_split"),
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 2, "traffic_split": 1}, 400, "traffic_split"),
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 2, "traffic_split": "0.5"}, 400, "traffic_split"),
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 2, "traffic_split": True}, 400, "traffic_split"),
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 1}, 400, "different"),
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 3}, 409, "failed"),
    ({"key": "Bad Key!", "control_version_id": 1, "variant_version_id": 2}, 400, "key"),
    ({"key": "e1", "control_version_id": "1", "variant_version_id": 2}, 400, "integers"),
    ({"key": "e1", "variant_version_id": 2}, 400, "control_version_id"),
    ({"key": "e1", "control_version_id": 1, "variant_version_id": 2, "color": "red"}, 400, "Unknown field"),
])
def test_invalid_experiments_are_rejected_and_nothing_changes(setup, body, code, needle):
    app, _ = setup
    resp = Admin(app).post("/api/admin/experiments", body)
    assert resp.status_code == code and needle in resp.get_json()["error"]
    with app.app_context():
        assert db.session.query(Experiment).count() == 0
        assert db.session.query(AuditEvent).count() == 0


def test_one_running_experiment_and_unique_keys(setup):
    app, _ = setup
    admin = Admin(app)
    ok = admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    assert ok.status_code == 201 and ok.get_json()["status"] == "running"
    second = admin.post("/api/admin/experiments", {"key": "e2", "control_version_id": 2, "variant_version_id": 1})
    assert second.status_code == 409 and "already running" in second.get_json()["error"]
    again = admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2,
                                                  "start": False})
    assert again.status_code == 409 and "never reused" in again.get_json()["error"]
    assert admin.post("/api/admin/experiments/e1", {"traffic_split": 2}, method="patch").status_code == 400
    assert admin.post("/api/admin/experiments/e1", {"traffic_split": 0.3}, method="patch").get_json()["traffic_split"] == 0.3
    assert admin.post("/api/admin/experiments/nope/stop").status_code == 404
    assert admin.post("/api/admin/experiments/e1/conclude", {"decision": "maybe"}).status_code == 400
    assert admin.post("/api/admin/experiments/e1/stop").get_json()["status"] == "stopped"
    assert admin.post("/api/admin/experiments/e1/stop").status_code == 409
    # a draft waits until it is started, and only one experiment runs at a time
    draft = admin.post("/api/admin/experiments", {"key": "e3", "control_version_id": 1, "variant_version_id": 2,
                                                  "start": False})
    assert draft.status_code == 201 and draft.get_json()["status"] == "draft"
    assert admin.post("/api/admin/experiments/e3/start").get_json()["status"] == "running"
    assert admin.post("/api/admin/experiments/e3/start").status_code == 409  # only a draft starts
    admin.post("/api/admin/experiments", {"key": "e4", "control_version_id": 2, "variant_version_id": 1,
                                          "start": False})
    busy = admin.post("/api/admin/experiments/e4/start")
    assert busy.status_code == 409 and "already running" in busy.get_json()["error"]
    assert admin.post("/api/admin/experiments/nope/start").status_code == 404


def test_conclude_promote_serves_new_users_the_variant(setup):
    app, _ = setup
    admin = Admin(app)
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    assert admin.post("/api/admin/versions/3/promote").status_code == 409  # failed version
    assert admin.post("/api/admin/versions/1/rollback").status_code == 409  # experiment running
    resp = admin.post("/api/admin/experiments/e1/conclude", {"decision": "promote"})
    assert resp.status_code == 200 and resp.get_json()["decision"] == "promote"
    assert versions(app) == {"v1-base": "retired", "v2-ppo": "active", "v3-ppo": "failed"}
    newcomer = app.test_client().get("/api/session").get_json()
    assert not {"experiment", "arm", "model_version"} & set(newcomer)  # users are never told (blind arms)
    seen = admin.get("/api/session").get_json()  # an admin is told
    assert (seen["experiment"], seen["model_version"]) == (None, "v2-ppo")
    # roll back: the previous version serves again
    assert admin.post("/api/admin/versions/1/rollback").status_code == 409  # not the active one
    back = admin.post("/api/admin/versions/2/rollback")
    assert back.status_code == 200 and back.get_json()["active"]["name"] == "v1-base"
    assert versions(app) == {"v1-base": "active", "v2-ppo": "retired", "v3-ppo": "failed"}
    assert admin.get("/api/session").get_json()["model_version"] == "v1-base"
    assert admin.post("/api/admin/versions/2/promote").get_json()["version"]["status"] == "active"
    assert admin.post("/api/admin/versions/99/promote").status_code == 404
    actions = [e["action"] for e in admin.get("/api/admin/audit").get_json()["events"]]
    assert actions == ["promote", "rollback", "experiment_conclude", "experiment_create"]


def test_keep_control_retires_the_variant(setup):
    app, _ = setup
    admin = Admin(app)
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    admin.post("/api/admin/experiments/e1/conclude", {"decision": "keep_control"})
    assert versions(app) == {"v1-base": "active", "v2-ppo": "retired", "v3-ppo": "failed"}


def test_starting_a_run_is_refused_without_feedback(setup):
    app, _ = setup
    resp = Admin(app).post("/api/admin/runs", {"algorithm": "ppo"})
    assert resp.status_code == 409 and "Not enough feedback" in resp.get_json()["error"]
    assert Admin(app).post("/api/admin/runs", {"algorithm": "sft"}).status_code == 400


# ---------------------------------------------------------------------------- metrics

def simulate_traffic(app, users: int, seed: int = 0):
    rng = random.Random(seed)
    prompts = sample_prompts(40)
    for _ in range(users):
        user = ApiClient(app.test_client())
        conv = user.post("/api/conversations", json={}).get_json()["id"]
        answer = user.post(f"/api/conversations/{conv}/messages",
                           json={"content": rng.choice(prompts), "stream": False}).get_json()["assistant_message"]
        user.post(f"/api/messages/{answer['id']}/feedback",
                  json={"thumb": rng.choice(["up", "down"]), "rating": rng.randint(1, 5)})
        if rng.random() < 0.5:
            pair = user.post(f"/api/conversations/{conv}/compare", json={"content": rng.choice(prompts)}).get_json()
            user.post(f"/api/pairs/{pair['pair_id']}/vote", json={"winner": rng.choice(["a", "b", "tie"])})


def test_metrics_api_matches_ab_report(setup, monkeypatch):
    app, inst = setup
    admin = Admin(app)
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    simulate_traffic(app, 24)
    api = admin.get("/api/admin/metrics?experiment=e1").get_json()
    assert api["arms"]["control"]["users"] + api["arms"]["variant"]["users"] == 24
    names = [m["name"] for m in api["metrics"]]
    assert names == ["thumbs_up_rate", "mean_rating", "correction_rate", "regenerate_rate", "flagged_rate",
                     "compare_win_rate", "mean_reward", "mean_cost", "latency_ms"]
    thumbs = api["metrics"][0]
    assert thumbs["control"]["n"] + thumbs["variant"]["n"] == 24
    assert set(thumbs["comparison"]) == {"diff", "low", "high", "p_value", "chance_to_beat"}
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    monkeypatch.setenv("RLHF_AB_MIN_SAMPLE", "5")
    out = CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), ["ab-report", "--experiment", "e1", "--json"])
    assert out.exit_code == 0, out.output
    cli = json.loads(out.output)
    api.pop("generated_at"), cli.pop("generated_at")
    assert cli == api
    text = CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), ["ab-report"])
    assert text.exit_code == 0 and "thumbs_up_rate" in text.output and "sample ratio" in text.output
    missing = CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), ["ab-report", "--experiment", "nope"])
    assert missing.exit_code == 1 and "no experiment 'nope'" in missing.output
    page = admin.get("/admin/experiments/e1").get_data(as_text=True)
    p_value = f"{api['metrics'][0]['comparison']['p_value']:.4f}" if api["metrics"][0]["enough_data"] else "Not enough"
    assert p_value in page


def test_experiment_page_says_what_the_policy_would_do_now(setup):
    app, inst = setup
    admin = Admin(app)
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    simulate_traffic(app, 12)
    page = admin.get("/admin/experiments/e1").get_data(as_text=True)
    assert "Policy now: wait" in page and "Power (Thumbs-up rate)" in page
    # a primary metric the table does not have never gets this far: the app refuses to start
    from webapp.core.settings import ConfigError

    with pytest.raises(ConfigError, match="RLHF_PRIMARY_METRIC='vibes'"):
        make_app(inst, RLHF_PRIMARY_METRIC="vibes")


def test_not_enough_data_state_and_srm_warning(setup):
    app, _ = setup
    admin = Admin(app)
    admin.post("/api/admin/experiments", {"key": "e1", "control_version_id": 1, "variant_version_id": 2})
    data = admin.get("/api/admin/metrics").get_json()
    assert all(not m["enough_data"] for m in data["metrics"])
    assert "Not enough data yet" in admin.get("/admin/experiments/e1").get_data(as_text=True)
    with app.app_context():  # a routing bug: 60 % of users in control under a 50/50 split
        exp = db.session.scalars(db.select(Experiment)).one()
        for i in range(1000):
            user = User(anon_id=f"srm-{i}")
            db.session.add(user)
            db.session.flush()
            db.session.add(Assignment(experiment_id=exp.id, user_id=user.id, arm="control" if i < 600 else "variant"))
        db.session.commit()
    srm = admin.get("/api/admin/metrics").get_json()["srm"]
    assert srm["mismatch"] is True and srm["p_value"] < 0.001 and srm["observed"] == {"control": 600, "variant": 400}
    assert "Sample ratio mismatch" in admin.get("/admin/experiments/e1").get_data(as_text=True)


# ---------------------------------------------------------------------------- dashboard contents

from datetime import datetime, timedelta  # noqa: E402

from tests.support.feedback_factory import add_exchange  # noqa: E402
from webapp.core.models import AnswerScore, Comparison, Conversation, Feedback, TrainingRun, utcnow  # noqa: E402

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
    assert '<time datetime="2026-11-23T14:05:07Z" title="2026-11-23T14:05:07Z" data-local>23 Nov 2026, 14:05 UTC</time>' in card
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
    assert '<time datetime="2026-01-02T03:04:05Z" title="2026-01-02T03:04:05Z" data-local>2 Jan 2026, 03:04 UTC</time>' in runs


def test_paths_are_relative_to_the_instance_folder(setup):
    app, inst = setup
    admin = Admin(app)
    reward = inst / "runs" / "run-1" / "reward_model"
    reward.mkdir(parents=True)
    (reward / "config.json").write_text("{}")
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

    assert "<code class=\"value\">8</code>" in row("training.policy.lora_r") and "config.toml" in row("training.policy.lora_r")
    assert "RLHF_TRAINING_POLICY_LORA_R" in row("training.policy.lora_r")
    assert "0.6" in row("temperature") and "environment" in row("temperature") and "default 0.8" in row("temperature")
    assert "create_app(config)" in row("base_model") and "&lt;img src=x onerror=alert(1)&gt;" in row("base_model")
    assert "<img src=x" not in html  # escaped, like all text
    assert "********" in row("secret_key") and (inst / "secret_key").read_text() not in html
    assert str(inst) not in html  # sources inside the instance are shown relative to it
    assert 'data-setting="training.gate.max_kl"' in html and 'method="post"' not in html.split("<main")[1]


def test_run_page_shows_the_settings_the_run_trained_with(setup):
    from dataclasses import replace

    from rlhf.settings import CycleSettings, PolicySettings

    app, _ = setup
    config = replace(CycleSettings(algorithm="dpo"), policy=PolicySettings(lora=True, lora_r=4)).to_dict()
    with app.app_context():
        run = TrainingRun(trigger="cli", algorithm="dpo", status="succeeded", config={**config, "limits": {"stall_seconds": 9}})
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
    html = admin.get(f"/admin/runs/{ids[1]}").get_data(as_text=True)
    verdict = html.split('data-testid="gate-verdict">')[1].split("</p>")[0]
    assert "<b>not enough evidence</b>" in verdict and "3 held-out preference pairs, the gate needs at least 8" in verdict
    assert "not trained (too few held-out pairs)" in html
    # rl-train --json carries the same evidence
    out = gate_summary(evaluation)
    assert out["heldout"]["pairs"] == 14 and out["judge"]["gain"] == 0.55 and out["verdict"] == "passed"
    assert out["evidence_p"] == 0.0008
    assert out["optimized_against"] == {"reward_gain": 0.912, "decides": False}
