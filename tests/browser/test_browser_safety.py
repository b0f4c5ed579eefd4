"""The output rail in a real Chromium against the production server: a blocked answer never
appears on the page, not even for a moment while it streams; the refusal replaces it."""
from __future__ import annotations

import pytest

from tests.support.accessibility import assert_accessible
from tests.support.app import make_app
from tests.support.browser_checks import admin_login
from tests.support.live_server import live_instance
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Message, RailIntervention, RailRule

pytestmark = pytest.mark.browser

REFUSAL = "REFUSED BY THE RAIL."
PASSWORD = "safety-admin-pass"


@pytest.fixture(scope="module")
def rail_server(tmp_path_factory, micro_model_dir):
    def prepare(app):  # every lower-case letter is blocked: the micro model writes some in every answer
        db.session.add(RailRule(kind="pattern", value="[a-z]"))
        db.session.commit()
        set_admin_password("root", PASSWORD)

    with live_instance(tmp_path_factory.mktemp("browser-rail") / "instance", micro_model_dir, prepare,
                       env={"RLHF_RAIL_REFUSAL_TEXT": REFUSAL, "RLHF_EMBEDDED_PRESET": "micro"}) as live:
        yield live.server, live.instance


def test_a_blocked_answer_never_appears_in_the_page(browser, rail_server):
    server, instance = rail_server
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("body.ready")
    # every text any answer bubble ever shows, as it changes
    page.evaluate("""() => {
        window.__shown = [];
        const note = () => document.querySelectorAll('#messages .assistant-message .content')
            .forEach((el) => window.__shown.push(el.textContent));
        new MutationObserver(note).observe(document.getElementById('messages'),
            {subtree: true, childList: true, characterData: true});
    }""")
    # The micro model now and then ends an answer before its first token (greedy, it always does):
    # an empty answer has nothing to block, so ask again until one has text.
    for asked in range(10):
        page.fill("#composer-input", "How do I cook rice?")
        page.keyboard.press("Enter")
        page.locator(".assistant-message:not(.pending) .thumb-up").nth(asked).wait_for()
        page.locator(".streaming").first.wait_for(state="detached")
        if page.locator(".assistant-message .content").nth(asked).inner_text().strip():
            break
    shown = page.evaluate("window.__shown")
    assert shown and all(not any("a" <= c <= "z" for c in text) for text in shown), shown
    assert page.locator(".assistant-message .content").last.inner_text().strip() == REFUSAL
    page.reload()
    page.wait_for_selector("body.ready")
    page.locator(".assistant-message .content").nth(asked).wait_for()
    assert page.locator(".assistant-message .content").last.inner_text().strip() == REFUSAL
    context.close()
    assert errors == []
    app = make_app(instance)
    with app.app_context():
        answers = db.session.scalars(db.select(Message).filter_by(role="assistant").order_by(Message.id)).all()
        assert [a.content for a in answers[:-1]] == [""] * asked
        answer = answers[-1]
        row = db.session.scalars(db.select(RailIntervention)).one()
        assert answer.content == REFUSAL and row.message_id == answer.id and row.reason == "pattern: [a-z]"
        assert any("a" <= c <= "z" for c in row.blocked_text)  # what the model wrote, for admins


@pytest.mark.parametrize("viewport", [{"width": 1300, "height": 900}, {"width": 390, "height": 844}],
                         ids=["desktop", "phone"])
def test_safety_page_is_accessible_and_its_forms_work(browser, rail_server, viewport):
    server, _ = rail_server
    context, page, errors, csp, _ = admin_login(browser, server.url, PASSWORD, viewport)
    page.goto(server.url + "/admin/safety/")
    page.wait_for_selector("main h1")
    assert_accessible(page, f"safety page {viewport}")
    assert page.evaluate("document.scrollingElement.scrollWidth") <= viewport["width"]
    # a bad pattern: the page says why (400), nothing is added
    page.select_option("[data-testid=rail-add] select[name=kind]", "pattern")
    page.fill("[data-testid=rail-add] input[name=value]", "(unclosed")
    page.click("[data-testid=rail-add] button[type=submit]")
    assert "Not a valid regular expression" in page.locator("[data-testid=rail-error]").inner_text()
    assert_accessible(page, f"safety page with an error {viewport}")
    phrase = f"blocked words {viewport['width']}"
    page.select_option("[data-testid=rail-add] select[name=kind]", "phrase")
    page.fill("[data-testid=rail-add] input[name=value]", phrase)
    page.click("[data-testid=rail-add] button[type=submit]")
    page.wait_for_selector(f"[data-testid=rail-rules] code:text-is('{phrase}')")
    assert page.locator("[data-testid=rail-interventions] tr[data-intervention]").count() >= 1
    context.close()
    assert errors == [] and csp == [], (errors, csp)
