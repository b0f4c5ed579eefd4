"""Apps on temporary instance folders, and the clients and commands tests drive them with."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from webapp.core.settings import ALL_SETTINGS

# Settings from the developer's shell must not leak into tests.
SETTING_ENV_KEYS = ("RLHF_INSTANCE_DIR",) + tuple(env for spec in ALL_SETTINGS for env in spec.envs)


def make_app(instance: Path, **overrides):
    from webapp import create_app

    # Tests play many visitors from one address (127.0.0.1): the limit on new identities per address
    # is off unless a test turns it on (tests/test_identity_limit.py does).
    config = {"INSTANCE_DIR": str(instance), "TESTING": True, "RLHF_EMBEDDED_PRESET": "micro",
              "RLHF_AUTO_INIT_MODEL": False, "RLHF_NEW_IDENTITIES_PER_HOUR": 0}
    config.update(overrides)
    return create_app(config)


def register_model(app, model_dir: Path, name: str = "v1-base", status: str = "active"):
    """Register an already built model directory as a version (copied into the store)."""
    from rlhf.models import registry
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion

    with app.app_context():
        name, path, _ = registry.write_version(
            app.config["MODEL_STORE"], "base", lambda tmp: shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
            and None, name=name)
        version = ModelVersion(name=name, path=str(path), kind="base", status=status)
        db.session.add(version)
        db.session.commit()
        return version.id


DATABASES = ("sqlite", "postgresql")


def database_url_for(request, backend: str) -> str | None:
    """The URL for ``backend``: None (SQLite in the instance folder) or a new PostgreSQL database.

    A test module runs its data-layer tests on both databases by overriding ``database_url``::

        @pytest.fixture(params=DATABASES)
        def database_url(request):
            return database_url_for(request, request.param)
    """
    return request.getfixturevalue("postgres_url") if backend == "postgresql" else None


@contextlib.contextmanager
def route_sweep_app(tmp_path_factory, request, name: str, micro_model_dir: Path):
    """A module-scoped app for the modules that call every route (fuzz, authorization matrix):
    the shell's settings cleared, every rate limit out of the way, starting a training run
    stubbed (no child process), the micro model active, on ``RLHF_TEST_DATABASE`` (a PostgreSQL
    database of its own, or SQLite in the instance folder). Torn down on exit."""
    from types import SimpleNamespace

    from webapp.core.extensions import db

    mp = pytest.MonkeyPatch()
    for key in SETTING_ENV_KEYS:
        mp.delenv(key, raising=False)
    for where in ("webapp.admin.json_api", "webapp.training.jobs"):  # where it is called from
        mp.setattr(f"{where}.spawn_training", lambda *a, **k: (0, SimpleNamespace(pid=0)))
    overrides = {}
    if os.environ.get("RLHF_TEST_DATABASE", "sqlite") == "postgresql":
        overrides["SQLALCHEMY_DATABASE_URI"] = request.getfixturevalue("postgres_server").create_database()
    limit = "1000000 per minute"  # rate limits are not what these modules test
    application = make_app(tmp_path_factory.mktemp(name) / "instance", **overrides,
                           RLHF_MAX_NEW_TOKENS=4, RLHF_RETRAIN_MIN_FEEDBACK=0, RLHF_LOGIN_RATE_LIMIT=limit,
                           RLHF_LOGIN_RATE_LIMIT_PER_ADDRESS=limit,
                           RLHF_CHAT_RATE_LIMIT=limit, RLHF_CHAT_RATE_LIMIT_PER_ADDRESS=limit,
                           RLHF_FEEDBACK_RATE_LIMIT=limit, RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS=limit,
                           RLHF_ACCOUNT_RATE_LIMIT=limit, RLHF_API_RATE_LIMIT=limit)
    register_model(application, micro_model_dir)
    try:
        yield application
    finally:
        mp.undo()
        with application.app_context():
            db.session.remove()
            db.engine.dispose()


class ApiClient:
    def __init__(self, client):
        self.client = client
        data = client.get("/api/session").get_json()
        self.user_id = data["user_id"]
        self.csrf = data["csrf_token"]

    def get(self, url, **kw):
        return self.client.get(url, **kw)

    def _send(self, method, url, json=None, **kw):
        headers = {"X-CSRFToken": self.csrf, **kw.pop("headers", {})}
        resp = getattr(self.client, method)(url, json=json, headers=headers, **kw)
        data = resp.get_json(silent=True) if resp.is_json else None
        if isinstance(data, dict) and data.get("csrf_token"):  # signing in starts a new token, as the chat page does
            self.csrf = data["csrf_token"]
        return resp

    def post(self, url, json=None, **kw):
        return self._send("post", url, json, **kw)

    def delete(self, url, **kw):
        return self._send("delete", url, None, **kw)


def seeded_instance(tmp_path: Path, model_dir: Path, monkeypatch, env: dict[str, str],
                    conversations: int = 40) -> Path:
    """An instance folder with ``model_dir`` active and ``conversations`` rated conversations,
    named by RLHF_INSTANCE_DIR (with ``env``) for the `flask` commands a test runs."""
    from tests.support.feedback_factory import seed_feedback

    inst = tmp_path / "instance"
    app = make_app(inst)
    register_model(app, model_dir)
    seed_feedback(app, conversations)
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return inst


def sse_events(resp) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a streamed answer's server-sent events."""
    events = []
    for block in resp.get_data(as_text=True).split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def login_admin(client, username: str, password: str) -> None:
    """Sign ``client`` (a Flask test client) in on the admin login form, with its CSRF token."""
    page = client.get("/admin/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    resp = client.post("/admin/login", data={"username": username, "password": password, "csrf_token": csrf})
    assert resp.status_code in (302, 303), resp.data[:300]


def flask_cli(*args: str):
    """Run ``flask --app webapp ARGS`` in-process (the app from the environment's settings)."""
    from click.testing import CliRunner
    from flask.cli import FlaskGroup

    from webapp import create_app

    return CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), list(args))


def runs_and_versions(instance: Path) -> tuple[list[tuple], list[tuple]]:
    """(status, error) of every training run and (name, status) of every model version."""
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion, TrainingRun

    app = make_app(instance)
    with app.app_context():
        runs = [(r.status, r.error) for r in db.session.scalars(db.select(TrainingRun).order_by(TrainingRun.id))]
        versions = [(v.name, v.status) for v in db.session.scalars(db.select(ModelVersion).order_by(ModelVersion.id))]
    return runs, versions
