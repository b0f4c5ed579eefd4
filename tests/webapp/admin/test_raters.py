"""Raters (webapp/core/raters.py, webapp/admin/raters.py, webapp/training/records.py): storing a run's
assessments, what the training runner learns of each rater, who is excluded from verdicts, the
admin API (filters, sorting, paging, trust decisions with the audit log), export columns, and the
run page's "Rater trust" section."""
from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from tests.support.app import ApiClient
from tests.support.feedback_factory import add_exchange
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import AuditEvent, Comparison, Feedback, RaterAssessment, RaterTrust, TrainingRun, User, utcnow
from webapp.core.raters import excluded_raters, set_trust, store_assessments
from webapp.training.records import export_rows, feedback_events, rater_infos

PASSWORD = "correct horse"


def rated(user_id: int, n: int, version_id: int = 1, when=None, votes: int = 0) -> None:
    """``n`` rated answers (and ``votes`` compare votes) of ``user_id`` (in an app context)."""
    for i in range(n + votes):
        q, answers = add_exchange(user_id, f"How do I cook rice, take {i}?", ["Simmer it.", "Boil it."], version_id)
        if i < n:
            db.session.add(Feedback(user_id=user_id, message_id=answers[0].id, thumb="up", rating=4,
                                    **({"created_at": when, "updated_at": when} if when else {})))
        else:
            db.session.add(Comparison(user_id=user_id, prompt_message_id=q.id, message_a_id=answers[0].id,
                                      message_b_id=answers[1].id, winner="a", voted_at=when or utcnow()))


def user(name: str | None = None, hours_old: float = 0.0, **kw) -> int:
    u = User(anon_id=None if name else f"anon-{utcnow().timestamp()}-{kw.get('tag', '')}", username=name,
             created_at=utcnow() - timedelta(hours=hours_old), password_hash="x" if name else None,
             is_admin=kw.get("is_admin", False))
    db.session.add(u)
    db.session.flush()
    return u.id


ASSESSMENT = {"events": 12, "raw_share": 0.4, "share": 0.25, "agreement": 0.82, "checked": 9, "weight": 0.62,
              "status": "normal", "reasons": ["capped at 25% of the signal"]}


def test_store_assessments_rater_infos_and_excluded_raters(app):
    with app.app_context():
        old = utcnow() - timedelta(days=3)
        a, b, c = user("veteran", hours_old=500, tag="a"), user(hours_old=2, tag="b"), user(hours_old=1, tag="c")
        admin = user("boss", is_admin=True)
        rated(a, 3, when=old)
        rated(a, 2, votes=1)
        rated(b, 4)
        rated(admin, 1)
        run = TrainingRun(status="succeeded")
        db.session.add(run)
        db.session.commit()

        infos = rater_infos()
        assert set(infos) == {a, b, admin}  # every user with feedback events (c has none)
        assert infos[a]["prior_events"] == 3 and infos[b]["prior_events"] == 0
        assert infos[a]["signed_in"] is True and infos[b]["signed_in"] is False
        assert infos[a]["trust"] == infos[b]["trust"] == "auto"
        assert 499 < infos[a]["account_age_hours"] < 501 and 1.9 < infos[b]["account_age_hours"] < 2.1
        # the per-user counts follow the one definition of a feedback event
        assert sum(i["prior_events"] for i in infos.values()) == 3
        assert feedback_events()["total"] == 3 + 2 + 1 + 4 + 1

        stored = store_assessments(run.id, {a: ASSESSMENT, str(b): {**ASSESSMENT, "status": "quarantined",
                                                                    "weight": 0.0, "agreement": None},
                                            "999999": ASSESSMENT, "not-a-user": ASSESSMENT})
        assert stored == 2  # unknown raters are skipped
        row = db.session.get(RaterAssessment, a)
        assert (row.training_run_id, row.events, row.share, row.agreement, row.checked, row.weight, row.status,
                row.reasons) == (run.id, 12, 0.25, 0.82, 9, 0.62, "normal", ["capped at 25% of the signal"])
        assert excluded_raters() == {admin, b}  # admins, and b quarantined by the assessment

        set_trust(b, "trusted", "known tester", admin)  # an admin's "trusted" beats the assessment
        set_trust(c, "quarantined", "script", admin)  # an admin's quarantine needs no assessment
        db.session.commit()
        assert excluded_raters() == {admin, c}
        assert rater_infos()[b]["trust"] == "trusted"

        # the next run replaces the assessment (upsert), keyed by int or str alike
        run2 = TrainingRun(status="succeeded")
        db.session.add(run2)
        db.session.commit()
        store_assessments(run2.id, {str(a): {**ASSESSMENT, "status": "quarantined", "checked": True}})
        row = db.session.get(RaterAssessment, a)
        db.session.refresh(row)
        assert (row.training_run_id, row.status, row.checked) == (run2.id, "quarantined", 1)
        assert db.session.scalar(db.select(db.func.count()).select_from(RaterAssessment)) == 2
        assert excluded_raters() == {admin, c, a}


