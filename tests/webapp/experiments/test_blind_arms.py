"""Blind arms: while an experiment runs, no response an end user gets says which A/B arm or model
version answered them (as in Chatbot Arena, where the models' identities stay hidden until the
vote is in). A realistic session is walked through every user-facing route and each raw body --
JSON, server-sent events, the page's HTML -- is searched for the experiment's key, the version
names, the arm names as values and the identity keys. Admins still see them."""
from __future__ import annotations

import re
import shutil

from tests.support.app import ApiClient, sse_events
from webapp.core.extensions import db
from webapp.core.models import Assignment, Message, ModelVersion

KEY = "blind-exp-7f3q"  # the experiment's key: a string no answer or page would contain by chance
VERSIONS = ("v1-base", "v2-ppo")
IDENTITY_KEYS = ("arm", "model_version", "model_version_id", "experiment_id", "experiment")
# "key": as a JSON key;  "control" / "variant" as a JSON string value
LEAKS = [re.compile(re.escape(KEY)), *(re.compile(re.escape(v)) for v in VERSIONS),
         *(re.compile(rf'"{k}"\s*:') for k in IDENTITY_KEYS), re.compile(r'"(?:control|variant)"')]
PASSWORD = "correct horse"
NO_LIMIT = "1000000 per minute"


class Admin:
    """A logged-in admin's test client; sends the CSRF token on writes."""

    def __init__(self, app):
        self.client = app.test_client()
        page = self.client.get("/admin/login").get_data(as_text=True)
        token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
        resp = self.client.post("/admin/login", data={"username": "root", "password": PASSWORD, "csrf_token": token})
        assert resp.status_code == 302
        self.csrf = self.client.get("/api/session").get_json()["csrf_token"]

    def get(self, url):
        return self.client.get(url)

    def post(self, url, body=None, method="post"):
        return getattr(self.client, method)(url, json=body, headers={"X-CSRFToken": self.csrf})


class Recorder(ApiClient):
    """An end user's client that keeps every response (method, url, status, raw body)."""

    def __init__(self, client):  # noqa: D107 -- ApiClient's, with the first /api/session kept too
        self.client = client
        self.seen: list[tuple[str, str, int, str]] = []
        data = self.get("/api/session").get_json()
        self.user_id, self.csrf = data["user_id"], data["csrf_token"]

    def _keep(self, method, url, resp):
        self.seen.append((method, url, resp.status_code, resp.get_data(as_text=True)))
        return resp

    def get(self, url, **kw):
        return self._keep("GET", url, super().get(url, **kw))

    def _send(self, method, url, json=None, **kw):
        return self._keep(method.upper(), url, super()._send(method, url, json, **kw))

    def patch(self, url, json=None, **kw):
        return self._send("patch", url, json, **kw)


