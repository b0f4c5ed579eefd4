"""The scheduler's Open WebUI pull against a real HTTP server serving the recorded export: it
imports with the admin key, records its outcome like the other jobs, and records (never raises)
a wrong key, a server that is down and an answer that is not an export. It never follows a
redirect (the admin key would go with it), never reads more than its limit and never waits past
its deadline, however the server answers."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.app import make_app
from tests.webapp.training.test_openwebui_import import EXPORT, store_answers
from webapp.core.extensions import db
from webapp.core.models import Feedback
from webapp.core.settings import ConfigError, effective
from webapp.training import openwebui_pull, scheduler

ADMIN_KEY = "sk-owui-admin-0123456789"
# Open WebUI's own route (its admin feedback export), written out here rather than taken from
# the code under test, so a wrong path in the code fails these tests.
OPEN_WEBUI_EXPORT_PATH = "/api/v1/evaluations/feedbacks/all/export"


class FakeOpenWebUI:
    """Open WebUI's export endpoint (admin key only) on a loopback port; ``body`` is what it serves.
    ``redirect`` (a URL) answers 302 there instead; ``chunked`` sends the body without a length;
    ``drip`` sends it a few bytes at a time, that many seconds apart. ``seen`` records each request's
    path and Authorization header."""

    def __init__(self) -> None:
        self.body = EXPORT.read_bytes()
        self.requests: list[str] = []
        self.seen: list[tuple[str, str | None]] = []
        self.redirect: str | None = None
        self.chunked = False
        self.drip: float | None = None
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                outer.requests.append(self.path)
                outer.seen.append((self.path, self.headers.get("Authorization")))
                if outer.redirect:
                    self.send_response(302)
                    self.send_header("Location", outer.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path != OPEN_WEBUI_EXPORT_PATH:
                    return self._send(404, b'{"detail": "Not Found"}')
                if self.headers.get("Authorization") != f"Bearer {ADMIN_KEY}":
                    return self._send(401, b'{"detail": "Not authenticated"}')
                self._send(200, outer.body)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if outer.chunked or outer.drip:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not (outer.chunked or outer.drip):
                    self.wfile.write(body)
                    return
                step = 16 if outer.drip else 64 * 1024
                for start in range(0, len(body), step):
                    piece = body[start:start + step]
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.flush()
                    if outer.drip and outer.closing.wait(outer.drip):
                        return
                self.wfile.write(b"0\r\n\r\n")

            def handle(self) -> None:
                try:
                    super().handle()
                except OSError:  # the client hung up (as the pull does past its limit or deadline)
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def owui():
    server = FakeOpenWebUI()
    yield server
    server.stop()


def pull(app) -> dict:
    """Run the job as the scheduler runs it; its recorded outcome."""
    scheduler.run_job("openwebui_pull")
    return json.loads((Path(app.config["INSTANCE_DIR"]) / "scheduler.json").read_text())["last"]["openwebui_pull"]


def test_the_pull_imports_the_export_and_records_its_outcome(tmp_path, owui):
    app = make_app(tmp_path / "instance", RLHF_OPENWEBUI_URL=owui.url + "/", RLHF_OPENWEBUI_API_KEY=ADMIN_KEY,
                   RLHF_OPENWEBUI_PULL_INTERVAL_SECONDS=120)
    ids = store_answers(app)
    job = scheduler.build_scheduler(app).get_job("openwebui_pull")  # registered because the URL is set
    assert job is not None and job.trigger.interval.total_seconds() == 120

    outcome = pull(app)
    assert outcome["action"] == "imported", outcome
    assert outcome["reason"].startswith("14 records: 5 matched (5 new, 0 updated; 1 votes), 2 duplicate, 7 unmatched")
    assert owui.requests == [OPEN_WEBUI_EXPORT_PATH]
    with app.app_context():
        rows = {f.message_id: (f.thumb, f.updated_at) for f in db.session.scalars(db.select(Feedback))}
    assert rows[ids["a1"]][0] == "up" and len(rows) == 5

    outcome = pull(app)  # the same export again: nothing written
    assert outcome["action"] == "idle" and "5 matched (0 new, 0 updated; 0 votes)" in outcome["reason"]
    with app.app_context():
        assert {f.message_id: (f.thumb, f.updated_at) for f in db.session.scalars(db.select(Feedback))} == rows


def test_failures_are_recorded_and_the_scheduler_goes_on(tmp_path, owui):
    app = make_app(tmp_path / "instance", RLHF_OPENWEBUI_URL=owui.url, RLHF_OPENWEBUI_API_KEY="not-an-admin")
    scheduler.build_scheduler(app)
    outcome = pull(app)
    assert outcome["action"] == "error"
    assert f"{owui.url}{OPEN_WEBUI_EXPORT_PATH} answered HTTP 401" in outcome["reason"] and "admin" in outcome["reason"]
    assert "not-an-admin" not in outcome["reason"]

    app.config["RLHF_OPENWEBUI_API_KEY"] = ADMIN_KEY
    owui.body = b"<html>Open WebUI</html>"  # e.g. a login page in front of it
    outcome = pull(app)
    assert outcome["action"] == "error" and "answered with not JSON" in outcome["reason"]

    app.config["RLHF_OPENWEBUI_URL"] = owui.url.replace("http://", "http://admin:hunter2@")
    outcome = pull(app)  # credentials in the URL never reach the recorded outcome (nor the log)
    assert "hunter2" not in outcome["reason"] and "http://***@127.0.0.1" in outcome["reason"]

    owui.stop()
    outcome = pull(app)
    assert outcome["action"] == "error" and "could not fetch" in outcome["reason"]
    assert "hunter2" not in outcome["reason"]

    app.config["RLHF_OPENWEBUI_URL"] = None  # turned off while its job stays in the job store
    outcome = pull(app)
    assert outcome["action"] == "skip"


def test_the_settings(tmp_path):
    app = make_app(tmp_path / "instance")
    assert app.config["RLHF_OPENWEBUI_URL"] is None
    assert scheduler.build_scheduler(app).get_job("openwebui_pull") is None  # off by default
    app = make_app(tmp_path / "instance", RLHF_OPENWEBUI_URL="http://openwebui:8080", RLHF_OPENWEBUI_API_KEY=ADMIN_KEY)
    shown = {r["name"]: r["value"] for r in effective(app.config["RLHF_SETTINGS"], app.config["RLHF_SETTING_SOURCES"])}
    assert shown["openwebui_api_key"] == "********" and shown["openwebui_url"] == "http://openwebui:8080"
    with pytest.raises(ConfigError, match="RLHF_OPENWEBUI_URL='openwebui:8080'.*must be an http"):
        make_app(tmp_path / "instance", RLHF_OPENWEBUI_URL="openwebui:8080")


@pytest.fixture
def elsewhere():
    """A second server, another host as far as the pull can tell: it must never be asked anything."""
    server = FakeOpenWebUI()
    yield server
    server.stop()


def test_a_redirect_is_never_followed_and_the_key_never_leaves(tmp_path, owui, elsewhere):
    """urllib followed redirects to any host (keeping the Authorization header) and to ftp://."""
    app = make_app(tmp_path / "instance", RLHF_OPENWEBUI_URL=owui.url, RLHF_OPENWEBUI_API_KEY=ADMIN_KEY)
    store_answers(app)
    scheduler.build_scheduler(app)
    elsewhere.seen.clear()
    for target in (f"{elsewhere.url.replace('127.0.0.1', 'localhost')}{OPEN_WEBUI_EXPORT_PATH}",
                   "ftp://127.0.0.1/export.json", OPEN_WEBUI_EXPORT_PATH + "?again=1"):
        owui.redirect = target
        outcome = pull(app)
        assert outcome["action"] == "error", outcome
        assert "answered HTTP 302" in outcome["reason"] and "not followed" in outcome["reason"]
        assert ADMIN_KEY not in outcome["reason"]
    assert elsewhere.seen == []  # the other host never heard from the pull, with or without the key
    assert [auth for _, auth in owui.seen] == [f"Bearer {ADMIN_KEY}"] * 3  # one request each, to the set URL only
    with app.app_context():
        assert db.session.scalar(db.select(db.func.count(Feedback.id))) == 0


