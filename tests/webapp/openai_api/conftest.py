"""The in-process /v1 API of the micro model with its keys (``v1``), shared by the /v1 tests."""
from __future__ import annotations

import pytest

from tests.support.app import make_app, register_model
from tests.webapp.openai_api.test_v1_api import V1
from webapp.core.extensions import db
from webapp.openai_api.keys import create_api_key


@pytest.fixture
def v1(tmp_path, micro_model_dir, database_url):
    """The micro model, and three keys: a front end that forwards user headers, a second key of the
    same front end, an SDK user's key. On RLHF_TEST_DATABASE (SQLite or PostgreSQL)."""
    database = {"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {}
    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=40, **database)
    register_model(app, micro_model_dir)
    with app.app_context():
        keys = {name: create_api_key(name, client, forwards)[1] for name, client, forwards in
                (("owui", "owui", True), ("owui-2", "owui", False), ("sdk", None, False))}
    yield V1(app, keys)
    with app.app_context():
        db.session.remove()
        db.engine.dispose()
