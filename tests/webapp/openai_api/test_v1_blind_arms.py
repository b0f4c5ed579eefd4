"""A/A through the /v1 API: while an experiment runs, each end user keeps one arm across requests and
across the keys of one front end (they are one user of this app), and no /v1 answer -- body or
header, whole or streamed, success or error -- names the arm, the experiment or a version."""
from __future__ import annotations

import json

from tests.webapp.experiments.test_blind_arms import KEY, LEAKS, VERSIONS
from webapp.core.extensions import db
from webapp.core.models import Assignment, Conversation, Experiment, Message, User
from webapp.experiments.assignment import arm_for, user_hash_key
from webapp.openai_api.keys import create_api_key

MODEL = "rlhf-chat"


def test_arms_are_sticky_per_end_user_across_keys_and_never_shown(experiment_app):
    app = experiment_app
    with app.app_context():
        keys = {name: create_api_key(name, client)[1] for name, client in
                (("front-1", "front"), ("front-2", "front"), ("elsewhere", "elsewhere"))}
    client = app.test_client()
    seen: list[tuple[str, int, str]] = []

    def call(method, path, key, body=None, headers=None):
        resp = client.open(path, method=method, json=body,
                           headers={"Authorization": f"Bearer {keys[key]}", **(headers or {})})
        head = "\n".join(f"{k}: {v}" for k, v in resp.headers.items())
        seen.append((f"{method} {path} ({key})", resp.status_code, head + "\n\n" + resp.get_data(as_text=True)))
        return resp

    people = [f"person-{i}" for i in range(16)]
    completions: dict[str, list[str]] = {p: [] for p in people}
    for person in people:
        asks = [("front-1", {"user": person}, {}), ("front-2", {"user": {"id": person, "name": person.title()}}, {}),
                ("front-1", {"safety_identifier": person}, {"X-OpenWebUI-Chat-Id": f"chat-{person}"}),
                ("front-2", {"user": person, "stream": True, "stream_options": {"include_usage": True}}, {})]
        for key, extra, headers in asks:
            resp = call("POST", "/v1/chat/completions", key,
                        {"model": MODEL, "messages": [{"role": "user", "content": "How do I cook rice?"}], **extra},
                        headers)
            assert resp.status_code == 200
            text = resp.get_data(as_text=True)
            completions[person].append(json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])["id"]
                                       if extra.get("stream") else resp.get_json()["id"])
        rated = call("POST", "/v1/feedback", "front-1", {"completion_id": completions[person][0], "thumb": "up",
                                                         "user": person})
        assert rated.status_code == 200 and rated.get_json()["feedback"]["thumb"] == "up"  # a body worth scanning
        other = call("POST", "/v1/chat/completions", "elsewhere", {"model": MODEL, "user": person,
                                                                   "messages": [{"role": "user", "content": "Hi"}]})
        assert other.status_code == 200
    call("GET", "/v1/models", "front-1")
    call("GET", f"/v1/models/{MODEL}", "front-2")
    call("GET", "/v1/models/gpt-4o", "front-2")
    call("POST", "/v1/chat/completions", "front-1", {"model": MODEL, "messages": []})
    call("POST", "/v1/feedback", "front-2", {"completion_id": completions[people[0]][0], "thumb": "down"})
    # every kind of answer was scanned: successes of each call, refusals, unknowns -- and no server error
    statuses = {(where.split(" (")[0], status) for where, status, _ in seen}
    assert {("POST /v1/feedback", 200), ("POST /v1/chat/completions", 200), ("GET /v1/models", 200),
            ("POST /v1/chat/completions", 400), ("GET /v1/models/gpt-4o", 404)} <= statuses
    assert ("POST /v1/feedback", 404) in statuses  # another key's user cannot rate person 0's answer
    assert all(status < 500 for _, status, _ in seen)

    with app.app_context():
        experiment = db.session.scalars(db.select(Experiment).filter_by(key=KEY)).one()
        arms_of_people = set()
        for person in people:
            answers = db.session.scalars(db.select(Message).where(Message.completion_id.in_(completions[person]))).all()
            owners = {db.session.get(Conversation, a.conversation_id).user_id for a in answers}
            assert len(answers) == 4 and len(owners) == 1, person  # one app user behind both keys
            user = db.session.get(User, owners.pop())
            arms = {a.arm for a in answers}
            assignment = db.session.scalars(db.select(Assignment).filter_by(experiment_id=experiment.id,
                                                                            user_id=user.id)).one()
            assert arms == {assignment.arm}, (person, arms)  # sticky, as assigned on first exposure
            assert assignment.arm == arm_for(KEY, user_hash_key(user), experiment.traffic_split)  # hash-consistent
            assert {a.model_version.name for a in answers} == {"v2-ppo" if assignment.arm == "variant" else "v1-base"}
            arms_of_people.add(assignment.arm)
        assert arms_of_people == {"control", "variant"}  # the experiment really routed these people
    leaks = [(where, m.group(0)) for where, _, text in seen for pattern in LEAKS if (m := pattern.search(text))]
    assert leaks == [], leaks[:10]
    # versions are not models: asking for one by name finds nothing
    for version in VERSIONS:
        assert client.get(f"/v1/models/{version}", headers={"Authorization": f"Bearer {keys['front-1']}"}
                          ).status_code == 404
