"""The simulated /v1 client (rlhf.sim.users.ApiUser, closed_loop.py --via openai) against the real
/v1 API on the production server (tests/support/live_server.py, the micro model): it finds the
model the API lists, asks as its own end user, and every rating, chip and flag it sends is taken
(the client raises on any refusal) and stored as that user's feedback on the answer it rated.
Before, a hand-written stand-in took its place: it listed a model name the real API answers 404 to
and accepted whatever feedback it was sent."""
from __future__ import annotations

from rlhf.sim.users import ApiUser, Behaviour
from tests.support.app import make_app
from tests.support.live_server import v1_server_fixture
from webapp.core.extensions import db
from webapp.core.identity import api_anon_id
from webapp.core.models import ApiKey, Conversation, Feedback, Flag, Message, User

live = v1_server_fixture("v1-sim")  # the production server, keys made

QUESTION = "How do I keep basil alive?"


def stored(instance, user: str) -> dict:
    """What the server stored for the end user ``user`` of the "front" client (the key "front-a")."""
    app = make_app(instance)
    with app.app_context():
        try:
            person = db.session.scalars(db.select(User).filter_by(anon_id=api_anon_id("front", user))).first()
            if person is None:
                return {"answers": {}, "feedback": {}, "flags": {}}
            answers = {m.completion_id: m for m in db.session.scalars(
                db.select(Message).join(Conversation, Message.conversation_id == Conversation.id)
                .where(Conversation.user_id == person.id, Message.role == "assistant"))}
            by_id = {m.id: cid for cid, m in answers.items()}
            feedback = {by_id[f.message_id]: (f.thumb, f.rating, list(f.reasons or []))
                        for f in db.session.scalars(db.select(Feedback).filter_by(user_id=person.id))}
            flags = {by_id[f.message_id]: f.category
                     for f in db.session.scalars(db.select(Flag).filter_by(user_id=person.id))}
            keys = {db.session.get(ApiKey, m.api_key_id).name for m in answers.values()}
            return {"answers": {cid: m.content for cid, m in answers.items()}, "feedback": feedback, "flags": flags,
                    "keys": keys}
        finally:
            db.session.remove()
            db.engine.dispose()


def test_an_api_user_speaks_the_real_v1_contract(live):
    server, instance, keys = live
    key = keys["front-a"]
    rater = ApiUser(server.url, key, "polite", seed=3, behaviour=Behaviour(noise=0, rate_prob=1, regenerate_prob=1,
                                                                            flag_prob=1, chip_prob=1))
    assert rater.model == "rlhf-chat"  # the public name GET /v1/models lists (never a version's name)
    interactions = rater.ask(QUESTION) + rater.ask("What is a good warm-up before a run?")
    watcher = ApiUser(server.url, key, "polite", seed=4, rate=False)
    watched = watcher.ask(QUESTION)

    mine = stored(instance, "sim-3")
    assert mine["keys"] == {"front-a"}
    # every answer it was given is stored as its own, with the text it saw
    assert {i.completion_id: i.answer for i in interactions} == mine["answers"]
    rated = [i for i in interactions if i.events]
    assert rated, "a rater with rate_prob 1 rated nothing"
    # each rating it sent was taken and stored on the answer it rated, as its own
    assert set(mine["feedback"]) | set(mine["flags"]) == {i.completion_id for i in rated}
    for i in rated:
        if i.completion_id in mine["feedback"]:
            thumb, stars, chips = mine["feedback"][i.completion_id]
            assert thumb in ("up", "down") and (stars is None or 1 <= stars <= 5)
    # a disappointed user: thumbs down (with a correction where it writes one), and asks again
    critic = ApiUser(server.url, key, "thorough", seed=5, behaviour=Behaviour(noise=0, rate_prob=1, regenerate_prob=1,
                                                                               chip_prob=1, correction_prob=1,
                                                                               flag_prob=1))
    asked = critic.ask(QUESTION)
    theirs = stored(instance, "sim-5")
    assert len(asked) == 2 and all(i.events == 1 for i in asked)  # rated, asked again, rated again
    assert {cid: thumb for cid, (thumb, _, _) in theirs["feedback"].items()} == \
        {i.completion_id: "down" for i in asked}
    # the body it sends for a rude answer (a flag beside the thumb) is taken too
    assert critic._rate(asked[0].completion_id, QUESTION, 0.0, "Ugh, fine. Figure it out yourself, idiot.") == 1
    assert stored(instance, "sim-5")["flags"] == {asked[0].completion_id: "harassment"}

    # a chat-only user is a user of its own and rates nothing
    watched_rows = stored(instance, "sim-4")
    assert [i.events for i in watched] == [0] and len(watched_rows["answers"]) == 1
    assert watched_rows["feedback"] == {} and watched_rows["flags"] == {}
