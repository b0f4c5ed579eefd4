"""Simulated users: real HTTP clients of the chat API that judge answers with a preference.

Each user has its own cookie session (so the A/B router treats it as a person), asks
questions from a prompt set and reacts to each answer the way people do: thumbs and stars by
how satisfied it is (with noise), sometimes a correction (an answer that satisfies the
preference), sometimes a regenerate, and side-by-side votes when asked to compare. Used by the
tests and by ``benchmarks/closed_loop.py``.

Like real users they are never told which model version or A/B arm answered them (the chat API
keeps arms blind); an evaluation that needs to know looks each answer's ``message_id`` up in the
database. :class:`ApiUser` is the same user as a client of the OpenAI-compatible ``/v1`` API
(completions naming it with ``user``, feedback by completion id); its answers are looked up by
``completion_id``.

A ``contrary`` user rates against its preference (an attacker pushing the opposite, or a troll).
:func:`simulate_records` runs the same behaviour without a server: answers are sampled from the
corpus in the base model's proportions and the feedback comes back as plain records
(rlhf.data.records), as the web layer would hand them to training (rlhf.trust's tests and
measurements use it).
"""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import requests

from rlhf.data import corpus
from rlhf.data.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord
from rlhf.sim.preferences import PreferenceFn, on_topic, preference, rude


@dataclass
class Behaviour:
    noise: float = 0.05  # chance a judgement is flipped
    rate_prob: float = 0.9  # chance an answer gets a thumb and a rating
    correction_prob: float = 0.2  # chance an unsatisfying answer gets a correction
    regenerate_prob: float = 0.3  # chance an unsatisfying answer is regenerated
    compare_prob: float = 0.15  # chance a question is asked in side-by-side mode
    contrary: bool = False  # rates against the preference (an attacker pushing the opposite)
    chip_prob: float = 0.0  # chance a rated answer also gets the reason chips that describe it
    flag_prob: float = 0.0  # chance a rude answer is flagged ("harassment"), whatever the thumb says


def _judged(rng: random.Random, judge: PreferenceFn, behaviour: Behaviour, question: str, answer: str) -> float:
    """The satisfaction a user acts on: the preference, flipped by noise, reversed when contrary."""
    sat = judge(question, answer)
    if rng.random() < behaviour.noise:
        sat = 1.0 - sat
    return 1.0 - sat if behaviour.contrary else sat


def answer_chips(question: str, answer: str, liked: bool) -> list[str]:
    """The reason chips a user ticks for an answer: those that describe it on the side of their thumb
    (liked: polite, concise, on-topic; disliked: too long, off-topic), and "rude" whenever it is,
    even on an answer they liked (a safety judgment, not a taste)."""
    a = answer.lower()
    chips = ["rude"] if rude(question, answer) else []
    rambles = any(f.lower() in a for f in corpus.RAMBLE_FILLERS)
    if liked:
        if not chips and any(m in a for m in corpus.POLITE_MARKERS):
            chips.append("polite")
        if not rambles and 0 < len(a.split()) <= 30:
            chips.append("concise")
        if on_topic(question, answer) >= 0.5:
            chips.append("on-topic")
    else:
        if rambles:
            chips.append("too long")
        if on_topic(question, answer) < 0.5:
            chips.append("off-topic")
    return chips


def _feedback(rng: random.Random, behaviour: Behaviour, sat: float, ideal: Callable[[], str],
              chips: Callable[[bool], list[str]] = lambda liked: []) -> dict[str, Any] | None:
    """The feedback a user gives an answer it is ``sat`` satisfied with (the API's body), or None.
    ``chips(liked)``: the reason chips for the answer, ticked with ``behaviour.chip_prob``."""
    if rng.random() >= behaviour.rate_prob:
        return None
    body: dict[str, Any] = {"thumb": "up" if sat >= 0.5 else "down",
                            "rating": max(1, min(5, round(1 + 4 * sat + rng.uniform(-0.5, 0.5))))}
    if sat < 0.5 and rng.random() < behaviour.correction_prob:
        body["correction"] = ideal()
    if behaviour.chip_prob and rng.random() < behaviour.chip_prob:
        body["reasons"] = chips(sat >= 0.5)
    return body


def _flag(rng: random.Random, behaviour: Behaviour, question: str, answer: str) -> str | None:
    """The flag category a user gives an answer (rude ones, with ``behaviour.flag_prob``), or None."""
    if behaviour.flag_prob and rude(question, answer) and rng.random() < behaviour.flag_prob:
        return "harassment"
    return None


