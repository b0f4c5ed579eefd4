"""The chat page in a real Chromium (Playwright), against the production server on the
embedded model: what a user does, and what the database then holds."""
from __future__ import annotations

import re

import pytest

from tests.support.app import make_app
from tests.support.browser_checks import XSS, assert_nothing_injected, watch_csp, watch_dialogs
from tests.support.live_server import chat_server_fixture
from webapp.chat.conversations import clean_title
from webapp.core.extensions import db
from webapp.core.models import Comparison, Conversation, Feedback, Message, User

pytestmark = pytest.mark.browser

chat_server = chat_server_fixture("browser")


@pytest.fixture
def page(browser, chat_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    csp_violations = watch_csp(pg)
    pg.goto(chat_server[0].url + "/")
    pg.wait_for_selector("body.ready")
    yield pg
    context.close()
    assert errors == [], errors
    assert csp_violations == [], csp_violations


def db_app(instance):
    return make_app(instance)


def send(page, text):
    page.fill("#composer-input", text)
    page.keyboard.press("Enter")


# Waits go through locators: page.wait_for_function evaluates its string with eval() in the
# page, which the Content-Security-Policy (no 'unsafe-eval') rightly refuses.
def wait_for_answers(page, n):
    page.locator(".assistant-message:not(.pending) .thumb-up").nth(n - 1).wait_for()
    page.locator(".streaming").first.wait_for(state="detached")


def wait_for_count(page, selector, n):
    from playwright.sync_api import expect

    expect(page.locator(selector)).to_have_count(n, timeout=30_000)


def test_full_chat_flow_persists_across_reload(page, chat_server):
    server, instance = chat_server
    # Count how many times the streaming answer's text changes while it arrives.
    page.evaluate("""() => {
        window.__updates = 0;
        new MutationObserver((records) => {
            for (const r of records) {
                const el = r.target.nodeType === 3 ? r.target.parentElement : r.target;
                if (el && el.closest && el.closest('.streaming')) window.__updates++;
            }
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    send(page, "How do I cook rice?")
    wait_for_answers(page, 1)
    assert page.evaluate("window.__updates") >= 3  # it streamed token by token
    first_answer = page.locator(".assistant-message .content").first.inner_text()
    assert len(first_answer.split()) >= 3
    assert page.locator(".conversation-link").first.inner_text() == "How do I cook rice"  # cleaned title

    # thumbs up with a reason, and 4 stars
    page.click(".assistant-message .thumb-up")
    page.wait_for_selector(".feedback-panel:not([hidden])")
    page.click(".feedback-panel .chip:text-is('helpful')")
    page.fill(".feedback-panel .comment-input", "Clear steps")
    page.click(".save-feedback")
    page.wait_for_selector(".assistant-message .thumb-up[aria-pressed='true']")
    page.click(".assistant-message .star[data-value='4']")
    page.wait_for_selector(".assistant-message .star[data-value='4'].on")

    # regenerate: a sibling answer, and moving between siblings
    page.click(".assistant-message .regenerate")
    page.wait_for_selector(".sibling-pos:text('2 / 2')")
    wait_for_answers(page, 1)
    page.click(".sibling-prev")
    page.wait_for_selector(".sibling-pos:text('1 / 2')")
    assert page.locator(".assistant-message .content").first.inner_text() == first_answer
    page.click(".sibling-next")
    page.wait_for_selector(".sibling-pos:text('2 / 2')")

    # correct this answer
    page.click(".assistant-message .correct")
    page.fill(".correction-input", "Rinse the rice, then simmer it in twice as much water.")
    page.click(".save-correction")
    page.wait_for_selector(".correction-view:not([hidden]) .correction-text")

    # side-by-side compare and a vote for B
    page.check("#compare-toggle")
    send(page, "How can I save money?")
    page.wait_for_selector(".compare .vote[data-winner='b']")
    answer_b = page.locator(".compare [data-side='b'] .bubble").inner_text()
    page.click(".compare .vote[data-winner='b']")
    page.wait_for_selector(".sibling-pos:text('your pick')")
    assert page.locator(".assistant-message .content").last.inner_text() == answer_b

    # reload: everything is still there
    page.reload()
    page.wait_for_selector("body.ready")
    page.wait_for_selector(".assistant-message")
    answers = page.locator(".assistant-message")
    assert answers.count() == 2
    first = answers.nth(0)
    assert first.locator(".correction-text").inner_text().startswith("Rinse the rice, then simmer")
    assert first.locator(".sibling-pos").inner_text() == "2 / 2"
    first.locator(".sibling-prev").click()
    first = page.locator(".assistant-message").nth(0)
    assert first.locator(".thumb-up").get_attribute("aria-pressed") == "true"
    assert first.locator(".star.on").count() == 4
    assert page.locator(".assistant-message").count() == 1  # this branch has no follow-up yet
    first.locator(".sibling-next").click()
    wait_for_count(page, ".assistant-message", 2)
    assert page.locator(".assistant-message .content").last.inner_text() == answer_b
    assert "your pick" in page.locator(".sibling-pos").last.inner_text()

    # ... and in the database, attributed to the right user, message and version
    app = db_app(instance)
    with app.app_context():
        session_user = page.evaluate("fetch('/api/session').then(r => r.json())")["user_id"]
        user = db.session.get(User, session_user)
        conv = db.session.scalars(db.select(Conversation).filter_by(user_id=user.id)).one()
        answers_db = db.session.scalars(db.select(Message).filter_by(conversation_id=conv.id, role="assistant")
                                        .order_by(Message.id)).all()
        assert len(answers_db) == 4  # first, regenerated, A, B
        assert all(m.model_version.name == "v1-base" and m.latency_ms > 0 and m.token_count > 0 for m in answers_db)
        fbs = {f.message_id: f for f in db.session.scalars(db.select(Feedback).filter_by(user_id=user.id))}
        assert fbs[answers_db[0].id].thumb == "up" and fbs[answers_db[0].id].rating == 4
        assert fbs[answers_db[0].id].reasons == ["helpful"] and fbs[answers_db[0].id].comment == "Clear steps"
        assert fbs[answers_db[1].id].correction.startswith("Rinse the rice")
        pair = db.session.scalars(db.select(Comparison).filter_by(user_id=user.id)).one()
        assert pair.winner == "b" and pair.message_b_id == answers_db[3].id


def test_thumbs_down_offers_negative_reasons_and_can_be_undone(page):
    send(page, "Any tips to start running?")
    wait_for_answers(page, 1)
    page.click(".assistant-message .thumb-down")
    page.wait_for_selector(".feedback-panel:not([hidden])")
    chips = page.locator(".feedback-panel .chip").all_inner_texts()
    assert "rude" in chips and "helpful" not in chips
    page.click(".feedback-panel .chip:text-is('off-topic')")
    page.click(".save-feedback")
    page.wait_for_selector(".thumb-down[aria-pressed='true']")
    page.click(".assistant-message .thumb-down")  # click again: thumb removed
    page.wait_for_selector(".thumb-down[aria-pressed='false']")


def test_xss_payloads_render_as_text(page):
    """A message, a correction, a feedback comment and a conversation title full of markup show
    as literal text. (The admin pages that show them: tests/browser/test_browser_admin.py.)"""
    dialogs = watch_dialogs(page)
    send(page, XSS)
    wait_for_answers(page, 1)
    assert page.locator(".user-message .bubble").first.inner_text() == XSS
    assert page.locator(".conversation-link").first.inner_text() == clean_title(XSS)
    page.click(".assistant-message .correct")
    page.fill(".correction-input", XSS)
    page.click(".save-correction")
    page.wait_for_selector(".correction-view:not([hidden])")
    assert page.locator(".correction-text").inner_text() == XSS
    page.click(".assistant-message .comment-toggle")
    page.fill(".feedback-panel .comment-input", XSS)
    page.click(".save-feedback")
    page.wait_for_selector(".comment-toggle:text('Comment \u2713')")
    renamed = page.evaluate("""async (title) => {
        const csrf = (await (await fetch('/api/session')).json()).csrf_token;
        const conv = (await (await fetch('/api/conversations')).json()).conversations[0];
        const r = await fetch(`/api/conversations/${conv.id}`, {method: 'PATCH', body: JSON.stringify({title}),
            headers: {'Content-Type': 'application/json', 'X-CSRFToken': csrf}});
        return (await r.json()).title;
    }""", XSS)
    assert renamed == XSS
    assert_nothing_injected(page, dialogs)

    page.reload()
    page.wait_for_selector(".assistant-message")
    assert page.locator(".user-message .bubble").first.inner_text() == XSS
    assert page.locator(".correction-text").inner_text() == XSS
    assert page.locator(".conversation-link").first.inner_text() == XSS
    page.locator(".conversation-link").first.click()
    page.wait_for_selector(".assistant-message")
    assert page.locator("#chat-title").inner_text() == XSS
    page.click(".assistant-message .comment-toggle")
    assert page.input_value(".feedback-panel .comment-input") == XSS
    assert_nothing_injected(page, dialogs)


def test_conversations_switch_and_delete(page):
    send(page, "How do I train my dog?")
    wait_for_answers(page, 1)
    page.click("#new-chat")
    page.wait_for_selector(".welcome")
    send(page, "How can I sing better?")
    wait_for_answers(page, 1)
    wait_for_count(page, ".conversation-item", 2)
    links = page.locator(".conversation-link")
    assert links.all_inner_texts()[:2] == ["How can I sing better", "How do I train my dog"]
    links.nth(1).click()
    page.wait_for_selector(".user-message .bubble:text('How do I train my dog?')")
    page.on("dialog", lambda d: d.accept())
    page.locator(".conversation-item").nth(1).hover()
    page.locator(".conversation-item").nth(1).locator(".delete-conversation").click()
    wait_for_count(page, ".conversation-item", 1)
    page.reload()
    page.wait_for_selector(".conversation-item")
    assert page.locator(".conversation-link").all_inner_texts() == ["How can I sing better"]


def test_too_long_message_shows_a_readable_error_and_keeps_the_text(page):
    text = "x" * 4001
    page.fill("#composer-input", text)
    page.keyboard.press("Enter")
    toast = page.locator("#toast")
    toast.wait_for(state="visible")
    assert re.search(r"too long", toast.inner_text())
    assert page.input_value("#composer-input") == text
    assert page.locator(".user-message").count() == 0