@pytest.fixture
def admin(app):
    with app.app_context():
        set_admin_password("root", PASSWORD)
    client = app.test_client()
    page = client.get("/admin/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert client.post("/admin/login", data={"username": "root", "password": PASSWORD,
                                             "csrf_token": token}).status_code == 302
    client.csrf = client.get("/api/session").get_json()["csrf_token"]
    return client


def seed_raters(app) -> dict[str, int]:
    with app.app_context():
        ids = {"heavy": user("heavy_rater", hours_old=300), "new": user(hours_old=0.5, tag="new"),
               "quiet": user("quiet_one", hours_old=100), "odd": user("<img src=x onerror=alert(1)>", hours_old=5)}
        rated(ids["heavy"], 6, votes=2)
        rated(ids["new"], 3)
        rated(ids["quiet"], 1)
        rated(ids["odd"], 2)
        run = TrainingRun(status="succeeded")
        db.session.add(run)
        db.session.commit()
        store_assessments(run.id, {
            ids["heavy"]: {**ASSESSMENT, "events": 8, "share": 0.25, "raw_share": 0.5, "weight": 0.5,
                           "status": "normal", "agreement": 0.9},
            ids["new"]: {**ASSESSMENT, "events": 3, "share": 0.2, "raw_share": 0.2, "weight": 0.3, "status": "new",
                         "agreement": None, "reasons": ["account younger than a day"]},
            ids["odd"]: {**ASSESSMENT, "events": 2, "share": 0.1, "raw_share": 0.1, "weight": 0.0,
                         "status": "quarantined", "agreement": 0.1, "reasons": ["disagrees with everyone"]}})
        ids["run"] = run.id
        return ids


def test_raters_api_filters_sorts_and_pages(app, admin):
    ids = seed_raters(app)
    data = admin.get("/api/admin/raters").get_json()
    assert [r["user_id"] for r in data["items"]] == [ids["heavy"], ids["new"], ids["odd"], ids["quiet"]]
    assert [r["events"] for r in data["items"]] == [8, 3, 2, 1]  # all time, by the feedback-event definition
    assert data["total"] == 4 and data["pages"] == 1 and data["latest_run_id"] == ids["run"]
    heavy = data["items"][0]
    assert heavy["name"] == "heavy_rater" and heavy["signed_in"] is True and heavy["trust"] == "auto"
    assert heavy["assessment"]["share"] == 0.25 and heavy["assessment"]["status"] == "normal"
    assert data["items"][1]["name"] == f"anonymous #{ids['new']}" and data["items"][1]["signed_in"] is False
    assert data["items"][3]["assessment"] is None  # never assessed
    assert data["items"][2]["excluded"] is True and heavy["excluded"] is False

    def users(query: str) -> list[int]:
        resp = admin.get(f"/api/admin/raters?{query}")
        assert resp.status_code == 200, (query, resp.get_json())
        return [r["user_id"] for r in resp.get_json()["items"]]

    assert users("status=quarantined") == [ids["odd"]]
    assert users("status=unassessed") == [ids["quiet"]]
    assert users("min_events=3") == [ids["heavy"], ids["new"]]
    assert users("q=quiet") == [ids["quiet"]]
    assert users(f"q=%23{ids['new']}") == [ids["new"]]
    assert users("sort=share&order=asc") == [ids["odd"], ids["new"], ids["heavy"], ids["quiet"]]  # unassessed last
    assert users("sort=weight") == [ids["heavy"], ids["new"], ids["odd"], ids["quiet"]]
    assert users("sort=agreement&order=desc") == [ids["heavy"], ids["odd"], ids["new"], ids["quiet"]]
    assert users("sort=age") == [ids["new"], ids["odd"], ids["quiet"], ids["heavy"]]  # youngest first
    assert users("trust=quarantined") == []
    assert users("page=2") == []
    for query, message in (("status=bogus", "status must be one of"), ("sort=name", "sort must be one of"),
                           ("order=up", "order must be asc or desc"), ("min_events=-1", "min_events must be"),
                           ("min_events=%C2%B2", "min_events must be"), ("page=0", "page must be"),
                           ("trust=maybe", "trust must be one of"), ("colour=red", "Unknown filter(s): colour")):
        resp = admin.get(f"/api/admin/raters?{query}")
        assert resp.status_code == 400 and message in resp.get_json()["error"], (query, resp.get_json())


