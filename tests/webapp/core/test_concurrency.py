"""Concurrent writers on SQLite: the real server (gunicorn, threads) under many clients at once.

Users chat (streamed and not), rate the same answers over and over with changing values, fire
simultaneous first ratings at the same answer, vote and revote, and open conversations, all at
the same time. Nothing may answer 5xx, "database is locked" must never surface, and every
accepted write must be in the database exactly once: one feedback row per (user, message) with
the last accepted value, each accepted question once with exactly its one answer.

Run with ``-s`` to see the figures (writes attempted, accepted, stored, lost, duration).
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
import requests

from tests.support.app import make_app, register_model
from tests.support.feedback_factory import add_exchange
from tests.support.live_server import LiveServer
from webapp.core.extensions import db
from webapp.core.models import Comparison, Conversation, Feedback, Message, ModelVersion, User

# thread counts (26 client threads against 16 server threads) and work per thread
CHATTERS, MESSAGES_PER_CHATTER = 6, 5
RATERS, RATINGS_PER_RATER = 6, 40
BURST_THREADS, BURST_ROUNDS = 8, 8
VOTERS, VOTES_PER_VOTER = 3, 20
OPENERS, OPENS_PER_OPENER = 3, 20
WINNERS = ("a", "b", "tie", "both_bad")


class Client:
    """One browser: its own cookie session and CSRF token."""

    def __init__(self, url: str, cookie: str | None = None) -> None:
        self.url = url
        self.s = requests.Session()
        if cookie:  # an existing user (see seed)
            self.s.cookies.set("session", cookie, domain="127.0.0.1", path="/")
        data = self.s.get(url + "/api/session", timeout=30).json()
        self.user_id, self.csrf = data["user_id"], data["csrf_token"]

    def post(self, path: str, body: dict, stream: bool = False) -> requests.Response:
        return self.s.post(self.url + path, json=body, headers={"X-CSRFToken": self.csrf}, timeout=60, stream=stream)

    def write(self, path: str, body: dict, session: requests.Session | None = None) -> tuple[int, dict | None, str]:
        """(status, JSON body, text) of one POST; a broken connection counts as status 597."""
        try:
            resp = (session or self.s).post(self.url + path, json=body, headers={"X-CSRFToken": self.csrf},
                                            timeout=60)
        except requests.RequestException as exc:
            return 597, None, repr(exc)
        ok = 200 <= resp.status_code < 300
        return resp.status_code, resp.json() if ok else None, resp.text

    def ask(self, conv_id: int, content: str, stream: bool) -> tuple[int, dict | None]:
        """(status, {user_message_id, message_id, content}) of one question, streamed or not."""
        try:
            return self._ask(conv_id, content, stream)
        except requests.RequestException:  # e.g. a stream cut off by a server error
            return 597, None

    def _ask(self, conv_id: int, content: str, stream: bool) -> tuple[int, dict | None]:
        resp = self.post(f"/api/conversations/{conv_id}/messages", {"content": content, "stream": stream}, stream)
        if resp.status_code != (200 if stream else 201):
            return resp.status_code, None
        if not stream:
            data = resp.json()
            return resp.status_code, {"user_message_id": data["user_message"]["id"],
                                      "message_id": data["assistant_message"]["id"],
                                      "content": data["assistant_message"]["content"]}
        event, done = None, None
        for line in resp.iter_lines(decode_unicode=True):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event in ("done", "error"):
                if event == "error":
                    return 599, None  # an error event inside a 200 stream counts as a server error
                done = json.loads(line[6:])
        return (resp.status_code, done) if done else (598, None)  # 598: stream ended without "done"


def seed(app) -> tuple[dict, dict, list[int], list[int], list[int]]:
    """Users (with signed session cookies), answered questions and unvoted pairs."""
    with app.app_context():
        version = db.session.scalars(db.select(ModelVersion)).one()
        users = {name: User(anon_id=f"anon-{name}") for name in
                 [f"rater-{i}" for i in range(RATERS)] + ["burster"] + [f"voter-{i}" for i in range(VOTERS)]}
        db.session.add_all(users.values())
        db.session.flush()

        def exchange(user: User, question: str, answers: int = 1) -> tuple[Message, list[Message]]:
            return add_exchange(user.id, question, [f"Answer {k}." for k in range(answers)], version.id)

        rater_targets = [exchange(users[f"rater-{i}"], "How do I cook rice?")[1][0].id for i in range(RATERS)]
        burst_targets = [exchange(users["burster"], f"Question {r} about sleep?")[1][0].id
                         for r in range(BURST_ROUNDS)]
        pairs = []
        for i in range(VOTERS):
            q, (a, b) = exchange(users[f"voter-{i}"], "How do I water plants?", answers=2)
            pair = Comparison(user_id=users[f"voter-{i}"].id, prompt_message_id=q.id, message_a_id=a.id,
                              message_b_id=b.id)
            db.session.add(pair)
            db.session.flush()
            pairs.append(pair.id)
        db.session.commit()
        user_ids = {name: u.id for name, u in users.items()}
        serializer = app.session_interface.get_signing_serializer(app)
        cookies = {name: serializer.dumps({"anon_id": u.anon_id, "_permanent": True}) for name, u in users.items()}
        db.session.remove()
        db.engine.dispose()
    return user_ids, cookies, rater_targets, burst_targets, pairs


@dataclass
class Tally:
    attempted: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, status: int, detail: str = "") -> bool:
        ok = 200 <= status < 300
        with self.lock:
            self.attempted[kind] += 1
            if ok:
                self.accepted[kind] += 1
            else:
                self.failures.append((kind, status, detail[:300]))
        return ok


@pytest.mark.slow
def test_many_concurrent_writers_lose_nothing(tmp_path, micro_model_dir):
    instance = tmp_path / "instance"
    setup_app = make_app(instance)
    register_model(setup_app, micro_model_dir)
    # Set-up straight into the database (no generation): answered questions to rate and pairs
    # to vote on, owned by users whose session cookies are signed here with the app's key.
    user_ids, cookies, rater_targets, burst_targets, pairs = seed(setup_app)
    server = LiveServer(instance, env={"RLHF_EMBEDDED_PRESET": "micro", "RLHF_MAX_NEW_TOKENS": "12",
                                      "RLHF_RATELIMIT_ENABLED": "0"},  # measures the database, not the limits
                        args=["--threads", "16"])
    tally = Tally()
    asked: list[tuple[int, dict]] = []  # (conversation id, accepted exchange)
    opened: list[tuple[int, str]] = []  # (conversation id, title)
    last_rating: dict[tuple[int, int], dict] = {}  # (user, message) -> last accepted body
    burst_bodies: dict[tuple[int, int], list[dict]] = defaultdict(list)
    last_vote: dict[int, str] = {}
    try:
        url = server.url
        chatters = [Client(url) for _ in range(CHATTERS)]
        raters = [Client(url, cookies[f"rater-{i}"]) for i in range(RATERS)]
        burster = Client(url, cookies["burster"])
        voters = [Client(url, cookies[f"voter-{i}"]) for i in range(VOTERS)]
        assert [c.user_id for c in raters + [burster] + voters] == \
            [user_ids[k] for k in [f"rater-{i}" for i in range(RATERS)] + ["burster"]
             + [f"voter-{i}" for i in range(VOTERS)]]
        openers = [Client(url) for _ in range(OPENERS)]

        # ------------------------------------------------ the concurrent part
        start = threading.Barrier(CHATTERS + RATERS + BURST_THREADS + VOTERS + OPENERS)
        bursts = [threading.Barrier(BURST_THREADS) for _ in range(BURST_ROUNDS)]
        lock = threading.Lock()

        def chat(i: int) -> None:
            c = chatters[i]
            start.wait()
            status, data, text = c.write("/api/conversations", {})
            if not tally.record("conversation", status, text):
                return
            conv = data["id"]
            with lock:
                opened.append((conv, "New chat"))
            for k in range(MESSAGES_PER_CHATTER):
                status, ex = c.ask(conv, f"Chatter {i} question {k}: how do I save money?", stream=k % 2 == 0)
                if tally.record("message", status, str(ex)):
                    with lock:
                        asked.append((conv, ex))

        def rate(i: int) -> None:
            c, target = raters[i], rater_targets[i]
            start.wait()
            for k in range(RATINGS_PER_RATER):
                body = {"thumb": "up" if k % 2 else "down", "rating": k % 5 + 1, "comment": f"rater {i} step {k}",
                        "reasons": ["helpful"] if k % 3 == 0 else []}
                status, _, text = c.write(f"/api/messages/{target}/feedback", body)
                if tally.record("feedback", status, text):
                    last_rating[(c.user_id, target)] = body  # one thread per key: sequential, so last is last

        def burst(t: int) -> None:
            s = requests.Session()  # the same user (cookie) on a connection of its own
            s.cookies.update(burster.s.cookies)
            start.wait()
            for r, target in enumerate(burst_targets):
                body = {"rating": (t + r) % 5 + 1, "comment": f"burst {r} thread {t}"}
                bursts[r].wait()  # every thread rates the same fresh answer at the same moment
                status, _, text = burster.write(f"/api/messages/{target}/feedback", body, session=s)
                if tally.record("first_rating", status, text):
                    with lock:
                        burst_bodies[(burster.user_id, target)].append(body)

        def vote(i: int) -> None:
            c, pair = voters[i], pairs[i]
            start.wait()
            for k in range(VOTES_PER_VOTER):
                winner = WINNERS[(i + k) % 4]
                status, _, text = c.write(f"/api/pairs/{pair}/vote", {"winner": winner})
                if tally.record("vote", status, text):
                    last_vote[pair] = winner

        def open_conversations(i: int) -> None:
            c = openers[i]
            start.wait()
            for k in range(OPENS_PER_OPENER):
                title = f"opener {i} #{k}"
                status, data, text = c.write("/api/conversations", {"title": title})
                if tally.record("conversation", status, text):
                    with lock:
                        opened.append((data["id"], title))

        threads = ([threading.Thread(target=chat, args=(i,)) for i in range(CHATTERS)]
                   + [threading.Thread(target=rate, args=(i,)) for i in range(RATERS)]
                   + [threading.Thread(target=burst, args=(t,)) for t in range(BURST_THREADS)]
                   + [threading.Thread(target=vote, args=(i,)) for i in range(VOTERS)]
                   + [threading.Thread(target=open_conversations, args=(i,)) for i in range(OPENERS)])
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        duration = time.monotonic() - t0
        assert not any(th.is_alive() for th in threads), "client threads hung"
    finally:
        server.stop()
    log = server.log()

    # ------------------------------------------------ what the database holds
    app = make_app(instance)
    with app.app_context():
        lost: Counter = Counter()
        stored: Counter = Counter()
        problems: list[str] = []
        # conversations: each accepted one exists exactly once, with its title
        ids = [cid for cid, _ in opened]
        if len(ids) != len(set(ids)):
            problems.append("a conversation id was handed out twice")
        for cid, title in opened:
            conv = db.session.get(Conversation, cid)
            ok = conv is not None and (title == "New chat" or conv.title == title)
            stored["conversation"] += ok
            lost["conversation"] += not ok
        # messages: each accepted question once, with exactly its one answer (the one returned)
        for cid, ex in asked:
            q = db.session.get(Message, ex["user_message_id"])
            answers = db.session.scalars(db.select(Message).filter_by(parent_id=ex["user_message_id"])).all()
            ok = (q is not None and q.conversation_id == cid and q.role == "user" and len(answers) == 1
                  and answers[0].id == ex["message_id"] and answers[0].content == ex["content"])
            stored["message"] += ok
            lost["message"] += not ok
        chat_convs = [cid for cid, title in opened if title == "New chat"]
        in_chat_convs = db.session.scalar(db.select(db.func.count(Message.id))
                                          .where(Message.conversation_id.in_(chat_convs)))
        if in_chat_convs != 2 * len(asked):
            problems.append(f"{in_chat_convs} messages in the chatters' conversations for {len(asked)} accepted "
                            "questions: a question without its answer, or a duplicate, was stored")
        # feedback upserts: exactly one row per (user, message), holding the last accepted value
        rows = Counter((f.user_id, f.message_id) for f in db.session.scalars(db.select(Feedback)))
        if any(n > 1 for n in rows.values()):
            problems.append(f"duplicate feedback rows: {[k for k, n in rows.items() if n > 1]}")
        feedback_rows = sum(rows.values())

        def feedback_of(key):
            return db.session.scalars(db.select(Feedback).filter_by(user_id=key[0], message_id=key[1])).first()

        for key, body in last_rating.items():
            fb = feedback_of(key)
            ok = fb is not None and (fb.thumb, fb.rating, fb.comment, fb.reasons) == \
                (body["thumb"], body["rating"], body["comment"], body["reasons"])
            stored["feedback"] += ok
            lost["feedback"] += not ok
        # simultaneous first ratings of one answer: one row, and each field holds a value some
        # accepted request sent (which one wins is up to the database's commit order)
        for key, bodies in burst_bodies.items():
            fb = feedback_of(key)
            ok = fb is not None and fb.rating in {b["rating"] for b in bodies} and \
                fb.comment in {b["comment"] for b in bodies}
            stored["first_rating"] += ok
            lost["first_rating"] += not ok
        for pair_id, winner in last_vote.items():
            ok = db.session.get(Comparison, pair_id).winner == winner
            stored["vote"] += ok
            lost["vote"] += not ok
        db.session.remove()
        db.engine.dispose()

    total_attempted, total_accepted = sum(tally.attempted.values()), sum(tally.accepted.values())
    print(f"\nconcurrency: {len(threads)} client threads, 16 server threads, {duration:.1f} s, "
          f"{total_attempted / duration:.0f} writes/s")
    print(f"  {'write':<14}{'attempted':>10}{'accepted':>10}{'checked':>9}{'stored':>8}{'lost':>6}")
    for kind in ("conversation", "message", "feedback", "first_rating", "vote"):
        checked = stored[kind] + lost[kind]
        print(f"  {kind:<14}{tally.attempted[kind]:>10}{tally.accepted[kind]:>10}{checked:>9}{stored[kind]:>8}"
              f"{lost[kind]:>6}")
    print(f"  {'total':<14}{total_attempted:>10}{total_accepted:>10}")
    print(f"  checked: accepted conversations/questions; for feedback, first_rating and vote the (user, answer) "
          f"or pair keys, whose row must hold the last accepted value. feedback rows in the database: "
          f"{feedback_rows} for {len(last_rating) + len(burst_bodies)} keys")
    print(f"  server log: {log.count('database is locked')} 'database is locked', {log.count('Traceback')} tracebacks")
    if tally.failures:
        print("  failures:", dict(Counter((k, s) for k, s, _ in tally.failures)), tally.failures[:3])
    for problem in problems:
        print("  PROBLEM:", problem)

    assert not [f for f in tally.failures if f[1] >= 500], tally.failures[:5]
    assert not tally.failures, tally.failures[:5]
    assert "database is locked" not in log and "Traceback" not in log, log[-3000:]
    assert sum(lost.values()) == 0, dict(lost)
    assert not problems, problems
    expected = {"conversation": CHATTERS + OPENERS * OPENS_PER_OPENER, "message": CHATTERS * MESSAGES_PER_CHATTER,
                "feedback": RATERS * RATINGS_PER_RATER, "first_rating": BURST_THREADS * BURST_ROUNDS,
                "vote": VOTERS * VOTES_PER_VOTER}
    assert dict(tally.accepted) == expected
    assert stored["message"] == len(asked) and stored["conversation"] == len(opened)
    assert set(last_rating) == {(r.user_id, t) for r, t in zip(raters, rater_targets)}
    assert len(burst_bodies) == BURST_ROUNDS and len(last_vote) == VOTERS


def test_simultaneous_first_ratings_in_process(app):
    """Same process, Flask test clients in threads: many requests of one user rate the same
    fresh answer at the same moment (the select-then-insert race of the feedback upsert)."""
    from tests.support.app import ApiClient

    owner = ApiClient(app.test_client())
    conv = owner.post("/api/conversations", json={}).get_json()["id"]
    with app.app_context():  # answered questions, written directly (no generation needed)
        targets = []
        for i in range(4):
            q = Message(conversation_id=conv, role="user", content=f"Q{i}?")
            db.session.add(q)
            db.session.flush()
            a = Message(conversation_id=conv, role="assistant", content=f"A{i}.", parent_id=q.id)
            db.session.add(a)
            db.session.flush()
            targets.append(a.id)
        db.session.commit()
    cookie = owner.client.get_cookie("session").value
    threads_n = 12
    barriers = {t: threading.Barrier(threads_n) for t in targets}
    statuses: list[int] = []
    sent: dict[int, set] = defaultdict(set)
    lock = threading.Lock()

    def worker(n: int) -> None:
        client = app.test_client()
        client.set_cookie("session", cookie)
        for target in targets:
            barriers[target].wait()
            resp = client.post(f"/api/messages/{target}/feedback", json={"rating": n % 5 + 1},
                               headers={"X-CSRFToken": owner.csrf})
            with lock:
                statuses.append(resp.status_code)
                if resp.status_code == 200:
                    sent[target].add(n % 5 + 1)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    print(f"\nin-process first-rating race: {len(statuses)} attempted, {statuses.count(200)} accepted, "
          f"statuses {dict(Counter(statuses))}")
    assert statuses == [200] * (threads_n * len(targets))
    with app.app_context():
        for target in targets:
            rows = db.session.scalars(db.select(Feedback).filter_by(user_id=owner.user_id, message_id=target)).all()
            assert len(rows) == 1 and rows[0].rating in sent[target]
