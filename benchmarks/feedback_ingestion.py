"""Feedback ingestion: many users rating answers at once on the real production server.

The production server (``flask --app webapp serve``, gunicorn, SQLite in WAL mode, rate limits
off) gets ``--answers`` pre-created answers per client; ``--clients`` concurrent clients
(separate sessions, each rating only its own answers: first ratings and upserts of earlier
ones) post feedback for ``--seconds`` per period. Reported per period: requests/s and p50/p99
latency; medians over ``--repeats`` periods. Afterwards the database must hold every accepted
write exactly once, with the value of the last accepted write per answer.

Baseline, measured in the same run, alternating periods, with the same client and the same
gunicorn settings (``webapp.cli.processes.gunicorn_settings``): a minimal Flask app whose one route
parses the same JSON body and does one SQLite upsert (WAL, same synchronous setting) per
request -- what this machine, gunicorn, Flask and SQLite can do with none of our app's work
(session cookie, CSRF, user and ownership lookups, validation, ORM). The ratio ours/baseline
says how much of that floor the feedback endpoint keeps. The raw single-thread SQLite upsert
rate is printed for context.

The load generator (http.client keep-alive connections, one thread per client) runs on the
same cores as the server.

    .venv/bin/python benchmarks/feedback_ingestion.py [--clients 32] [--seconds 15] [--repeats 3] [--json FILE]

One module because the baseline server, the load generator and the check of the stored rows
belong to this one measurement and read top to bottom.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGET_RPS = 500.0
TARGET_P99_MS = 100.0


# ---------------------------------------------------------------------------- the baseline app

_MINIMAL_SCHEMA = ("CREATE TABLE IF NOT EXISTS feedback (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, "
                   "message_id INTEGER NOT NULL, thumb TEXT, rating INTEGER, comment TEXT, updated_at REAL, "
                   "UNIQUE (user_id, message_id))")


def minimal_app(db_path: str):
    """One route, one SQLite upsert per request: the floor the real endpoint is measured against."""
    from flask import Flask, abort, jsonify, request

    app = Flask("minimal_feedback")
    local = threading.local()

    def conn() -> sqlite3.Connection:
        c = getattr(local, "conn", None)
        if c is None:
            c = local.conn = sqlite3.connect(db_path, timeout=15, check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
            c.execute("PRAGMA busy_timeout=15000")
        return c

    with sqlite3.connect(db_path) as c:
        c.execute(_MINIMAL_SCHEMA)

    @app.post("/feedback/<int:user_id>/<int:message_id>")
    def feedback(user_id: int, message_id: int):
        data = request.get_json(silent=True)
        if not isinstance(data, dict):
            abort(400)
        c = conn()
        c.execute("INSERT INTO feedback (user_id, message_id, thumb, rating, comment, updated_at) "
                  "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, message_id) DO UPDATE SET "
                  "thumb = excluded.thumb, rating = excluded.rating, comment = excluded.comment, "
                  "updated_at = excluded.updated_at",
                  (user_id, message_id, data.get("thumb"), data.get("rating"), data.get("comment"), time.time()))
        c.commit()
        return jsonify(feedback=data, message_id=message_id)

    return app


def serve_minimal(port: int, db_path: str, workers: int, threads: int) -> None:
    """Run the minimal app under gunicorn with the production server's settings."""
    from gunicorn.app.base import BaseApplication

    from webapp.cli.processes import gunicorn_settings

    app = minimal_app(db_path)

    class _Server(BaseApplication):
        def load_config(self) -> None:
            for key, value in gunicorn_settings("127.0.0.1", port, workers, threads).items():
                self.cfg.set(key, value)

        def load(self):
            return app

    sys.argv = sys.argv[:1]
    _Server().run()


class MinimalServer:
    def __init__(self, folder: Path, workers: int, threads: int) -> None:
        from tests.support.live_server import free_port

        self.port = free_port()
        self.db_path = folder / "minimal.db"
        self.log_path = folder / "minimal-server.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-minimal", str(self.port), str(self.db_path),
                                      "--workers", str(workers), "--threads", str(threads)],
                                     cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("POST", "/feedback/0/0", body=b"{}", headers={"Content-Type": "application/json"})
                c.getresponse().read()
                c.close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("minimal server did not start:\n" + self.log_path.read_text(errors="replace"))

    def stop(self) -> None:
        from tests.support.live_server import stop_process

        stop_process(self.proc)
        self._log.close()


