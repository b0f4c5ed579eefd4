"""Accounts in the chat UI (Chromium, desktop and a phone): create an account from the sidebar
(keeping this browser's conversations), sign in on another browser and see them, sign out; clear
messages for bad input; and, when an address made too many new identities, a readable message on
the chat page with a way to sign in. The server sits behind one trusted proxy
(RLHF_TRUSTED_PROXIES=1), so each browser context is its own client address (X-Forwarded-For)."""
from __future__ import annotations

import itertools

import pytest
import requests
from playwright.sync_api import expect

from tests.support.accessibility import assert_accessible
from tests.support.browser_checks import watch_csp
from tests.support.live_server import live_instance
from webapp.core.extensions import db
from webapp.core.models import Conversation, User

pytestmark = pytest.mark.browser

DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
PASSWORD = "correct horse battery"
LIMIT = 3
_addresses = itertools.count(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory, micro_model_dir):
    env = {"RLHF_TRUSTED_PROXIES": "1", "RLHF_NEW_IDENTITIES_PER_HOUR": str(LIMIT)}
    with live_instance(tmp_path_factory.mktemp("accounts") / "instance", micro_model_dir, env=env) as live:
        yield live.server, live.app


@pytest.fixture
def open_chat(browser, server):
    """A fresh browser (its own client address) on the chat page; no page errors, no CSP violations."""
    opened = []

    def opener(size: str, address: str | None = None, ready: bool = True):
        address = address or f"198.51.100.{next(_addresses)}"
        options = {"viewport": PHONE, "is_mobile": True, "has_touch": True} if size == "phone" else \
            {"viewport": DESKTOP}
        context = browser.new_context(reduced_motion="reduce", extra_http_headers={"X-Forwarded-For": address},
                                      **options)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        opened.append((context, errors, watch_csp(page)))
        page.goto(server[0].url + "/")
        page.wait_for_selector("body.ready")
        return page

    yield opener
    for context, _, _ in opened:
        context.close()
    for _, errors, csp in opened:
        assert errors == [] and csp == [], (errors, csp)


def account_section(page, size: str):
    """The sidebar's account section, in reach (on a phone: the drawer opened)."""
    if size == "phone" and not page.locator("body.drawer-open").count():
        page.click("#menu-button")
    section = page.locator("#account")
    expect(section).to_be_visible()
    return section