def test_an_export_over_the_limit_is_refused_without_reading_it_all(tmp_path, owui, monkeypatch):
    """The old pull read a body of any size whole (a 2 GiB answer took its memory from 0.5 to 4.6 GiB)."""
    monkeypatch.setattr(openwebui_pull, "MAX_EXPORT_BYTES", 256 * 1024)
    app = make_app(tmp_path / "instance", RLHF_OPENWEBUI_URL=owui.url, RLHF_OPENWEBUI_API_KEY=ADMIN_KEY)
    ids = store_answers(app)
    scheduler.build_scheduler(app)
    records = json.loads(EXPORT.read_bytes())
    padding = [{"id": f"pad-{i}", "type": "other", "pad": "x" * 1000} for i in range(400)]  # ~420 KB, valid
    owui.body = json.dumps(records + padding).encode()
    for chunked in (False, True):  # with a Content-Length over the limit, and with none at all
        owui.chunked = chunked
        outcome = pull(app)
        assert outcome["action"] == "error", outcome
        assert "over the limit of 262,144 bytes" in outcome["reason"]
    with app.app_context():
        assert db.session.scalar(db.select(db.func.count(Feedback.id))) == 0

    owui.body = json.dumps(records).encode()  # under the limit, sent in chunks: imported as usual
    outcome = pull(app)
    assert outcome["action"] == "imported", outcome
    with app.app_context():
        assert db.session.scalars(db.select(Feedback).filter_by(message_id=ids["a1"])).one().thumb == "up"


def test_a_slow_server_cannot_hold_the_pull_past_its_deadline(tmp_path, owui, monkeypatch):
    """The old timeout was per read: a server sending a little at a time held the job as long as it liked.
    Here the export would take about 25 s to arrive (16 bytes each 0.1 s); the deadline is 2 s."""
    monkeypatch.setattr(openwebui_pull, "FETCH_DEADLINE_SECONDS", 2.0)
    app = make_app(tmp_path / "instance", RLHF_OPENWEBUI_URL=owui.url, RLHF_OPENWEBUI_API_KEY=ADMIN_KEY)
    store_answers(app)
    scheduler.build_scheduler(app)
    owui.drip = 0.1
    assert len(owui.body) / 16 * 0.1 > 20
    outcome = pull(app)
    assert outcome["action"] == "error", outcome
    assert "no complete answer within 2 s" in outcome["reason"]
    with app.app_context():
        assert db.session.scalar(db.select(db.func.count(Feedback.id))) == 0
