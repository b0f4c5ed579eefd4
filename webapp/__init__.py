"""The Flask layer: HTTP API, pages, CLI, scheduler wiring and A/B routing.

``create_app(config=None)`` is the app factory; ``flask --app webapp <command>`` finds it.
"""
from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from flask import Flask  # noqa: E402

from webapp.core.settings import ASSETS, build_config  # noqa: E402


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build the app. ``config`` overrides every other source (see webapp/core/settings/). The
    database is brought to the code's schema revision on the way (webapp/core/schema_revision.py)."""
    cfg = build_config(config)
    app = Flask(__name__, instance_path=cfg["INSTANCE_DIR"], template_folder=str(ASSETS / "templates"),
                static_folder=str(ASSETS / "static"))
    app.config.update(cfg)
    from webapp.core.private_files import secure_instance

    secure_instance(app.config)  # owner only: the instance folder, its database, secret key and backups
    if cfg["RLHF_TRUSTED_PROXIES"]:  # the client address (and scheme) as the proxies in front saw it
        from werkzeug.middleware.proxy_fix import ProxyFix

        proxies = int(cfg["RLHF_TRUSTED_PROXIES"])
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)  # type: ignore[method-assign]

    from webapp.core.database import init_database
    from webapp.core.extensions import csrf, limiter, login_manager

    init_database(app)
    from webapp.core.schema_revision import init_migrations, prepare_schema

    init_migrations(app)
    csrf.init_app(app)
    login_manager.init_app(app)
    login_manager.login_view = "admin_auth.login"
    limiter.init_app(app)

    from webapp import cli
    from webapp.admin import auth as admin_auth
    from webapp.admin import json_api as admin_json_api
    from webapp.admin import pages as admin_pages
    from webapp.chat import account as account_api
    from webapp.chat import pages
    from webapp.chat import routes as chat_routes
    from webapp.chat import session as session_api
    from webapp.core import errors, identity, security
    from webapp.core.validation import IdConverter
    from webapp.openai_api import keys_admin
    from webapp.openai_api import routes as openai_routes
    from webapp.safety import pages as safety_pages

    identity.init_app(app)
    errors.init_app(app)
    security.init_app(app)
    app.url_map.converters["int"] = IdConverter  # before any route is added
    for blueprint in (session_api.bp, chat_routes.bp, account_api.bp, pages.bp, admin_auth.bp, admin_pages.bp,
                      admin_json_api.bp, safety_pages.bp, keys_admin.bp):
        app.register_blueprint(blueprint)
    openai_routes.init_app(app)  # the OpenAI-compatible API: bearer keys, no CSRF, errors in OpenAI's shape
    cli.init_app(app)

    prepare_schema(app)
    return app
