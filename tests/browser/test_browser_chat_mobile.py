"""The chat page on a 390x844 phone (touch, mobile viewport) in a real Chromium, against the
production server on the embedded model: the conversation drawer (open, close, focus), the
new-chat buttons, tap targets of at least 44x44 px, a composer that fits, and axe-core checks in
light and dark mode. Every page is watched for CSP violations and errors."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.test_browser_chat import send, wait_for_answers
from tests.browser.test_browser_chat_features import seed, seed_everything, shot, show
from tests.support.accessibility import assert_accessible
from tests.support.live_server import chat_server_fixture
from webapp.core.extensions import db
from webapp.core.models import Conversation, Message

pytestmark = pytest.mark.browser

chat_server = chat_server_fixture("browser-mobile")

PHONE = {"width": 390, "height": 844}

# Every visible control that can be tapped, with its size; a checkbox counts with its label, links
# inside the text of an answer are exempt (WCAG 2.5.8: inline targets). Controls behind the open
# drawer (inert) are out of reach and not counted.
TAP_TARGETS = """() => {
    const small = [];
    const main = document.getElementById('chat-main');
    for (const el of document.querySelectorAll('button, a[href], input, textarea, select, [role="radio"]')) {
        if (el.matches('.markdown a')) continue;
        if (main.inert && main.contains(el)) continue;
        const target = el.matches('input[type="checkbox"]') && el.closest('label') ? el.closest('label') : el;
        const r = target.getBoundingClientRect();
        if (!r.width || !r.height || getComputedStyle(target).visibility === 'hidden') continue;
        if (r.width < 44 || r.height < 44) {
            const name = el.getAttribute('aria-label') || el.textContent.trim().slice(0, 30) || el.className;
            const size = `${r.width.toFixed(1)}x${r.height.toFixed(1)}`;
            small.push(`${el.tagName.toLowerCase()}.${el.className} "${name}": ${size}`);
        }
    }
    return small;
}"""

COMPOSER_FIT = """() => {
    const input = document.getElementById('composer-input');
    const style = getComputedStyle(input);
    const ctx = document.createElement('canvas').getContext('2d');
    ctx.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const box = document.querySelector('.composer-box').getBoundingClientRect();
    const send = document.getElementById('send-button').getBoundingClientRect();
    return {placeholder: ctx.measureText(input.placeholder).width,
            room: input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight),
            boxLeft: box.left, boxRight: box.right, sendRight: send.right, sendBottom: send.bottom,
            pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
            viewportHeight: window.innerHeight};
}"""


@pytest.fixture
def phone(open_page):
    def opener(**options):
        return open_page(viewport=PHONE, is_mobile=True, has_touch=True, **options)
    return opener


def focus_in(page, selector: str) -> bool:
    return page.evaluate("(s) => document.querySelector(s).contains(document.activeElement)", selector)


def test_drawer_opens_closes_and_keeps_the_focus(phone, store):
    page = phone()
    older = seed(store, page, [("How do I cook rice?", ["Rinse it."])], title="Rice")
    current = seed(store, page, [("Running tips?", ["Start slowly."])], title="Running")
    show(page, current["id"])
    sidebar, menu = page.locator("#sidebar"), page.locator("#menu-button")
    expect(sidebar).to_be_hidden()  # off screen and out of the tab order
    expect(menu).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "false")
    shot(page, "mobile-light-drawer-closed")

    menu.click()
    expect(sidebar).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "true")
    assert page.locator("#sidebar").bounding_box()["x"] == 0
    expect(page.locator(".conversation-item.active .conversation-link")).to_be_focused()
    assert page.evaluate("document.getElementById('chat-main').inert")
    shot(page, "mobile-light-drawer-open")
    for _ in range(10):  # the focus cycles through the drawer, never into the page behind it
        page.keyboard.press("Tab")
        assert not focus_in(page, "#chat-main")
    page.keyboard.press("Escape")
    expect(sidebar).to_be_hidden()
    expect(menu).to_be_focused()
    expect(menu).to_have_attribute("aria-expanded", "false")
    assert not page.evaluate("document.getElementById('chat-main').inert")

    menu.click()  # the close button and the backdrop close it too
    page.click("#drawer-close")
    expect(sidebar).to_be_hidden()
    expect(menu).to_be_focused()
    menu.click()
    page.mouse.click(370, 500)  # the backdrop, right of the drawer
    expect(sidebar).to_be_hidden()

    menu.click()  # picking a conversation opens it and closes the drawer
    page.click(f".conversation-item[data-id='{older['id']}'] .conversation-link")
    expect(sidebar).to_be_hidden()
    expect(page.locator("#chat-title")).to_have_text("Rice")
    expect(page.locator(".user-message .bubble")).to_have_text("How do I cook rice?")

    menu.click()  # new chat from the drawer
    page.click("#new-chat")
    expect(sidebar).to_be_hidden()
    expect(page.locator(".welcome")).to_be_visible()
    expect(page.locator("#composer-input")).to_be_focused()

    show(page, current["id"])  # new chat from the header
    page.click("#header-new-chat")
    expect(page.locator(".welcome")).to_be_visible()
    expect(page.locator("#chat-title")).to_have_text("New chat")

    send(page, "How can I save money?")  # and a question, asked on the phone
    wait_for_answers(page, 1)
    menu.click()
    expect(page.locator(".conversation-link").first).to_have_text("How can I save money")
    with store.app_context():
        conv = db.session.scalars(db.select(Conversation).order_by(Conversation.id.desc())).first()
        assert conv.title == "How can I save money"
        assert [m.role for m in db.session.scalars(db.select(Message).filter_by(conversation_id=conv.id))] == \
            ["user", "assistant"]


def test_tap_targets_are_at_least_44px_and_the_composer_fits(phone, store):
    page = phone()
    assert page.evaluate(TAP_TARGETS) == []  # the welcome screen
    fit = page.evaluate(COMPOSER_FIT)
    assert fit["placeholder"] <= fit["room"], fit  # the placeholder is not cut off
    assert fit["boxLeft"] >= 0 and fit["boxRight"] <= fit["viewport"] and fit["sendRight"] <= fit["viewport"], fit
    assert fit["sendBottom"] <= fit["viewportHeight"], fit
    assert fit["pageWidth"] <= fit["viewport"], fit  # nothing scrolls sideways

    ids = seed_everything(store, page)
    show(page, ids["id"])
    page.wait_for_selector(".compare")
    assert page.evaluate(TAP_TARGETS) == []  # answers, pagers, stars, compare votes, code copy
    page.click(".compare .vote[data-winner='a']")
    page.wait_for_selector(".sibling-pos:text('your pick')")
    first = page.locator(".assistant-message").first
    first.locator(".thumb-down").click()
    page.wait_for_selector(".feedback-panel:not([hidden])")
    first.locator(".correct").click()
    page.wait_for_selector(".correction-editor:not([hidden])")
    assert page.evaluate(TAP_TARGETS) == []  # reason chips, panels
    page.locator(".user-message").nth(1).locator(".edit-question").click()
    assert page.evaluate(TAP_TARGETS) == []  # the question editor
    page.click("#menu-button")
    expect(page.locator("#sidebar")).to_be_visible()
    assert page.evaluate(TAP_TARGETS) == []  # the drawer
    page.locator(f".conversation-item[data-id='{ids['id']}'] .rename-conversation").click()
    assert page.evaluate(TAP_TARGETS) == []  # renaming
    assert page.evaluate(COMPOSER_FIT)["pageWidth"] <= PHONE["width"]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_phone_is_accessible_in_light_and_dark(phone, store, scheme):
    page = phone(color_scheme=scheme)
    assert_accessible(page, f"phone welcome, {scheme}")
    ids = seed_everything(store, page)
    show(page, ids["id"])
    page.wait_for_selector(".compare")
    assert_accessible(page, f"phone conversation, {scheme}")
    page.click(".compare .vote[data-winner='b']")
    page.wait_for_selector(".sibling-pos:text('your pick')")
    first = page.locator(".assistant-message").first
    first.locator(".thumb-up").click()
    page.wait_for_selector(".feedback-panel:not([hidden])")
    assert_accessible(page, f"phone feedback panel, {scheme}")
    first.locator(".cancel-feedback").click()
    first.scroll_into_view_if_needed()
    shot(page, f"mobile-{scheme}-conversation")
    page.click("#menu-button")
    expect(page.locator("#sidebar")).to_be_visible()
    assert_accessible(page, f"phone drawer, {scheme}")
    shot(page, f"mobile-{scheme}-drawer")
