"""The scheduler's Open WebUI pull against a real HTTP server serving the recorded export: it
imports with the admin key, records its outcome like the other jobs, and records (never raises)
a wrong key, a server that is down and an answer that is not an export."""
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
from webapp.training import scheduler
from webapp.training.openwebui_export import EXPORT_PATH

ADMIN_KEY = "sk-owui-admin-0123456789"


class FakeOpenWebUI:
    """Open WebUI's export endpoint (admin key only) on a loopback port; ``body`` is what it serves."""

    def __init__(self) -> None:
        self.body = EXPORT.read_bytes()
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                outer.requests.append(self.path)
                if self.path != EXPORT_PATH:
                    return self._send(404, b'{"detail": "Not Found"}')
                if self.headers.get("Authorization") != f"Bearer {ADMIN_KEY}":
                    return self._send(401, b'{"detail": "Not authenticated"}')
                self._send(200, outer.body)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
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
    assert owui.requests == [EXPORT_PATH]
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
    assert f"{owui.url}{EXPORT_PATH} answered HTTP 401" in outcome["reason"] and "admin" in outcome["reason"]
    assert "not-an-admin" not in outcome["reason"]

    app.config["RLHF_OPENWEBUI_API_KEY"] = ADMIN_KEY
    owui.body = b"<html>Open WebUI</html>"  # e.g. a login page in front of it
    outcome = pull(app)
    assert outcome["action"] == "error" and "answered with not JSON" in outcome["reason"]

    owui.stop()
    outcome = pull(app)
    assert outcome["action"] == "error" and "could not fetch" in outcome["reason"]

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
