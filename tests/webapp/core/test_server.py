"""The README's run command, end to end: a fresh instance folder, the production server,
tables and base model created on first start, and the API answering."""
from __future__ import annotations

import requests

from tests.support.live_server import LiveServer


def test_fresh_instance_serves_after_building_its_model(tmp_path):
    server = LiveServer(tmp_path / "instance", env={"RLHF_EMBEDDED_PRESET": "micro"})
    try:
        s = requests.Session()
        data = s.get(server.url + "/api/session", timeout=10).json()
        assert data["user_id"] >= 1 and data["csrf_token"]
        assert "session" in s.cookies
        health = s.get(server.url + "/api/health", timeout=10).json()
        assert health == {"status": "ok"}  # the version's name is for admins (blind arms)
        log = server.log()
        assert "train" in log  # the build showed its progress
        assert (tmp_path / "instance" / "rlhf.db").is_file()
        assert (tmp_path / "instance" / "models" / "v1-base" / "config.json").is_file()
    finally:
        server.stop()