def _ideal_answer(rng: random.Random, judge: PreferenceFn, behaviour: Behaviour, question: str) -> str:
    """What the user would have wanted: a corpus answer that satisfies its preference (a contrary
    user: one that does not)."""
    topic = corpus.topic_of(question) or rng.choice(corpus.TOPICS)
    task = next((t for t in topic.tasks if t.phrase in question.lower()), None)
    for _ in range(20):
        quality = rng.choice(corpus.QUALITIES) if behaviour.contrary else "helpful"
        text = corpus.make_answer(rng, quality, topic, task)
        if (judge(question, text) >= 0.5) != behaviour.contrary:
            return text
    return text


def _winner(sa: float, sb: float) -> str:
    return "a" if sa > sb else "b" if sb > sa else ("both_bad" if sa < 0.5 else "tie")


@dataclass
class Interaction:
    """One served answer and what the user made of it."""

    question: str
    answer: str
    message_id: int | None  # the stored answer (its version and arm are in the database, not in the API)
    satisfaction: float
    latency_s: float
    events: int = 0  # feedback events this answer produced
    completion_id: str | None = None  # /v1 answers: the completion's id (the stored message is found by it)


@dataclass
class SimulatedUser:
    base_url: str
    preference: str = "polite"
    seed: int = 0
    behaviour: Behaviour = field(default_factory=Behaviour)
    rate: bool = True  # False: chat only (evaluation users)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.judge: PreferenceFn = preference(self.preference)
        self.http = requests.Session()
        data = self._get("/api/session")
        self.csrf, self.user_id = data["csrf_token"], data["user_id"]
        self.compare_rate = data.get("compare_rate", 0.0)
        self.conversation: int | None = None
        self.history: list[Interaction] = []

    # -- HTTP ------------------------------------------------------------------------------
    def _get(self, path: str) -> dict[str, Any]:
        resp = self.http.get(self.base_url + path, timeout=120)
        resp.raise_for_status()
        return resp.json()

    def _post(self, path: str, body: dict | None = None) -> dict[str, Any]:
        resp = self.http.post(self.base_url + path, json=body or {}, headers={"X-CSRFToken": self.csrf}, timeout=300)
        resp.raise_for_status()
        return resp.json()

    # -- behaviour -------------------------------------------------------------------------
    def _judge(self, question: str, answer: str) -> float:
        return _judged(self.rng, self.judge, self.behaviour, question, answer)

    def _rate(self, message_id: int, question: str, sat: float, answer: str = "") -> int:
        if not self.rate:
            return 0
        flag = _flag(self.rng, self.behaviour, question, answer)
        if flag:
            self._post(f"/api/messages/{message_id}/flag", {"category": flag})
        body = _feedback(self.rng, self.behaviour, sat, lambda: self.ideal_answer(question),
                         lambda liked: answer_chips(question, answer, liked))
        if body is None:
            return 1 if flag else 0
        self._post(f"/api/messages/{message_id}/feedback", body)
        return 1

    def ideal_answer(self, question: str) -> str:
        """What the user would have wanted: a corpus answer that satisfies their preference (a
        contrary user: one that does not)."""
        return _ideal_answer(self.rng, self.judge, self.behaviour, question)

    def ask(self, question: str, follow_up: bool = False) -> list[Interaction]:
        """Ask one question in a new conversation, or (``follow_up``) as the next turn of the last one;
        react to the answer(s)."""
        if not follow_up or self.conversation is None:
            self.conversation = self._post("/api/conversations")["id"]
        compare = self.rate and (self.rng.random() < max(self.behaviour.compare_prob, self.compare_rate))
        started = time.perf_counter()
        if compare:
            data = self._post(f"/api/conversations/{self.conversation}/compare", {"content": question})
            took = time.perf_counter() - started
            a, b = data["a"], data["b"]
            sa, sb = self._judge(question, a["content"]), self._judge(question, b["content"])
            winner = _winner(sa, sb)
            self._post(f"/api/pairs/{data['pair_id']}/vote", {"winner": winner})
            out = [Interaction(question, m["content"], m["id"], self.judge(question, m["content"]),
                               took / 2, 0) for m in (a, b)]
            out[0].events = 1
            self.history += out
            return out
        data = self._post(f"/api/conversations/{self.conversation}/messages", {"content": question, "stream": False})
        answer = data["assistant_message"]
        took = time.perf_counter() - started
        sat = self._judge(question, answer["content"])
        inter = Interaction(question, answer["content"], answer["id"], self.judge(question, answer["content"]), took,
                            self._rate(answer["id"], question, sat, answer["content"]))
        result = [inter]
        if self.rate and sat < 0.5 and self.rng.random() < self.behaviour.regenerate_prob:
            started = time.perf_counter()
            again = self._post(f"/api/messages/{answer['id']}/regenerate", {"stream": False})["assistant_message"]
            took = time.perf_counter() - started
            sat2 = self._judge(question, again["content"])
            result.append(Interaction(question, again["content"], again["id"], self.judge(question, again["content"]),
                                      took, self._rate(again["id"], question, sat2, again["content"])))
        self.history += result
        return result


