"""Shared fixtures: apps on temporary instance folders, micro and default embedded models."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from webapp.core.settings import ALL_SETTINGS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Built models are cached between test sessions (keyed by their spec) to keep local runs fast.
MODEL_CACHE = Path(os.environ.get("RLHF_TEST_MODEL_CACHE", ROOT / ".cache" / "test-models"))

# Settings from the developer's shell must not leak into tests.
_ENV_KEYS = ("RLHF_INSTANCE_DIR",) + tuple(env for spec in ALL_SETTINGS for env in spec.envs)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in _ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


def cached_model(preset: str) -> Path:
    """Build (once per spec) the embedded model of ``preset`` and return its directory."""
    from rlhf.models.embedded import build_embedded_model, spec_for

    spec = spec_for(preset)
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]
    target = MODEL_CACHE / f"{preset}-{key}"
    if not (target / "config.json").is_file():
        tmp = MODEL_CACHE / f".tmp-{preset}-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        metrics = build_embedded_model(tmp, spec)
        (tmp / "build_metrics.json").write_text(json.dumps(metrics))
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    return target


@pytest.fixture(scope="session")
def micro_model_dir() -> Path:
    return cached_model("micro")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real embedded model (about two minutes to build on 2 cores, once)."""
    return cached_model("default")


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium (Debian's package) driven by Playwright for the whole session."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium` (see README)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


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


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the whole session (see tests/postgres.py); skipped
    where PostgreSQL is not installed, a failure instead with RLHF_REQUIRE_POSTGRES=1 (CI)."""
    from tests.postgres import PostgresUnavailable, required, start_server

    try:
        server = start_server()
    except PostgresUnavailable as exc:
        if required():
            pytest.fail(f"PostgreSQL is required (RLHF_REQUIRE_POSTGRES=1) but unusable: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The SQLAlchemy URL of a new, empty PostgreSQL database."""
    return postgres_server.create_database()


DATABASES = ("sqlite", "postgresql")


def database_url_for(request, backend: str) -> str | None:
    """The URL for ``backend``: None (SQLite in the instance folder) or a new PostgreSQL database.

    A test module runs its data-layer tests on both databases by overriding ``database_url``::

        @pytest.fixture(params=DATABASES)
        def database_url(request):
            return database_url_for(request, request.param)
    """
    return request.getfixturevalue("postgres_url") if backend == "postgresql" else None


@pytest.fixture
def database_url(request) -> str | None:
    """The database of the ``app`` fixture: SQLite in the instance folder (None), or PostgreSQL
    for every test that uses ``app`` with ``RLHF_TEST_DATABASE=postgresql``."""
    return database_url_for(request, os.environ.get("RLHF_TEST_DATABASE", "sqlite"))


@pytest.fixture
def app(tmp_path, micro_model_dir, database_url):
    """An app on a fresh instance folder whose active version is the micro model."""
    overrides = {"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {}
    application = make_app(tmp_path / "instance", **overrides)
    register_model(application, micro_model_dir)
    yield application
    from webapp.core.extensions import db
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


@contextlib.contextmanager
def route_sweep_app(tmp_path_factory, request, name: str, micro_model_dir: Path):
    """A module-scoped app for the modules that call every route (fuzz, authorization matrix):
    the shell's settings cleared, every rate limit out of the way, starting a training run
    stubbed (no child process), the micro model active, on ``RLHF_TEST_DATABASE`` (a PostgreSQL
    database of its own, or SQLite in the instance folder). Torn down on exit."""
    from types import SimpleNamespace

    from webapp.core.extensions import db

    mp = pytest.MonkeyPatch()
    for key in _ENV_KEYS:
        mp.delenv(key, raising=False)
    for where in ("webapp.admin.api", "webapp.training.scheduler"):  # where it is called from
        mp.setattr(f"{where}.spawn_training", lambda *a, **k: (0, SimpleNamespace(pid=0)))
    overrides = {}
    if os.environ.get("RLHF_TEST_DATABASE", "sqlite") == "postgresql":
        overrides["SQLALCHEMY_DATABASE_URI"] = request.getfixturevalue("postgres_server").create_database()
    limit = "1000000 per minute"  # rate limits are not what these modules test
    application = make_app(tmp_path_factory.mktemp(name) / "instance", **overrides,
                           RLHF_MAX_NEW_TOKENS=4, RLHF_RETRAIN_MIN_FEEDBACK=0, RLHF_LOGIN_RATE_LIMIT=limit,
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


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def api(client):
    """A test client that has a session and sends its CSRF token on every state change."""
    return ApiClient(client)


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
    from tests.feedback_factory import seed_feedback

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
    import re

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
