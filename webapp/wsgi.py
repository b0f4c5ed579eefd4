"""WSGI entry for any server: ``gunicorn 'webapp.wsgi:app'``. Builds the base model on first start."""
from __future__ import annotations

from . import create_app

app = create_app()
if app.config["RLHF_AUTO_INIT_MODEL"]:
    from rlhf.progress import StageBars

    from webapp.serving.versions import ensure_base_version

    with app.app_context(), StageBars() as bars:
        ensure_base_version(progress=bars)

if app.config["RLHF_SCHEDULER"]:
    from webapp.training.scheduler import start_background

    start_background(app)