def conversation_titles(page) -> list[str]:
    return page.locator("#conversation-list .conversation-link").all_inner_texts()


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_register_sign_in_elsewhere_and_sign_out(open_chat, server, size):
    live, app = server
    name = f"reader_{size}"
    page = open_chat(size)
    uid = page.evaluate("fetch('/api/session').then((r) => r.json()).then((d) => d.user_id)")
    with app.app_context():  # this browser's own conversation, from before it had an account
        db.session.add(Conversation(user_id=uid, title=f"Rice chat {size}"))
        db.session.commit()
    page.reload()
    page.wait_for_selector("body.ready")

    section = account_section(page, size)
    expect(section.locator("#account-status")).to_have_text("Not signed in")
    section.get_by_role("button", name="Create account").click()
    dialog = page.get_by_role("dialog", name="Create an account")
    expect(dialog).to_be_visible()
    assert_accessible(page, f"account dialog ({size})")
    box = dialog.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]
    dialog.get_by_label("Username").fill("no spaces allowed")
    dialog.get_by_label("Password").fill(PASSWORD)
    dialog.get_by_role("button", name="Create account").click()
    expect(dialog.get_by_role("alert")).to_contain_text("'username' must be 3-32 characters")
    dialog.get_by_label("Username").fill(name)
    dialog.get_by_role("button", name="Create account").click()
    expect(dialog).to_be_hidden()
    section = account_section(page, size)
    expect(section.locator("#account-status")).to_have_text(f"Signed in as {name}")
    expect(section.get_by_role("button", name="Sign out")).to_be_visible()
    expect(section.get_by_role("button", name="Sign in")).to_be_hidden()
    assert conversation_titles(page) == [f"Rice chat {size}"]  # kept: the same user, now with an account
    with app.app_context():
        user = db.session.get(User, uid)
        assert user.username == name and user.password_hash and user.password_hash != PASSWORD
    if size == "desktop":  # the page goes on writing with the CSRF token that registering started
        item = page.locator(".conversation-item").first
        item.hover()
        item.locator(".rename-conversation").click()
        item.locator(".rename-input").fill(f"Rice chat {size} renamed")
        item.locator(".rename-input").press("Enter")
        expect(item.locator(".conversation-link")).to_have_text(f"Rice chat {size} renamed")
        with app.app_context():
            assert db.session.scalars(db.select(Conversation.title).filter_by(user_id=uid)).all() == \
                [f"Rice chat {size} renamed"]
        item.locator(".rename-conversation").click()  # and back, for the other browser below
        item.locator(".rename-input").fill(f"Rice chat {size}")
        item.locator(".rename-input").press("Enter")
        expect(item.locator(".conversation-link")).to_have_text(f"Rice chat {size}")

    # another browser (another address): anonymous, with nothing, until it signs in
    other = open_chat(size)
    assert conversation_titles(other) == []
    account_section(other, size).get_by_role("button", name="Sign in").click()
    dialog = other.get_by_role("dialog", name="Sign in")
    dialog.get_by_label("Username").fill(name)
    dialog.get_by_label("Password").fill("not the password")
    dialog.get_by_role("button", name="Sign in").click()
    expect(dialog.get_by_role("alert")).to_have_text("Wrong username or password.")
    dialog.get_by_label("Password").fill(PASSWORD)
    # signing in reloads the page: wait for that reload, not for the old page (already ready)
    with other.expect_navigation():
        dialog.get_by_role("button", name="Sign in").click()
    other.wait_for_selector("body.ready")
    section = account_section(other, size)
    expect(section.locator("#account-status")).to_have_text(f"Signed in as {name}")
    expect(other.locator("#conversation-list .conversation-link")).to_have_text([f"Rice chat {size}"])
    assert_accessible(other, f"signed in ({size})")

    with other.expect_navigation():  # signing out reloads the page too
        section.get_by_role("button", name="Sign out").click()
    other.wait_for_selector("body.ready")
    section = account_section(other, size)
    expect(section.locator("#account-status")).to_have_text("Not signed in")
    assert conversation_titles(other) == []
    # signing out ended the account's session in the first browser too
    page.reload()
    page.wait_for_selector("body.ready")
    expect(account_section(page, size).locator("#account-status")).to_have_text("Not signed in")
    assert conversation_titles(page) == []


def test_too_many_new_identities_show_a_readable_message_and_sign_in_still_works(open_chat, server):
    live, app = server
    address = "203.0.113.99"
    # an account made elsewhere
    setup = requests.Session()
    token = setup.get(live.url + "/api/session", headers={"X-Forwarded-For": "203.0.113.1"}).json()["csrf_token"]
    made = setup.post(live.url + "/api/account/register", json={"username": "regular", "password": PASSWORD},
                      headers={"X-Forwarded-For": "203.0.113.1", "X-CSRFToken": token})
    assert made.status_code == 201, made.text
    for _ in range(LIMIT):  # the address's new identities for the hour, used up
        assert requests.get(live.url + "/api/session", headers={"X-Forwarded-For": address}).status_code == 200
    refused = requests.get(live.url + "/api/session", headers={"X-Forwarded-For": address})
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0

    page = open_chat("desktop", address=address)
    problem = page.locator("#session-problem")
    expect(problem).to_be_visible()
    expect(problem).to_contain_text("Too many new visitors from your network address")
    expect(problem).to_contain_text("Sign in to your account, or try again in")
    expect(page.locator("#toast")).to_be_hidden()
    assert_accessible(page, "identity limit message")
    problem.get_by_role("button", name="Sign in").click()
    dialog = page.get_by_role("dialog", name="Sign in")
    dialog.get_by_label("Username").fill("regular")
    dialog.get_by_label("Password").fill(PASSWORD)
    with page.expect_navigation():
        dialog.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("body.ready")
    expect(page.locator("#account-status")).to_have_text("Signed in as regular")
    expect(page.locator("#session-problem")).to_be_hidden()
