"""Flagging an answer as harmful in a real Chromium, against the production server on the embedded
model: the flag button beside the thumbs opens a category menu (a keyboard radio group) with an
optional note; the answer then shows it is flagged, after a reload too; a failure is explained in
the menu; the flag can be removed; an admin finds it in the feedback browser (escaped, filtered);
on a phone every control of the menu is a 44 px tap target and nothing scrolls sideways. Every
page is watched for page errors and CSP violations."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from rlhf.data.criteria import FLAG_CATEGORIES
from tests.browser.test_browser_chat_features import DESKTOP, seed, shot, show
from tests.browser.test_browser_chat_mobile import PHONE, TAP_TARGETS
from tests.support.accessibility import assert_accessible
from tests.support.browser_checks import admin_login, assert_nothing_injected
from tests.support.live_server import chat_server_fixture
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Conversation, Flag, utcnow

pytestmark = pytest.mark.browser

chat_server = chat_server_fixture("browser-flags")

LABELS = dict(FLAG_CATEGORIES)
NOTE = "It used a <b>slur</b> & told me to <script>window.__xss=1</script> leave"


def flags_of(store, message_id: int) -> list[tuple]:
    with store.app_context():
        return [(f.category, f.note) for f in db.session.scalars(db.select(Flag).filter_by(message_id=message_id))]


def answer_node(page, message_id: int):
    return page.locator(f".assistant-message[data-id='{message_id}']")


def test_flag_an_answer_reload_admin_sees_it_then_unflag(browser, chat_server, open_page, store):
    page = open_page()
    ids = seed(store, page, [("How do I cook rice?", ["Rinse it, then simmer it."]),
                             ("And pasta?", ["Boil water, add salt."])], title="Flag me")
    first, second = ids["answers"][0][0], ids["answers"][1][0]
    show(page, ids["id"])
    node = answer_node(page, first)
    button = node.locator(".flag-btn")
    expect(button).to_have_attribute("aria-pressed", "false")
    expect(node.locator(".flag-view")).to_be_hidden()

    # keyboard: the menu opens on the first category, arrows move the choice, Escape cancels
    button.focus()
    page.keyboard.press("Enter")
    panel = node.locator(".flag-panel")
    expect(panel).to_be_visible()
    expect(button).to_have_attribute("aria-expanded", "true")
    choices = panel.locator(".flag-choice")
    expect(choices).to_have_count(len(FLAG_CATEGORIES))
    expect(choices.first).to_be_focused()
    assert_accessible(page, "flag menu open")
    shot(page, "flag-menu")
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    expect(button).to_be_focused()
    assert flags_of(store, first) == []

    # flag it: "Hate" by arrow key, a note, "Flag answer"
    page.keyboard.press("Enter")
    expect(choices.first).to_be_focused()
    page.keyboard.press("ArrowDown")
    hate = panel.locator(".flag-choice[data-value='hate']")
    expect(hate).to_be_focused()
    expect(hate).to_have_attribute("aria-checked", "true")
    panel.locator(".flag-note-input").fill(NOTE)
    panel.locator(".save-flag").click()
    expect(panel).to_be_hidden()
    view = node.locator(".flag-view")
    expect(view).to_be_visible()
    expect(view.locator(".flag-view-category")).to_have_text(LABELS["hate"])
    expect(view.locator(".flag-view-note")).to_have_text(NOTE)
    expect(button).to_have_attribute("aria-pressed", "true")
    expect(button).to_have_attribute("aria-label", f"Flagged as harmful: {LABELS['hate']}")
    expect(button).to_be_focused()
    assert flags_of(store, first) == [("hate", NOTE)]
    assert_nothing_injected(page, [], "flag note")
    shot(page, "flagged-answer")

    # change it in place: the menu opens on the current category and note
    button.click()
    expect(hate).to_have_attribute("aria-checked", "true")
    expect(panel.locator(".flag-note-input")).to_have_value(NOTE)
    expect(panel.locator(".remove-flag")).to_be_visible()
    panel.locator(".flag-choice[data-value='harassment']").click()
    panel.locator(".save-flag").click()
    expect(view.locator(".flag-view-category")).to_have_text(LABELS["harassment"])
    assert flags_of(store, first) == [("harassment", NOTE)]

    # the other answer is not flagged; after a reload the flag is still shown
    expect(answer_node(page, second).locator(".flag-view")).to_be_hidden()
    page.reload()
    page.wait_for_selector("body.ready")
    node = answer_node(page, first)
    expect(node.locator(".flag-view-category")).to_have_text(LABELS["harassment"])
    expect(node.locator(".flag-view-note")).to_have_text(NOTE)
    expect(node.locator(".flag-btn")).to_have_attribute("aria-pressed", "true")
    expect(answer_node(page, second).locator(".flag-btn")).to_have_attribute("aria-pressed", "false")

    # an admin finds it in the feedback browser, the note escaped, and filters to flagged answers
    with store.app_context():
        set_admin_password("root", "flag-admin-pass")
    context, admin, errors, csp, dialogs = admin_login(browser, chat_server[0].url, "flag-admin-pass", DESKTOP)
    try:
        admin.goto(chat_server[0].url + "/admin/feedback")
        admin.select_option("#f-flag", "harassment")
        admin.click("form.filters button[type=submit]")
        admin.wait_for_url(re.compile(r"flag=harassment"))
        row = admin.locator(f"tr[data-message-id='{first}']")
        expect(row).to_be_visible()
        expect(row.locator(".flag-badge")).to_have_text(LABELS["harassment"])
        expect(row.locator(".flag-note")).to_contain_text(NOTE)
        expect(admin.locator("tbody tr")).to_have_count(1)
        assert_nothing_injected(admin, dialogs, "feedback browser")
        admin.select_option("#f-flag", "hate")
        admin.click("form.filters button[type=submit]")
        admin.wait_for_url(re.compile(r"flag=hate"))
        expect(admin.locator("tbody")).to_contain_text("No feedback matches.")
        assert errors == [] and csp == []
    finally:
        context.close()

    # remove the flag
    node.locator(".flag-btn").click()
    node.locator(".remove-flag").click()
    expect(node.locator(".flag-view")).to_be_hidden()
    expect(node.locator(".flag-btn")).to_have_attribute("aria-pressed", "false")
    assert flags_of(store, first) == []


def test_a_failed_flag_is_explained_in_the_menu(open_page, store):
    page = open_page()
    ids = seed(store, page, [("How do I cook rice?", ["Rinse it, then simmer it."])], title="Gone soon")
    answer = ids["answers"][0][0]
    show(page, ids["id"])
    node = answer_node(page, answer)
    node.locator(".flag-btn").click()
    panel = node.locator(".flag-panel")
    panel.locator(".save-flag").click()  # no category chosen: said in the menu, nothing sent
    expect(panel.locator(".flag-error")).to_have_text("Choose what is wrong with this answer.")
    with store.app_context():  # the conversation is deleted (in another tab) behind the page's back
        db.session.get(Conversation, ids["id"]).deleted_at = utcnow()
        db.session.commit()
    panel.locator(".flag-choice[data-value='dangerous']").click()
    expect(panel.locator(".flag-error")).to_be_hidden()
    panel.locator(".save-flag").click()
    expect(panel.locator(".flag-error")).to_have_text("Could not flag the answer: Message not found.")
    expect(panel).to_be_visible()  # the choice stays, to try again
    expect(node.locator(".flag-view")).to_be_hidden()
    assert flags_of(store, answer) == []


def test_flag_menu_on_a_phone(open_page, store):
    page = open_page(viewport=PHONE, is_mobile=True, has_touch=True)
    ids = seed(store, page, [("How do I cook rice?", ["Rinse it, then simmer it."])], title="Phone flag")
    answer = ids["answers"][0][0]
    show(page, ids["id"])
    node = answer_node(page, answer)
    node.locator(".flag-btn").tap()
    panel = node.locator(".flag-panel")
    expect(panel).to_be_visible()
    assert page.evaluate(TAP_TARGETS) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "flag-menu-phone")
    box = panel.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
    panel.locator(".flag-choice[data-value='personal_data']").tap()
    panel.locator(".flag-note-input").fill("It printed my address")
    panel.locator(".save-flag").tap()
    expect(node.locator(".flag-view-category")).to_have_text(LABELS["personal_data"])
    assert page.evaluate(TAP_TARGETS) == []
    assert flags_of(store, answer) == [("personal_data", "It printed my address")]
