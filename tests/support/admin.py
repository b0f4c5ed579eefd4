"""An app with versions to manage and an admin signed in: what the admin tests share."""
from __future__ import annotations

import re

from tests.support.app import make_app, register_model
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import ModelVersion

PASSWORD = "correct horse"


def admin_setup(tmp_path, micro_model_dir):
    """An app with three versions (active v1-base, candidate v2-ppo its child, failed v3-ppo) and the admin root."""
    inst = tmp_path / "instance"
    app = make_app(inst, RLHF_AB_MIN_SAMPLE=5)
    register_model(app, micro_model_dir)
    register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    register_model(app, micro_model_dir, name="v3-ppo", status="failed")
    with app.app_context():
        db.session.get(ModelVersion, 2).parent_id = 1
        db.session.commit()
        set_admin_password("root", PASSWORD)
    return app, inst


def login(app, username="root", password=PASSWORD):
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    resp = client.post("/admin/login", data={"username": username, "password": password, "csrf_token": token})
    if resp.status_code == 302:  # signed in: a new CSRF token (the login page's no longer works)
        token = client.get("/api/session").get_json()["csrf_token"]
    return client, token, resp


class Admin:
    def __init__(self, app):
        self.client, self.token, resp = login(app)
        assert resp.status_code == 302

    def get(self, url):
        return self.client.get(url)

    def post(self, url, body=None, method="post"):
        return getattr(self.client, method)(url, json=body, headers={"X-CSRFToken": self.token})


def versions(app):
    with app.app_context():
        return {v.name: v.status for v in db.session.scalars(db.select(ModelVersion))}
