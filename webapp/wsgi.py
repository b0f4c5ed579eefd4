"""WSGI entry for any server: ``gunicorn 'webapp.wsgi:app'``. Builds the base model on first start.

Every worker imports this module, so it never upgrades the database schema by itself: a worker
on a database behind (or ahead of) the code refuses to start with the reason; run
``flask --app webapp db upgrade`` once, then start the workers.
"""
from __future__ import annotations

from . import create_app
from .core.schema_revision import schema_problem
from .core.settings import ConfigError

try:
    app = create_app({"RLHF_AUTO_UPGRADE": False})
except ConfigError as exc:  # a setting the app cannot use, or a published secret key: one line, no traceback
    raise SystemExit(f"Error: {exc.message}") from None
if schema_problem(app):
    raise SystemExit(f"Error: {schema_problem(app)}")
if app.config["RLHF_AUTO_INIT_MODEL"]:
    from rlhf.progress import StageBars
    from webapp.serving.versions import ensure_base_version

    with app.app_context(), StageBars() as bars:
        ensure_base_version(progress=bars)

if app.config["RLHF_SCHEDULER"]:
    from webapp.training.scheduler import start_background

    start_background(app)
