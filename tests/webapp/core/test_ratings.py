"""The rating kinds (webapp.core.ratings): each is defined once, and that one definition checks and
stores it for the chat page and the /v1 API alike; the registry is what the schema, the training
records and the feedback events are read through."""
from __future__ import annotations

from dataclasses import fields

import pytest

from rlhf.data.records import FeedbackRecord
from tests.support.app import ApiClient, make_app, register_model
from webapp.core.models import Feedback
from webapp.core.ratings.registry import FEEDBACK_FIELDS, FEEDBACK_KINDS, event_kinds
from webapp.openai_api.keys import create_api_key
from webapp.training.records import feedback_events

# Each kind's values, accepted and refused ones: a kind added to the registry needs its own here.
SAMPLES: dict[str, list] = {
    "thumb": ["up", "down", None, "sideways", 1, "", ["up"]],
    "rating": [1, 5, None, 0, 6, "5", 4.5, True],
    "correction": ["  Rinse the rice first.  ", "", None, 5, "x" * 4001, "nul\x00", "\ud800"],
    "comment": ["Nice", None, "", "x" * 2000, "x" * 2001, ["Nice"]],
    "reasons": [["helpful", "helpful", "polite"], [], None, "rude", ["made-up"], [1], {"helpful": 1}],
}
FLAG_SAMPLES = [{"category": "hate", "note": "  a threat "}, {"category": "other", "note": ""}, {"category": "spam"},
                {"note": "no category"}, {"category": 3}, {"category": "other", "note": "x" * 501},
                {"category": "other", "note": 5}]


@pytest.fixture
def both(tmp_path, micro_model_dir):
    """An answer on the chat page and a /v1 completion, each its own rater's."""
    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=8, RATELIMIT_ENABLED=False)
    register_model(app, micro_model_dir)
    with app.app_context():
        _, key = create_api_key("sdk", None, False)
    page = ApiClient(app.test_client())
    conv = page.post("/api/conversations", json={}).get_json()["id"]
    answer = page.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?",
                                                                     "stream": False}).get_json()
    v1 = app.test_client()
    headers = {"Authorization": f"Bearer {key}"}
    completion = v1.post("/v1/chat/completions", headers=headers, json={
        "model": "rlhf-chat", "messages": [{"role": "user", "content": "How do I cook rice?"}]}).get_json()
    return page, answer["assistant_message"]["id"], v1, headers, completion["id"]


def test_every_kind_is_accepted_and_refused_alike_by_the_page_and_v1(both):
    page, answer, v1, headers, completion = both
    assert set(SAMPLES) == set(FEEDBACK_FIELDS), "give each kind in the registry its samples here"
    seen = set()
    for name, values in SAMPLES.items():
        for value in values:
            on_page = page.post(f"/api/messages/{answer}/feedback", json={name: value})
            on_v1 = v1.post("/v1/feedback", headers=headers, json={"completion_id": completion, name: value})
            assert on_page.status_code == on_v1.status_code, (name, value, on_page.get_json(), on_v1.get_json())
            if on_page.status_code == 200:
                stored = [{k: v for k, v in resp.get_json()["feedback"].items() if k != "updated_at"}
                          for resp in (on_page, on_v1)]
                assert stored[0] == stored[1], (name, value)
            else:
                assert on_page.get_json()["error"] == on_v1.get_json()["error"]["message"], (name, value)
            seen.add((name, on_page.status_code))
    # the samples reach both sides of each kind
    assert {(name, status) for name in SAMPLES for status in (200, 400)} == seen


def test_a_flag_is_accepted_and_refused_alike_by_the_page_and_v1(both):
    page, answer, v1, headers, completion = both
    for flag in FLAG_SAMPLES:
        on_page = page.post(f"/api/messages/{answer}/flag", json=flag)
        on_v1 = v1.post("/v1/feedback", headers=headers, json={"completion_id": completion, "flag": flag})
        assert on_page.status_code == on_v1.status_code, (flag, on_page.get_json(), on_v1.get_json())
        if on_page.status_code == 200:
            shown = [{k: v for k, v in resp.get_json()["flag"].items() if not k.endswith("_at")}
                     for resp in (on_page, on_v1)]
            assert shown[0] == shown[1], flag
        else:
            assert on_page.get_json()["error"] == on_v1.get_json()["error"]["message"], flag


def test_the_registry_names_the_schema_the_training_records_and_the_events():
    """A kind's name is the feedback row's column and, when training takes it, FeedbackRecord's field;
    the kinds that make an answer rated are feedback_events' breakdown."""
    columns = set(Feedback.__table__.c.keys())
    record_fields = {f.name for f in fields(FeedbackRecord)}
    for kind in FEEDBACK_KINDS:
        assert kind.name in columns, kind.name
        assert kind.record is None or kind.name in record_fields, kind.name
        assert kind.show(kind.empty) == kind.show(None)  # an absent row shows as a row never given the kind
    assert event_kinds() == {"thumbs": "thumb", "ratings": "rating", "corrections": "correction"}


def test_feedback_events_break_down_by_the_event_kinds(app):
    with app.app_context():
        counts = feedback_events()
    assert [k for k in counts if k in event_kinds()] == list(event_kinds())
