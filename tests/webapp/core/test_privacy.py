"""Privacy: a deleted conversation leaves training data and every export; exports (and the
training data) have e-mail addresses and phone numbers redacted unless asked not to."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from flask.cli import FlaskGroup

from tests.support.app import ApiClient
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Comparison, Conversation, Message, ModelVersion

FORMATS = ("pairs", "kto", "sft", "raw")
EMAIL, PHONE_UK, PHONE_US = "jane.doe+work@mail.example.co.uk", "+44 20 7946 0958", "(555) 123-4567"
ADMIN_PASSWORD = "correct horse"


def add_conversation(app, user_id: int, marker: str, pii: bool = False) -> dict:
    """A conversation of ``user_id``: a question with two answers (siblings) and a compare
    pair between them, every text tagged with ``marker``. Written directly (no generation)."""
    contact = f" Reach me at {EMAIL} or {PHONE_UK}." if pii else ""
    with app.app_context():
        version = db.session.scalars(db.select(ModelVersion)).first()
        conv = Conversation(user_id=user_id, title=f"{marker} title")
        db.session.add(conv)
        db.session.flush()
        q = Message(conversation_id=conv.id, role="user", content=f"How do I cook rice? {marker}{contact}")
        db.session.add(q)
        db.session.flush()
        answers = [Message(conversation_id=conv.id, role="assistant", parent_id=q.id, model_version_id=version.id,
                           content=f"Answer {k} {marker}." + (f" Call {PHONE_US} or mail {EMAIL}." if pii else ""))
                   for k in range(2)]
        db.session.add_all(answers)
        db.session.flush()
        pair = Comparison(user_id=user_id, prompt_message_id=q.id, message_a_id=answers[0].id,
                          message_b_id=answers[1].id)
        db.session.add(pair)
        db.session.commit()
        return {"id": conv.id, "question": q.id, "answers": [a.id for a in answers], "pair": pair.id}


def rate(api: ApiClient, conv: dict, marker: str, pii: bool = False) -> None:
    """Through the API: thumbs and stars on both answers (a sibling pair), a correction and a
    comment on the worse one, and a compare vote."""
    contact = f" My e-mail is {EMAIL}, phone {PHONE_US}." if pii else ""
    good, bad = conv["answers"]
    assert api.post(f"/api/messages/{good}/feedback", json={"thumb": "up", "rating": 5}).status_code == 200
    resp = api.post(f"/api/messages/{bad}/feedback", json={
        "thumb": "down", "rating": 1, "correction": f"Rinse the rice, then simmer it. {marker}{contact}",
        "comment": f"Too vague {marker}.{contact}"})
    assert resp.status_code == 200, resp.get_json()
    assert api.post(f"/api/pairs/{conv['pair']}/vote", json={"winner": "a"}).status_code == 200


def admin_client(app):
    with app.app_context():
        set_admin_password("root", ADMIN_PASSWORD)
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    resp = client.post("/admin/login", data={"username": "root", "password": ADMIN_PASSWORD, "csrf_token": token})
    assert resp.status_code == 302
    return client


def cli_export(app, fmt: str, *extra: str) -> str:
    result = CliRunner().invoke(FlaskGroup(create_app=lambda: app),
                                ["export-feedback", "--format", fmt, "--output", "-", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def every_export(app, admin, **flags) -> dict[str, str]:
    """Each format through each way out: export_rows, the CLI and the admin API (JSONL text)."""
    from webapp.training.records import export_rows

    redact = flags.get("redact", True)
    out = {}
    for fmt in FORMATS:
        with app.app_context():
            out[f"export_rows:{fmt}"] = "\n".join(json.dumps(r, ensure_ascii=False) for r in export_rows(fmt, redact))
        out[f"cli:{fmt}"] = cli_export(app, fmt, *([] if redact else ["--no-redact"]))
        resp = admin.get(f"/api/admin/export?format={fmt}" + ("" if redact else "&redact=0"))
        assert resp.status_code == 200, resp.get_data(as_text=True)
        out[f"admin:{fmt}"] = resp.get_data(as_text=True)
    return out


def training_view(app) -> str:
    """Everything the training code gets: the plain records and the datasets built from them
    (pairs, KTO, SFT and the PPO prompts)."""
    from dataclasses import asdict

    from rlhf.data.datasets import build_datasets
    from webapp.training.records import feedback_records

    with app.app_context():
        records = feedback_records()
    bundle = build_datasets(records)
    return json.dumps({"records": [asdict(r) for r in records], "pairs": bundle.pairs, "kto": bundle.kto,
                       "sft": bundle.sft, "prompts": bundle.prompts}, ensure_ascii=False, default=str)


def records_seen_by_a_training_run(app, monkeypatch) -> list:
    """The records ``run_training`` really hands to the ML code (stopped right there)."""
    import webapp.training.runner as runner
    from rlhf.cycle import NotEnoughData
    from webapp.training.runs import RunRefused

    seen = []

    def capture(records, settings, raters=None):
        seen.extend(records)
        raise NotEnoughData("captured")

    monkeypatch.setattr(runner, "prepare_cycle", capture)
    with app.app_context(), pytest.raises(RunRefused, match="captured"):
        runner.run_training(min_feedback=0)
    return seen


# ---------------------------------------------------------------------------- deletion

def test_deleted_conversation_leaves_training_data_and_every_export(app, api, monkeypatch):
    from webapp.training.records import feedback_event_count

    keep = add_conversation(app, api.user_id, "KEEPMARK")
    gone = add_conversation(app, api.user_id, "GONEMARK")
    rate(api, keep, "KEEPMARK")
    rate(api, gone, "GONEMARK")
    admin = admin_client(app)
    gone_messages = {gone["question"], *gone["answers"]}

    before = every_export(app, admin)
    assert all("KEEPMARK" in text and "GONEMARK" in text for text in before.values()), \
        [k for k, t in before.items() if "GONEMARK" not in t]  # both are exported while they exist
    assert "GONEMARK" in training_view(app)
    with app.app_context():
        events_before = feedback_event_count()

    assert api.delete(f"/api/conversations/{gone['id']}").get_json() == {"id": gone["id"], "deleted": True}

    after = every_export(app, admin)
    after.update({f"{k}:no-redact": v for k, v in every_export(app, admin, redact=False).items()})
    for where, text in after.items():
        assert "KEEPMARK" in text, where
        assert "GONEMARK" not in text, where
    for fmt in ("export_rows:raw", "cli:raw", "admin:raw"):
        rows = [json.loads(line) for line in after[fmt].splitlines() if line]
        assert [r["id"] for r in rows] == [keep["id"]]
        assert not gone_messages & {m["id"] for r in rows for m in r["messages"]}
        assert not {c["id"] for r in rows for c in r["comparisons"]} & {gone["pair"]}
    view = training_view(app)
    assert "KEEPMARK" in view and "GONEMARK" not in view
    with app.app_context():
        assert feedback_event_count() == events_before - 3  # two rated answers (one corrected) and a vote
    seen = records_seen_by_a_training_run(app, monkeypatch)
    assert [r.id for r in seen] == [keep["id"]]
    # the owner no longer sees it, and nothing can be added to it
    assert api.get(f"/api/conversations/{gone['id']}").status_code == 404
    assert api.post(f"/api/messages/{gone['answers'][0]}/feedback", json={"thumb": "up"}).status_code == 404
    assert api.post(f"/api/pairs/{gone['pair']}/vote", json={"winner": "b"}).status_code == 404


# ---------------------------------------------------------------------------- redaction

PII = (EMAIL, PHONE_UK, PHONE_US)


def test_exports_redact_emails_and_phone_numbers_unless_asked_not_to(app, api):
    conv = add_conversation(app, api.user_id, "PIIMARK", pii=True)
    rate(api, conv, "PIIMARK", pii=True)
    admin = admin_client(app)

    redacted = every_export(app, admin)
    for where, text in redacted.items():
        assert "PIIMARK" in text, where
        assert not [p for p in PII if p in text], where
        assert "@mail.example" not in text and "7946" not in text and "123-4567" not in text, where
        assert "[EMAIL]" in text and "[PHONE]" in text, where
    # every kind of text is covered: question, answers, correction and comment (raw has them all)
    [raw] = [json.loads(line) for line in redacted["cli:raw"].splitlines()]
    question, *answers = raw["messages"]
    assert question["content"] == "How do I cook rice? PIIMARK Reach me at [EMAIL] or [PHONE]."
    assert {a["content"] for a in answers} == {f"Answer {k} PIIMARK. Call [PHONE] or mail [EMAIL]." for k in (0, 1)}
    fb = answers[1]["feedback"]
    assert fb["correction"] == "Rinse the rice, then simmer it. PIIMARK My e-mail is [EMAIL], phone [PHONE]."
    assert fb["comment"] == "Too vague PIIMARK. My e-mail is [EMAIL], phone [PHONE]."

    plain = every_export(app, admin, redact=False)
    for where, text in plain.items():
        assert all(p in text for p in PII), where
        assert "[EMAIL]" not in text and "[PHONE]" not in text, where
    # the stored data itself is untouched: the owner still sees what they wrote
    stored = api.get(f"/api/conversations/{conv['id']}").get_json()
    assert EMAIL in stored["messages"][0]["content"]
    assert admin.get("/api/admin/export?format=raw&redact=maybe").status_code == 400


def test_training_data_is_redacted(app, api, monkeypatch):
    conv = add_conversation(app, api.user_id, "PIIMARK", pii=True)
    rate(api, conv, "PIIMARK", pii=True)
    view = training_view(app)
    assert "PIIMARK" in view and "[EMAIL]" in view and "[PHONE]" in view
    assert not [p for p in PII if p in view]
    seen = json.dumps([repr(r) for r in records_seen_by_a_training_run(app, monkeypatch)])
    assert "PIIMARK" in seen and not [p for p in PII if p in seen]
