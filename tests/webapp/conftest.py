"""The admin-side app of the admin and experiment-lifecycle tests: three versions and an admin account
(tests/support/admin.py); the app of a running experiment whose arms the blind-arms tests (of the chat
API and of the /v1 API) look for in every response."""
from __future__ import annotations

import pytest

from tests.support.admin import admin_setup
from tests.support.app import make_app, register_model
from tests.webapp.experiments.test_blind_arms import KEY, NO_LIMIT, PASSWORD, Admin
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db


@pytest.fixture
def setup(tmp_path, micro_model_dir):
    return admin_setup(tmp_path, micro_model_dir)


@pytest.fixture
def experiment_app(tmp_path, micro_model_dir):
    """v1-base (active) vs v2-ppo in a running 50/50 experiment, created by an admin through
    the admin API, as in production."""
    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=6, RLHF_CHAT_RATE_LIMIT=NO_LIMIT,
                   RLHF_CHAT_RATE_LIMIT_PER_ADDRESS=NO_LIMIT, RLHF_FEEDBACK_RATE_LIMIT=NO_LIMIT,
                   RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS=NO_LIMIT)
    register_model(app, micro_model_dir)
    variant = register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    with app.app_context():
        set_admin_password("root", PASSWORD)
    admin = Admin(app)
    resp = admin.post("/api/admin/experiments", {"key": KEY, "control_version_id": 1,
                                                 "variant_version_id": variant, "traffic_split": 0.5})
    assert resp.status_code == 201, resp.get_json()
    yield app
    with app.app_context():
        db.session.remove()
        db.engine.dispose()
