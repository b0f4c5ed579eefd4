"""Fixtures of the chat page's browser tests on a module's own live server: each module that uses
them defines its ``chat_server`` (tests/support/live_server.py: ``chat_server_fixture``)."""
from __future__ import annotations

import pytest

from tests.browser.test_browser_chat_features import DESKTOP
from tests.support.app import make_app
from tests.support.browser_checks import watch_csp
from webapp.core.extensions import db


@pytest.fixture(scope="module")
def store(chat_server):
    """An app on the live server's database, for seeding and checking rows."""
    app = make_app(chat_server[1])
    yield app
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


@pytest.fixture
def open_page(browser, chat_server):
    """Opens the chat page in a fresh context (a new visitor) with the given options; fails the
    test on any page error or CSP violation of any page it opened."""
    opened = []

    def opener(viewport=None, **options):
        context = browser.new_context(viewport=viewport or DESKTOP, reduced_motion="reduce", **options)
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        opened.append((context, errors, watch_csp(pg)))
        pg.goto(chat_server[0].url + "/")
        pg.wait_for_selector("body.ready")
        return pg

    yield opener
    for context, _, _ in opened:
        context.close()
    for _, errors, csp_violations in opened:
        assert errors == [], errors
        assert csp_violations == [], csp_violations
