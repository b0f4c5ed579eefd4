"""Stored feedback for training tests and benchmarks, written straight into the database.

Each conversation asks one corpus question and gets two answers (siblings). A user with a
preference function rates them: thumbs and stars by satisfaction, sometimes a correction (a
helpful corpus answer) for an unsatisfying answer, sometimes a compare vote between the two.
"""
from __future__ import annotations

import random
from typing import Callable

from rlhf.data import corpus
from rlhf.sim.preferences import preference as preference_fn
from webapp.core.extensions import db
from webapp.core.models import Comparison, Conversation, Feedback, Message, ModelVersion, User

AnswerFn = Callable[[str, random.Random], str]


def corpus_answer(question: str, rng: random.Random) -> str:
    """An answer like the base model's: a random quality in the corpus's proportions."""
    topic = corpus.topic_of(question) or rng.choice(corpus.TOPICS)
    task = next((t for t in topic.tasks if t.phrase in question.lower()), None)
    quality = rng.choices(corpus.QUALITIES, corpus.QUALITY_WEIGHTS)[0]
    return corpus.make_answer(rng, quality, topic, task)


def add_exchange(user_id: int, question: str, answers: list[str], version_id: int | None = None
                 ) -> tuple[Message, list[Message]]:
    """A new conversation of ``user_id``: ``question`` and its ``answers`` (siblings, by
    ``version_id``). Flushed, not committed; call inside an app context."""
    conv = Conversation(user_id=user_id, title=question)
    db.session.add(conv)
    db.session.flush()
    q = Message(conversation_id=conv.id, role="user", content=question)
    db.session.add(q)
    db.session.flush()
    out = [Message(conversation_id=conv.id, role="assistant", content=text, parent_id=q.id,
                   model_version_id=version_id) for text in answers]
    db.session.add_all(out)
    db.session.flush()
    return q, out


def seed_feedback(app, conversations: int, preference: str = "polite", seed: int = 0,
                  answer_fn: AnswerFn = corpus_answer, correction_rate: float = 0.15, vote_rate: float = 0.3,
                  noise: float = 0.05) -> int:
    """Write ``conversations`` rated conversations; returns the number of feedback events."""
    rng = random.Random(seed)
    prefer = preference_fn(preference)
    questions = corpus.sample_prompts(200, seed=seed + 1)
    events = 0
    with app.app_context():
        version = db.session.scalars(db.select(ModelVersion).filter_by(status="active")).first()
        for i in range(conversations):
            user = User(anon_id=f"seed-{seed}-{i}")
            db.session.add(user)
            db.session.flush()
            question = questions[i % len(questions)]
            q, answers = add_exchange(user.id, question, [answer_fn(question, rng) for _ in range(2)],
                                      version.id if version else None)
            sats = []
            for a in answers:
                sat = prefer(question, a.content)
                if rng.random() < noise:
                    sat = 1 - sat
                sats.append(sat)
                fb = Feedback(user_id=user.id, message_id=a.id, thumb="up" if sat >= 0.5 else "down",
                              rating=max(1, min(5, round(1 + 4 * sat))), reasons=[])
                if sat < 0.5 and rng.random() < correction_rate:
                    fb.correction = corpus_answer_of_quality(question, "helpful", rng)
                db.session.add(fb)
                events += 1
            if rng.random() < vote_rate and sats[0] != sats[1]:
                db.session.add(Comparison(user_id=user.id, prompt_message_id=q.id, message_a_id=answers[0].id,
                                          message_b_id=answers[1].id, winner="a" if sats[0] > sats[1] else "b"))
                events += 1
        db.session.commit()
    return events


def corpus_answer_of_quality(question: str, quality: str, rng: random.Random) -> str:
    topic = corpus.topic_of(question) or rng.choice(corpus.TOPICS)
    task = next((t for t in topic.tasks if t.phrase in question.lower()), None)
    return corpus.make_answer(rng, quality, topic, task)