def user_session(user: Recorder) -> None:
    """What a user does in a day of chatting: every user-facing route, streamed and not, plus
    some bad input."""
    user.get("/")  # the chat page
    session = user.get("/api/session").get_json()
    assert session["compare_rate"] > 0  # compare is offered while an experiment runs
    user.get("/api/health")
    conv = user.post("/api/conversations", json={}).get_json()["id"]

    streamed = sse_events(user.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?"}))
    assert streamed[-1][0] == "done"
    done = streamed[-1][1]
    plain = user.post(f"/api/conversations/{conv}/messages",
                      json={"content": "And beans?", "stream": False, "parent_id": done["message_id"]})
    assert plain.status_code == 201
    answer = plain.get_json()["assistant_message"]
    question = plain.get_json()["user_message"]

    assert user.post(f"/api/messages/{answer['id']}/regenerate", json={"stream": False}).status_code == 201
    assert sse_events(user.post(f"/api/messages/{question['id']}/regenerate", json={}))[-1][0] == "done"
    assert user.post(f"/api/messages/{question['id']}/edit",
                     json={"content": "And lentils?", "stream": False}).status_code == 201
    assert sse_events(user.post(f"/api/messages/{question['id']}/edit",
                                json={"content": "And peas?"}))[-1][0] == "done"
    assert user.post(f"/api/messages/{answer['id']}/feedback",
                     json={"thumb": "up", "rating": 4, "reasons": ["helpful"], "comment": "ok"}).status_code == 200

    pair = user.post(f"/api/conversations/{conv}/compare", json={"content": "Any tips to start running?"})
    assert pair.status_code == 201
    pair = pair.get_json()
    user.get(f"/api/conversations/{conv}")  # the compare before the vote
    assert user.post(f"/api/pairs/{pair['pair_id']}/vote", json={"winner": "a"}).status_code == 200
    assert user.post(f"/api/pairs/{pair['pair_id']}/vote", json={"winner": "both_bad"}).status_code == 200
    again = user.post(f"/api/conversations/{conv}/compare", json={"message_id": pair["user_message"]["id"]})
    assert again.status_code == 201
    assert user.post(f"/api/pairs/{again.get_json()['pair_id']}/vote", json={"winner": "tie"}).status_code == 200
    assert user.post(f"/api/messages/{pair['b']['id']}/feedback", json={"thumb": "down"}).status_code == 200

    user.get(f"/api/conversations/{conv}")  # after the votes
    user.get("/api/conversations")
    user.patch(f"/api/conversations/{conv}", json={"title": "Beans"})
    user.get("/")
    # bad input and missing things: readable errors, no identity either
    assert user.post(f"/api/conversations/{conv}/messages", json={"content": ""}).status_code == 400
    assert user.post(f"/api/pairs/{pair['pair_id']}/vote", json={"winner": "c"}).status_code == 400
    assert user.get("/api/conversations/999999").status_code == 404
    assert user.post("/api/messages/999999/regenerate", json={}).status_code == 404
    other = user.post("/api/conversations", json={}).get_json()["id"]
    assert user.delete(f"/api/conversations/{other}").status_code == 200


def leaks(seen) -> list[tuple[str, str, str]]:
    return [(method, url, m.group(0)) for method, url, _, body in seen for pattern in LEAKS
            if (m := pattern.search(body))]


def test_no_user_response_names_the_arm_experiment_or_version(experiment_app):
    users = [Recorder(experiment_app.test_client()) for _ in range(6)]
    for user in users:
        user_session(user)
    with experiment_app.app_context():
        # the experiment really routed these users: both arms answered, and compares put one of each side by side
        assigned = set(db.session.scalars(db.select(Assignment.arm)))
        answered = set(db.session.scalars(db.select(Message.arm).where(Message.role == "assistant")))
        versions = {m.model_version.name for m in db.session.scalars(db.select(Message).filter_by(role="assistant"))}
    assert assigned == {"control", "variant"} and answered == {"control", "variant"} and versions == set(VERSIONS)

    seen = [r for user in users for r in user.seen]
    assert len(seen) > 6 * 25 and {status for *_, status, _ in seen} >= {200, 201, 400, 404}
    assert all(status < 500 for *_, status, _ in seen)
    assert leaks(seen) == [], leaks(seen)[:10]
    # the searches themselves work: the same patterns find what an admin is shown
    admin = Admin(experiment_app)
    assert leaks([("GET", "/api/session", 200, admin.get("/api/session").get_data(as_text=True))])


def test_an_admin_sees_arms_and_versions_but_not_before_a_vote(experiment_app):
    admin = Admin(experiment_app)
    session = admin.get("/api/session").get_json()
    assert session["is_admin"] is True and session["experiment"] == KEY
    arm = session["arm"]
    mine = "v2-ppo" if arm == "variant" else "v1-base"
    assert session["model_version"] == mine
    assert admin.get("/api/health").get_json() == {"status": "ok", "model_version": "v1-base"}

    conv = admin.post("/api/conversations", {}).get_json()["id"]
    done = sse_events(admin.post(f"/api/conversations/{conv}/messages", {"content": "How do I cook rice?"}))[-1][1]
    assert (done["model_version"], done["arm"]) == (mine, arm)
    plain = admin.post(f"/api/conversations/{conv}/messages", {"content": "More?", "stream": False}).get_json()
    assert (plain["assistant_message"]["model_version"], plain["assistant_message"]["arm"]) == (mine, arm)

    # compare: anonymous until the vote, to an admin too
    pair = admin.post(f"/api/conversations/{conv}/compare", {"content": "Any tips to start running?"}).get_json()
    for side in ("a", "b"):
        assert not set(IDENTITY_KEYS) & set(pair[side])
    pending = {m["id"]: m for m in admin.get(f"/api/conversations/{conv}").get_json()["messages"]}
    assert not set(IDENTITY_KEYS) & (set(pending[pair["a"]["id"]]) | set(pending[pair["b"]["id"]]))
    assert pending[done["message_id"]]["arm"] == arm  # other answers show theirs
    vote = admin.post(f"/api/pairs/{pair['pair_id']}/vote", {"winner": "a"}).get_json()
    assert {vote["answerers"]["a"]["arm"], vote["answerers"]["b"]["arm"]} == {"control", "variant"}
    assert {vote["answerers"]["a"]["model_version"], vote["answerers"]["b"]["model_version"]} == set(VERSIONS)
    after = {m["id"]: m for m in admin.get(f"/api/conversations/{conv}").get_json()["messages"]}
    assert after[pair["a"]["id"]]["arm"] == vote["answerers"]["a"]["arm"]
    assert after[pair["b"]["id"]]["model_version"] == vote["answerers"]["b"]["model_version"]

    # the admin views keep them: metrics, feedback browser, export
    user = ApiClient(experiment_app.test_client())
    c = user.post("/api/conversations", json={}).get_json()["id"]
    answer = user.post(f"/api/conversations/{c}/messages", json={"content": "Hi", "stream": False}).get_json()
    user.post(f"/api/messages/{answer['assistant_message']['id']}/feedback", json={"thumb": "up"})
    with experiment_app.app_context():
        truth = db.session.get(Message, answer["assistant_message"]["id"])
        truth = (truth.model_version.name, truth.arm)
    rows = admin.get("/api/admin/feedback").get_json()
    row = next(r for r in rows["items"] if r["message_id"] == answer["assistant_message"]["id"])
    assert (row["model_version"], row["arm"]) == truth
    assert admin.get(f"/api/admin/metrics?experiment={KEY}").get_json()["experiment"]["key"] == KEY
    export = admin.get("/api/admin/export?format=raw").get_data(as_text=True)
    assert truth[0] in export


def test_health_when_degraded_tells_users_the_status_only(experiment_app):
    with experiment_app.app_context():
        path = db.session.get(ModelVersion, 1).path
    shutil.rmtree(path)  # the active version (the control arm) cannot be loaded
    user = ApiClient(experiment_app.test_client())
    conv = user.post("/api/conversations", json={}).get_json()["id"]
    resp = user.post(f"/api/conversations/{conv}/messages", json={"content": "Hi", "stream": False})
    assert resp.status_code in (201, 503)
    body = resp.get_data(as_text=True)
    assert not any(p.search(body) for p in LEAKS), body
    assert user.get("/api/health").get_json() == {"status": "degraded"}
    health = Admin(experiment_app).get("/api/health").get_json()
    assert health["status"] == "degraded" and health["model_version"] == "v1-base"