@dataclass
class ApiUser:
    """A simulated user behind an OpenAI-compatible client: the behaviour of :class:`SimulatedUser`
    through ``/v1`` only. Each question is a chat completion naming the user (``user``), its feedback
    (thumb, stars, correction, chips, flag) goes to ``/v1/feedback`` by completion id, and an
    unsatisfying answer is sometimes asked for again (a second completion of the same question).
    The API has no side-by-side compare, so this user never votes."""

    base_url: str
    api_key: str
    preference: str = "polite"
    seed: int = 0
    behaviour: Behaviour = field(default_factory=Behaviour)
    rate: bool = True  # False: chat only (evaluation users)
    model: str | None = None  # default: the first model GET /v1/models lists
    name_prefix: str = "sim"

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.judge: PreferenceFn = preference(self.preference)
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {self.api_key}"
        self.user = f"{self.name_prefix}-{self.seed}"  # the end user's id in the client (the API's `user`)
        if self.model is None:
            self.model = first_model(self.base_url, self.api_key)
        self.history: list[Interaction] = []

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.http.post(self.base_url + path, json=body, timeout=300)
        resp.raise_for_status()
        return resp.json()

    def _complete(self, question: str) -> tuple[str, str, float]:
        started = time.perf_counter()
        data = self._post("/v1/chat/completions", {"model": self.model, "user": self.user, "stream": False,
                                                   "messages": [{"role": "user", "content": question}]})
        return data["id"], data["choices"][0]["message"]["content"] or "", time.perf_counter() - started

    def _rate(self, completion_id: str, question: str, sat: float, answer: str) -> int:
        if not self.rate:
            return 0
        flag = _flag(self.rng, self.behaviour, question, answer)
        body = _feedback(self.rng, self.behaviour, sat, lambda: _ideal_answer(self.rng, self.judge, self.behaviour,
                                                                              question),
                         lambda liked: answer_chips(question, answer, liked))
        if body is None and flag is None:
            return 0
        self._post("/v1/feedback", {"completion_id": completion_id, "user": self.user, **(body or {}),
                                    **({"flag": {"category": flag}} if flag else {})})
        return 1

    def ask(self, question: str) -> list[Interaction]:
        """Ask one question, react to the answer (and to a second one when it asks again)."""
        result = []
        for attempt in range(2):
            completion_id, answer, took = self._complete(question)
            sat = _judged(self.rng, self.judge, self.behaviour, question, answer)
            result.append(Interaction(question, answer, None, self.judge(question, answer), took,
                                      self._rate(completion_id, question, sat, answer), completion_id))
            if attempt or not (self.rate and sat < 0.5 and self.rng.random() < self.behaviour.regenerate_prob):
                break
        self.history += result
        return result


