"""Shared fixtures: apps on temporary instance folders, micro and default embedded models, a
browser, PostgreSQL. The helpers they use live in tests/support/."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # the README's command runs two test processes on a 2-core machine: one torch thread each (and in
    # the servers they start), since two processes' OpenMP threads on the same cores wait on each other
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.support.app import SETTING_ENV_KEYS, ApiClient, database_url_for, make_app, register_model  # noqa: E402
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.support.models import cached_model  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in SETTING_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="session")
def micro_model_dir() -> Path:
    return cached_model("micro")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real embedded model (about two minutes to build on 2 cores, once)."""
    return cached_model("default")


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


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the whole session (see tests/support/postgres.py); skipped
    where PostgreSQL is not installed, a failure instead with RLHF_REQUIRE_POSTGRES=1 (CI)."""
    from tests.support.postgres import PostgresUnavailable, required, start_server

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


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def api(client):
    """A test client that has a session and sends its CSRF token on every state change."""
    return ApiClient(client)