def test_trust_decisions_are_validated_and_audited(app, admin):
    ids = seed_raters(app)
    url = f"/api/admin/raters/{ids['heavy']}/trust"
    headers = {"X-CSRFToken": admin.csrf}
    resp = admin.post(url, json={"trust": "quarantined", "note": "  same answers, 40 a minute  "}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    rater = resp.get_json()["rater"]
    assert (rater["trust"], rater["trust_note"], rater["trust_set_by"], rater["excluded"]) == \
        ("quarantined", "same answers, 40 a minute", "root", True)
    assert rater["events"] == 8
    with app.app_context():
        event = db.session.scalars(db.select(AuditEvent).where(AuditEvent.action == "rater_trust")).one()
        assert (event.actor, event.subject) == ("root", "heavy_rater")
        assert event.detail == {"user_id": ids["heavy"], "old": "auto", "new": "quarantined",
                                "note": "same answers, 40 a minute"}
        assert ids["heavy"] in excluded_raters()
    assert admin.post(url, json={"trust": "auto"}, headers=headers).get_json()["rater"]["trust"] == "auto"
    with app.app_context():
        last = db.session.scalars(db.select(AuditEvent).order_by(AuditEvent.id.desc())).first()
        assert (last.detail["old"], last.detail["new"], last.detail["note"]) == ("quarantined", "auto", None)
        assert db.session.get(RaterTrust, ids["heavy"]).trust == "auto"
        admin_id = db.session.scalar(db.select(User.id).where(User.username == "root"))

    for body, status, message in (({"trust": "banned"}, 400, "'trust' must be one of: auto, trusted, quarantined"),
                                  ({}, 400, "'trust' must be one of"),
                                  ({"trust": "trusted", "note": "x" * 501}, 400, "'note' is too long"),
                                  ({"trust": "trusted", "why": "x"}, 400, "Unknown field(s): why")):
        resp = admin.post(url, json=body, headers=headers)
        assert resp.status_code == status and message in resp.get_json()["error"], (body, resp.get_json())
    resp = admin.post("/api/admin/raters/999999/trust", json={"trust": "trusted"}, headers=headers)
    assert resp.status_code == 404 and resp.get_json()["error"] == "User not found."
    resp = admin.post(f"/api/admin/raters/{admin_id}/trust", json={"trust": "trusted"}, headers=headers)
    assert resp.status_code == 400 and "Admins are always counted out" in resp.get_json()["error"]
    assert admin.post(url, json={"trust": "trusted"}).status_code == 400  # no CSRF token
    with app.app_context():
        assert db.session.scalar(db.select(db.func.count()).select_from(AuditEvent)
                                 .where(AuditEvent.action == "rater_trust")) == 2


def test_raters_page_escapes_and_has_an_empty_state(app, admin):
    page = admin.get("/admin/raters").get_data(as_text=True)
    assert "No training run has assessed the raters yet" in page and "No raters yet" in page
    ids = seed_raters(app)
    page = admin.get("/admin/raters").get_data(as_text=True)
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=x" not in page
    assert f'data-rater="{ids["odd"]}"' in page and "disagrees with everyone" in page
    assert "training run #" in page and "No training run has assessed" not in page
    assert admin.get("/admin/raters?status=bogus").status_code == 400


def test_export_has_rater_columns(app, admin):
    ids = seed_raters(app)
    with app.app_context():
        set_trust(ids["new"], "trusted", None, None)
        db.session.commit()
        raw = {r["user_id"]: r for r in export_rows("raw")}
        assert (raw[ids["odd"]]["rater_trust"], raw[ids["odd"]]["rater_status"], raw[ids["odd"]]["rater_weight"]) \
            == ("auto", "quarantined", 0.0)
        assert (raw[ids["new"]]["rater_trust"], raw[ids["new"]]["rater_status"]) == ("trusted", "new")
        assert (raw[ids["quiet"]]["rater_trust"], raw[ids["quiet"]]["rater_status"],
                raw[ids["quiet"]]["rater_weight"]) == ("auto", None, None)
        for fmt in ("pairs", "kto", "sft"):
            rows = export_rows(fmt)
            assert rows, fmt
            for row in rows:
                assert {"rater_trust", "rater_status", "rater_weight"} <= set(row), fmt
                raters = row.get("raters")  # rlhf's preference data names each row's raters
                if raters is not None and len(raters) == 1:
                    assert row["rater_trust"] in ("auto", "trusted"), row
    body = admin.get("/api/admin/export?format=raw").get_data(as_text=True)
    first = json.loads(body.splitlines()[0])
    assert {"rater_trust", "rater_status", "rater_weight"} <= set(first)


def test_rows_with_raters_get_their_values(app, monkeypatch):
    """Rows that name their raters (rlhf/data/datasets.py) get one value each, or a list for a
    pair built from two raters' conversations."""
    import webapp.training.records as records

    ids = seed_raters(app)

    class Bundle:
        pairs = {"train": [{"prompt": [], "chosen": [], "rejected": [], "raters": (ids["odd"],)},
                           {"prompt": [], "chosen": [], "rejected": [], "raters": (ids["heavy"], ids["quiet"])},
                           {"prompt": [], "chosen": [], "rejected": [], "raters": ()}], "eval": []}

    monkeypatch.setattr(records, "build_datasets", lambda records_: Bundle)
    with app.app_context():
        one, two, none = export_rows("pairs")
    assert (one["rater_trust"], one["rater_status"], one["rater_weight"]) == ("auto", "quarantined", 0.0)
    assert (two["rater_trust"], two["rater_status"], two["rater_weight"]) == (["auto", "auto"], ["normal", None],
                                                                               [0.5, None])
    assert (none["rater_trust"], none["rater_status"], none["rater_weight"]) == (None, None, None)


TRUST_SUMMARY = {"rules": {"capped": {"raters": 2, "rows": 31, "weight_removed": 12.5},
                           "quarantined": {"raters": 1, "rows": 7, "weight_removed": 7.0},
                           "new": {"raters": 3, "rows": 5, "weight_removed": 2.25},
                           "down_weighted": {"raters": 0, "rows": 0, "weight_removed": 0.0}},
                 "applied": {"quarantined": True, "capped": True, "down_weighted": False, "new": True},
                 "notes": ["agreement not checked: too few shared questions", "<b>not bold</b>"]}


def test_run_page_shows_the_rater_trust_section(app, admin):
    with app.app_context():
        with_trust = TrainingRun(status="succeeded", feedback_counts={"pairs": 40, "trust": TRUST_SUMMARY})
        without = TrainingRun(status="succeeded", feedback_counts={"pairs": 40})
        odd = TrainingRun(status="succeeded", feedback_counts={"trust": {"rules": "?", "applied": {"x": 1},
                                                                         "notes": "one note"}})
        db.session.add_all([with_trust, without, odd])
        db.session.commit()
        ids = (with_trust.id, without.id, odd.id)
    page = admin.get(f"/admin/runs/{ids[0]}").get_data(as_text=True)
    assert "Rater trust" in page
    rows = re.findall(r'<tr data-rule="(\w+)"><th scope="row">([^<]+)</th><td>(\w+)</td>\s*<td>([^<]+)</td>'
                      r'<td>([^<]+)</td>\s*<td>([^<]+)</td>', page)
    assert [r[0] for r in rows] == ["quarantined", "capped", "down_weighted", "new"]  # the rules' own order
    assert rows[0][1:] == ("Quarantined raters (left out)", "yes", "1", "7", "7.00")
    assert rows[1][2:] == ("yes", "2", "31", "12.50")
    assert rows[2][2] == "no"
    assert "agreement not checked: too few shared questions" in page and "&lt;b&gt;not bold&lt;/b&gt;" in page
    assert "Rater trust" not in admin.get(f"/admin/runs/{ids[1]}").get_data(as_text=True)
    odd_page = admin.get(f"/admin/runs/{ids[2]}")  # a malformed summary is shown as far as it goes, never a 500
    assert odd_page.status_code == 200 and "one note" in odd_page.get_data(as_text=True)
    api = admin.get(f"/api/admin/runs/{ids[0]}").get_json()
    assert api["feedback_counts"]["trust"] == TRUST_SUMMARY


def test_a_new_identity_records_where_it_came_from(app):
    from webapp.core.models import IdentityOrigin

    visitor = ApiClient(app.test_client())
    with app.app_context():
        origin = db.session.get(IdentityOrigin, visitor.user_id)
        assert origin is not None and len(origin.address_hash) == 64 and "127.0.0.1" not in origin.address_hash