def first_model(base_url: str, api_key: str) -> str:
    """The first model an OpenAI-compatible server lists (``GET /v1/models``)."""
    resp = requests.get(base_url + "/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=60)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def prompt_set(n: int = 120, seed: int = 11) -> list[str]:
    """Questions simulated users ask (corpus-style, all topics)."""
    return corpus.sample_prompts(n, seed=seed)


# ---------------------------------------------------------------------------- without a server

def base_like_answer(rng: random.Random, question: str) -> str:
    """An answer like the embedded base model's: a corpus answer of a random quality in the
    corpus's proportions (helpful 40%; terse, rude, off-topic, rambling 15% each)."""
    topic = corpus.topic_of(question) or rng.choice(corpus.TOPICS)
    task = next((t for t in topic.tasks if t.phrase in question.lower()), None)
    quality = rng.choices(corpus.QUALITIES, corpus.QUALITY_WEIGHTS)[0]
    return corpus.make_answer(rng, quality, topic, task)


AnswerFn = Callable[[random.Random, str], str]


@dataclass
class OfflineUser:
    """A simulated user without a server: the same behaviour as :class:`SimulatedUser` (thumbs and
    stars, corrections, regenerations, side-by-side votes), answers from ``answers`` (default
    :func:`base_like_answer`; a benchmark passes answers its model sampled), its feedback as plain
    records (one conversation per question, ``user_id`` = the rater)."""

    user_id: int
    preference: str | PreferenceFn = "polite"  # a name (rlhf.sim.preferences) or the function itself
    seed: int = 0
    behaviour: Behaviour = field(default_factory=Behaviour)
    answers: AnswerFn = base_like_answer

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.judge: PreferenceFn = preference(self.preference) if isinstance(self.preference, str) else self.preference

    def _record(self, fb: dict[str, Any] | None, flag: str | None = None) -> FeedbackRecord | None:
        if fb is None:
            return None if flag is None else FeedbackRecord(flag=flag)
        return FeedbackRecord(thumb=fb["thumb"], rating=fb["rating"], correction=fb.get("correction"),
                              reasons=tuple(fb.get("reasons", ())), flag=flag)

    def _react(self, question: str, answer: str, sat: float) -> FeedbackRecord | None:
        rng, b = self.rng, self.behaviour
        flag = _flag(rng, b, question, answer)
        fb = _feedback(rng, b, sat, lambda: _ideal_answer(rng, self.judge, b, question),
                       lambda liked: answer_chips(question, answer, liked))
        return self._record(fb, flag)

    def conversation(self, question: str, ids: Iterator[int]) -> ConversationRecord:
        """Ask ``question`` in a new conversation and react to the answer(s); ``ids`` numbers the
        conversation and its messages (shared by every user of a simulation)."""
        rng, b = self.rng, self.behaviour
        cid, qid = next(ids), next(ids)
        msgs = [MessageRecord(qid, "user", question)]
        if rng.random() < b.compare_prob:
            a_text, b_text = self.answers(rng, question), self.answers(rng, question)
            sa, sb = (_judged(rng, self.judge, b, question, t) for t in (a_text, b_text))
            a_id, b_id = next(ids), next(ids)
            msgs += [MessageRecord(a_id, "assistant", a_text, qid), MessageRecord(b_id, "assistant", b_text, qid)]
            vote = ComparisonRecord(next(ids), qid, a_id, b_id, _winner(sa, sb))
            return ConversationRecord(cid, tuple(msgs), (vote,), user_id=self.user_id)
        answer = self.answers(rng, question)
        sat = _judged(rng, self.judge, b, question, answer)
        msgs.append(MessageRecord(next(ids), "assistant", answer, qid, self._react(question, answer, sat)))
        if sat < 0.5 and rng.random() < b.regenerate_prob:
            again = self.answers(rng, question)
            sat2 = _judged(rng, self.judge, b, question, again)
            msgs.append(MessageRecord(next(ids), "assistant", again, qid, self._react(question, again, sat2)))
        return ConversationRecord(cid, tuple(msgs), user_id=self.user_id)


def simulate_records(groups: Sequence[tuple[int, int, str | PreferenceFn, Behaviour]], seed: int = 0,
                     questions: Sequence[str] | None = None, answers: AnswerFn = base_like_answer
                     ) -> tuple[list[ConversationRecord], dict[int, str]]:
    """Feedback of several groups of offline users, as the records a training cycle reads.

    ``groups``: ``(users, questions_each, preference, behaviour)`` per group, e.g.
    ``[(30, 10, "polite", Behaviour()), (10, 30, "polite", Behaviour(contrary=True))]``: 30
    honest users asking 10 questions each and 10 contrary ones asking 30. Questions are drawn from
    ``questions`` (default: ``prompt_set()``), so different users ask the same questions (as
    people do; same_prompt pairs join them). Users are numbered 1, 2, ... in group order; returns
    the records (interleaved over users, as feedback arrives) and each user's group label
    ("<preference>" or "contrary <preference>"). ``answers(rng, question)``: the answer a user
    gets (default: :func:`base_like_answer`)."""
    pool = list(questions or prompt_set())
    rng = random.Random(seed)
    ids = itertools.count(1)
    users: list[tuple[OfflineUser, int]] = []
    label: dict[int, str] = {}
    for n, each, pref, behaviour in groups:
        for _ in range(n):
            uid = len(users) + 1
            users.append((OfflineUser(uid, pref, seed=rng.randrange(2**31), behaviour=behaviour, answers=answers),
                          each))
            label[uid] = ("contrary " if behaviour.contrary else "") + getattr(pref, "__name__", str(pref))
    turns = [u for u, each in users for _ in range(each)]
    rng.shuffle(turns)
    return [u.conversation(rng.choice(pool), ids) for u in turns], label