def raw_sqlite_upserts(folder: Path, seconds: float = 2.0) -> float:
    """Upserts/s of one thread writing to SQLite directly (WAL, synchronous=NORMAL, commit each)."""
    c = sqlite3.connect(folder / "raw.db")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute(_MINIMAL_SCHEMA)
    n, rng, end = 0, random.Random(0), time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        c.execute("INSERT INTO feedback (user_id, message_id, thumb, rating, comment, updated_at) VALUES "
                  "(?, ?, 'up', 3, 'x', ?) ON CONFLICT (user_id, message_id) DO UPDATE SET rating = excluded.rating",
                  (rng.randrange(32), rng.randrange(2000), time.time()))
        c.commit()
        n += 1
    rate = n / (time.perf_counter() - start)
    c.close()
    return rate


# ---------------------------------------------------------------------------- clients

class Client(threading.Thread):
    """One user on one keep-alive connection, rating its own answers as fast as answered."""

    def __init__(self, port: int, path_of, message_ids: list[int], seed: int, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.port, self.path_of, self.message_ids = port, path_of, message_ids
        self.rng = random.Random(seed)
        self.headers = {"Content-Type": "application/json", **headers}
        self.go = threading.Event()
        self.deadline = 0.0
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.last_accepted: dict[int, dict] = {}  # message id -> body of the last 200
        self.seq = 0
        self.errors: list[str] = []
        self.done = threading.Event()

    def keep_cookie(self, resp: http.client.HTTPResponse) -> None:
        """Send back the session cookie the server last set, as a browser does."""
        for value in resp.headers.get_all("Set-Cookie") or ():
            if value.startswith("session=") and "Cookie" in self.headers:
                self.headers["Cookie"] = value.split(";", 1)[0]

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while True:
            self.go.wait()
            self.go.clear()
            if self.deadline == 0:
                break
            conn.close()  # a fresh connection per period: the server closes idle keep-alive ones
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            while time.perf_counter() < self.deadline:
                mid = self.rng.choice(self.message_ids)
                self.seq += 1
                body = {"thumb": self.rng.choice(("up", "down")), "rating": self.rng.randint(1, 5),
                        "comment": f"c{self.seq}"}
                raw = json.dumps(body)
                t0 = time.perf_counter()
                try:
                    conn.request("POST", self.path_of(mid), body=raw, headers=self.headers)
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                    self.keep_cookie(resp)
                except (OSError, http.client.HTTPException) as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                    status = 0
                self.latencies.append(time.perf_counter() - t0)
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if status == 200:
                    self.last_accepted[mid] = body
            self.done.set()
        conn.close()


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its children (gunicorn workers)."""
    import psutil

    total = 0.0
    try:
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass
    return total


def run_period(clients: list[Client], seconds: float, server_pid: int) -> dict:
    """One measured period. Besides rates and latencies: CPU ms per accepted request of the
    server (its process tree) and of the load generator (this process): a cost figure that
    does not depend on what else the machine's cores are doing."""
    before = [len(c.latencies) for c in clients]
    before_status = [dict(c.statuses) for c in clients]
    cpu_server, cpu_client = process_tree_cpu(server_pid), time.process_time()
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    for c in clients:
        c.done.clear()
        c.deadline = start + seconds
        c.go.set()
    for c in clients:
        c.done.wait()
    elapsed = time.perf_counter() - start
    cpu_server, cpu_client = process_tree_cpu(server_pid) - cpu_server, time.process_time() - cpu_client
    lat = sorted(x for c, b in zip(clients, before) for x in c.latencies[b:])
    statuses: dict[int, int] = {}
    for c, b in zip(clients, before_status):
        for code, n in c.statuses.items():
            statuses[code] = statuses.get(code, 0) + n - b.get(code, 0)
    ok = statuses.get(200, 0)
    return {"requests": len(lat), "accepted": ok, "seconds": round(elapsed, 2),
            "requests_per_s": round(ok / elapsed, 1), "p50_ms": round(1000 * percentile(lat, 50), 2),
            "p99_ms": round(1000 * percentile(lat, 99), 2), "statuses": {str(k): v for k, v in statuses.items()},
            "server_cpu_ms_per_request": round(1000 * cpu_server / max(1, ok), 3),
            "client_cpu_ms_per_request": round(1000 * cpu_client / max(1, ok), 3),
            "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def stop_clients(clients: list[Client]) -> None:
    for c in clients:
        c.deadline = 0
        c.go.set()
    for c in clients:
        c.join(5)


# ---------------------------------------------------------------------------- our server

def open_session(port: int) -> tuple[int, str, str]:
    """(user id, session cookie, CSRF token) of a new anonymous visitor."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/api/session")
    resp = conn.getresponse()
    data = json.loads(resp.read())
    cookie = next(v.split(";", 1)[0] for k, v in resp.getheaders() if k.lower() == "set-cookie"
                  and v.startswith("session="))
    conn.close()
    return data["user_id"], cookie, data["csrf_token"]


def create_answers(app, user_ids: list[int], per_user: int) -> dict[int, list[int]]:
    """One conversation per user with ``per_user`` question/answer pairs; answer ids by user."""
    from webapp.core.extensions import db
    from webapp.core.models import Conversation, Message

    out: dict[int, list[int]] = {}
    with app.app_context():
        for uid in user_ids:
            conv = Conversation(user_id=uid, title="ratings")
            db.session.add(conv)
            db.session.flush()
            answers = []
            for i in range(per_user):
                q = Message(conversation_id=conv.id, role="user", content=f"question {i}")
                db.session.add(q)
                db.session.flush()
                a = Message(conversation_id=conv.id, role="assistant", content=f"answer {i}", parent_id=q.id)
                db.session.add(a)
                answers.append(a)
            db.session.flush()
            out[uid] = [a.id for a in answers]
        db.session.commit()
        db.session.remove()
    return out


def verify(app, clients: list[Client], user_of: dict[int, int]) -> dict:
    """Every accepted write stored exactly once, holding the last accepted value."""
    from webapp.core.extensions import db
    from webapp.core.models import Feedback

    with app.app_context():
        rows = db.session.execute(db.select(Feedback.user_id, Feedback.message_id, Feedback.thumb, Feedback.rating,
                                            Feedback.comment)).all()
        db.session.remove()
    count: dict[tuple[int, int], int] = {}
    stored: dict[tuple[int, int], tuple] = {}
    for uid, mid, thumb, rating, comment in rows:
        count[(uid, mid)] = count.get((uid, mid), 0) + 1
        stored[(uid, mid)] = (thumb, rating, comment)
    expected = {(user_of[id(c)], mid): (b["thumb"], b["rating"], b["comment"])
                for c in clients for mid, b in c.last_accepted.items()}
    missing = [k for k in expected if k not in stored]
    duplicated = [k for k, n in count.items() if n > 1]
    wrong = [k for k, v in expected.items() if k in stored and stored[k] != v]
    unexpected = [k for k in stored if k not in expected]
    return {"answers_rated": len(expected), "rows": len(rows), "missing": len(missing), "duplicated": len(duplicated),
            "wrong_value": len(wrong), "unexpected": len(unexpected),
            "ok": not (missing or duplicated or wrong or unexpected)}


def summarise(periods: list[dict]) -> dict:
    return {"requests_per_s": statistics.median(p["requests_per_s"] for p in periods),
            "p50_ms": statistics.median(p["p50_ms"] for p in periods),
            "p99_ms": statistics.median(p["p99_ms"] for p in periods),
            "server_cpu_ms_per_request": statistics.median(p["server_cpu_ms_per_request"] for p in periods),
            "periods": periods}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--answers", type=int, default=50, help="pre-created answers per client")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of one measured period")
    ap.add_argument("--repeats", type=int, default=3, help="measured periods per server (alternating)")
    ap.add_argument("--workers", type=int, default=None, help="gunicorn workers (default: the serve default)")
    ap.add_argument("--threads", type=int, default=None, help="gunicorn threads (default: the serve default)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    ap.add_argument("--serve-minimal", nargs=2, metavar=("PORT", "DB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    from webapp.cli.processes import SERVE_DEFAULTS

    workers = args.workers or SERVE_DEFAULTS["workers"]
    threads = args.threads or SERVE_DEFAULTS["threads"]
    if args.serve_minimal:
        serve_minimal(int(args.serve_minimal[0]), args.serve_minimal[1], workers, threads)
        return

    from tests.support.app import make_app, register_model
    from tests.support.live_server import LiveServer
    from tests.support.models import cached_model

    folder = Path(tempfile.mkdtemp(prefix="bench-feedback-"))
    instance = folder / "instance"
    app = make_app(instance)
    register_model(app, cached_model("micro"))  # no answer is generated: the model only has to exist
    env = {"RLHF_RATELIMIT_ENABLED": "0", "RLHF_DEVICE": "cpu", "RLHF_EMBEDDED_PRESET": "micro"}
    server_args = ["--workers", str(workers), "--threads", str(threads)]
    server = LiveServer(instance, env=env, args=server_args)
    minimal = None if args.no_baseline else MinimalServer(folder, workers, threads)
    ours: list[Client] = []
    base: list[Client] = []
    try:
        sessions = [open_session(server.port) for _ in range(args.clients)]
        answers = create_answers(app, [s[0] for s in sessions], args.answers)
        user_of: dict[int, int] = {}
        for i, (uid, cookie, csrf) in enumerate(sessions):
            c = Client(server.port, lambda mid: f"/api/messages/{mid}/feedback", answers[uid], seed=i,
                       headers={"Cookie": cookie, "X-CSRFToken": csrf})
            user_of[id(c)] = uid
            ours.append(c)
        if minimal is not None:
            for i in range(args.clients):
                uid = 10_000 + i
                base.append(Client(minimal.port, lambda mid, uid=uid: f"/feedback/{uid}/{mid}",
                                   list(range(i * args.answers, (i + 1) * args.answers)), seed=1000 + i, headers={}))
        for c in ours + base:
            c.start()
        run_period(ours, min(3.0, args.seconds), server.proc.pid)  # warm-up (connections, caches); not counted
        if base:
            run_period(base, min(3.0, args.seconds), minimal.proc.pid)
        ours_periods, base_periods = [], []
        for i in range(args.repeats):
            ours_periods.append(run_period(ours, args.seconds, server.proc.pid))
            print(f"period {i + 1}: ours {ours_periods[-1]}", flush=True)
            if base:
                base_periods.append(run_period(base, args.seconds, minimal.proc.pid))
                print(f"period {i + 1}: baseline {base_periods[-1]}", flush=True)
    finally:
        stop_clients(ours + base)
        server.stop()
        if minimal is not None:
            minimal.stop()
    check = verify(app, ours, user_of)
    errors = sorted({e for c in ours for e in c.errors})[:5]
    result = {"clients": args.clients, "answers_per_client": args.answers, "seconds": args.seconds,
              "repeats": args.repeats, "gunicorn": {"workers": workers, "threads": threads},
              "ours": summarise(ours_periods), "verification": check, "client_errors": errors,
              "raw_sqlite_upserts_per_s": round(raw_sqlite_upserts(folder), 1),
              "target": {"requests_per_s": TARGET_RPS, "p99_ms": TARGET_P99_MS}}
    if base_periods:
        result["baseline"] = summarise(base_periods)
        result["ratio"] = round(result["ours"]["requests_per_s"] / result["baseline"]["requests_per_s"], 3)
    result["met"] = (result["ours"]["requests_per_s"] >= TARGET_RPS and result["ours"]["p99_ms"] <= TARGET_P99_MS
                     and check["ok"])
    o = result["ours"]
    print(f"ours: {o['requests_per_s']:.0f} req/s, p50 {o['p50_ms']:.1f} ms, p99 {o['p99_ms']:.1f} ms, "
          f"server CPU {o['server_cpu_ms_per_request']:.2f} ms/request "
          f"(median of {args.repeats} x {args.seconds:.0f} s, {args.clients} clients, "
          f"gunicorn {workers} worker(s) x {threads} threads)")
    if "baseline" in result:
        b = result["baseline"]
        print(f"baseline (minimal Flask + one SQLite upsert): {b['requests_per_s']:.0f} req/s, "
              f"p50 {b['p50_ms']:.1f} ms, "
              f"p99 {b['p99_ms']:.1f} ms, server CPU {b['server_cpu_ms_per_request']:.2f} ms/request; "
              f"ratio ours/baseline {result['ratio']:.2f}")
    print(f"raw SQLite upserts, one thread: {result['raw_sqlite_upserts_per_s']:.0f}/s")
    print(f"database check: {check}")
    print(f"target >= {TARGET_RPS:.0f} req/s and p99 <= {TARGET_P99_MS:.0f} ms: "
          f"{'met' if result['met'] else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
