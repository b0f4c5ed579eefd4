"""Simulated users: real HTTP clients of the chat API that judge answers with a preference.

Each user has its own cookie session (so the A/B router treats it as a person), asks
questions from a prompt set and reacts to each answer the way people do: thumbs and stars by
how satisfied it is (with noise), sometimes a correction (an answer that satisfies the
preference), sometimes a regenerate, and side-by-side votes when asked to compare. Used by the
tests and by ``benchmarks/closed_loop.py``.

Like real users they are never told which model version or A/B arm answered them (the chat API
keeps arms blind); an evaluation that needs to know looks each answer's ``message_id`` up in the
database.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from . import corpus
from .preferences import PreferenceFn, preference


@dataclass
class Behaviour:
    noise: float = 0.05  # chance a judgement is flipped
    rate_prob: float = 0.9  # chance an answer gets a thumb and a rating
    correction_prob: float = 0.2  # chance an unsatisfying answer gets a correction
    regenerate_prob: float = 0.3  # chance an unsatisfying answer is regenerated
    compare_prob: float = 0.15  # chance a question is asked in side-by-side mode


@dataclass
class Interaction:
    """One served answer and what the user made of it."""

    question: str
    answer: str
    message_id: int  # the stored answer (its version and arm are in the database, not in the API)
    satisfaction: float
    latency_s: float
    events: int = 0  # feedback events this answer produced


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
        sat = self.judge(question, answer)
        if self.rng.random() < self.behaviour.noise:
            sat = 1.0 - sat
        return sat

    def _rate(self, message_id: int, question: str, sat: float) -> int:
        if not self.rate or self.rng.random() >= self.behaviour.rate_prob:
            return 0
        body: dict[str, Any] = {"thumb": "up" if sat >= 0.5 else "down",
                                "rating": max(1, min(5, round(1 + 4 * sat + self.rng.uniform(-0.5, 0.5))))}
        if sat < 0.5 and self.rng.random() < self.behaviour.correction_prob:
            body["correction"] = self.ideal_answer(question)
        self._post(f"/api/messages/{message_id}/feedback", body)
        return 1

    def ideal_answer(self, question: str) -> str:
        """What the user would have wanted: a corpus answer that satisfies their preference."""
        topic = corpus.topic_of(question) or self.rng.choice(corpus.TOPICS)
        task = next((t for t in topic.tasks if t.phrase in question.lower()), None)
        for _ in range(20):
            text = corpus.make_answer(self.rng, "helpful", topic, task)
            if self.judge(question, text) >= 0.5:
                return text
        return text

    def ask(self, question: str) -> list[Interaction]:
        """Ask one question (new conversation), react to the answer(s)."""
        self.conversation = self._post("/api/conversations")["id"]
        compare = self.rate and (self.rng.random() < max(self.behaviour.compare_prob, self.compare_rate))
        started = time.perf_counter()
        if compare:
            data = self._post(f"/api/conversations/{self.conversation}/compare", {"content": question})
            took = time.perf_counter() - started
            a, b = data["a"], data["b"]
            sa, sb = self._judge(question, a["content"]), self._judge(question, b["content"])
            winner = "a" if sa > sb else "b" if sb > sa else ("both_bad" if sa < 0.5 else "tie")
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
                            self._rate(answer["id"], question, sat))
        result = [inter]
        if self.rate and sat < 0.5 and self.rng.random() < self.behaviour.regenerate_prob:
            started = time.perf_counter()
            again = self._post(f"/api/messages/{answer['id']}/regenerate", {"stream": False})["assistant_message"]
            took = time.perf_counter() - started
            sat2 = self._judge(question, again["content"])
            result.append(Interaction(question, again["content"], again["id"], self.judge(question, again["content"]),
                                      took, self._rate(again["id"], question, sat2)))
        self.history += result
        return result


def prompt_set(n: int = 120, seed: int = 11) -> list[str]:
    """Questions simulated users ask (corpus-style, all topics)."""
    return corpus.sample_prompts(n, seed=seed)
