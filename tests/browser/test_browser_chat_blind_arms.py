"""Blind arms in a real Chromium: while an experiment runs, the chat page works as always (compare
offered by the session's compare rate, vote, streamed regenerate and edit) and nothing on it --
nor in any response it fetched -- says which model version or A/B arm answered. An admin using
the chat sees the version and arm (a compare's only after the vote)."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_browser_chat import send, wait_for_answers
from tests.support.app import make_app, register_model
from tests.support.browser_checks import watch_csp
from tests.support.live_server import LiveServer
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Experiment, Message

pytestmark = pytest.mark.browser

KEY = "blind-exp-7f3q"
VERSIONS = ("v1-base", "v2-ppo")
PASSWORD = "correct horse"
LEAK = re.compile("|".join([re.escape(KEY), *map(re.escape, VERSIONS), r'"(?:arm|model_version|model_version_id|'
                            r'experiment_id|experiment)"\s*:', r'"(?:control|variant)"']))


@pytest.fixture(scope="module")
def experiment_server(tmp_path_factory, micro_model_dir):
    """The production server on the micro model, v1-base vs v2-ppo running 50/50; every
    question is answered side by side (RLHF_COMPARE_RATE=1), so the page's compare decision
    -- taken from /api/session's compare rate alone -- is exercised on every send."""
    instance = tmp_path_factory.mktemp("blind") / "instance"
    app = make_app(instance)
    register_model(app, micro_model_dir)
    register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    with app.app_context():
        db.session.add(Experiment(key=KEY, control_version_id=1, variant_version_id=2, traffic_split=0.5,
                                  status="running"))
        db.session.commit()
        set_admin_password("root", PASSWORD)
    server = LiveServer(instance, env={"RLHF_EMBEDDED_PRESET": "micro", "RLHF_MAX_NEW_TOKENS": "12",
                                       "RLHF_COMPARE_RATE": "1"})
    yield server, app
    server.stop()


def open_chat(browser, url, login=False):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    csp = watch_csp(page)
    responses = []
    page.on("response", lambda r: responses.append(r) if "/api/" in r.url or r.url.rstrip("/") == url else None)
    if login:
        page.goto(url + "/admin/login")
        page.fill("input[name=username]", "root")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/admin/?$"))
    page.goto(url + "/")
    page.wait_for_selector("body.ready")
    return context, page, errors, csp, responses


def drain(responses) -> list[tuple[str, str]]:
    """(url, body) of the responses seen so far (read before the page navigates away)."""
    out = [(r.url, r.text()) for r in responses if r.status != 304]
    responses.clear()
    return out


def compare_vote_regenerate_edit(page, question):
    send(page, question)  # the compare rate (1) makes it a side-by-side compare
    page.wait_for_selector(".compare .vote[data-winner='b']")
    assert page.locator(".compare [data-side]").count() == 2
    page.click(".compare .vote[data-winner='b']")
    page.wait_for_selector(".sibling-pos:text('your pick')")
    page.locator(".assistant-message .regenerate").last.click()  # streamed
    page.wait_for_selector(".sibling-pos:text('3 / 3')")
    wait_for_answers(page, 1)
    page.locator(".user-message .edit-question").last.click()  # edit and resend: streamed too
    page.fill(".edit-input", question + " Please.")
    page.click(".send-edit")
    page.wait_for_selector(".q-pos:text('2 / 2')")
    wait_for_answers(page, 1)


def test_users_never_see_the_arm_or_version(browser, experiment_server):
    server, app = experiment_server
    seen_arms = set()
    for i in range(4):  # a few users, so both arms serve someone
        context, page, errors, csp, responses = open_chat(browser, server.url)
        compare_vote_regenerate_edit(page, f"How do I cook rice {i}?")
        bodies = drain(responses)
        page.reload()
        page.wait_for_selector("body.ready")
        page.locator(".conversation-link").first.click()
        wait_for_answers(page, 1)

        expect(page.locator("#sidebar-footer")).to_be_hidden()
        assert page.locator("#model-badge").inner_text() == ""
        assert all(m == "" for m in page.locator(".assistant-message .meta").all_inner_texts())
        html = page.content()
        assert not re.search("|".join([re.escape(KEY), *map(re.escape, VERSIONS)]), html)
        bodies += drain(responses)
        assert len(bodies) >= 12
        assert [(u, LEAK.search(b).group(0)) for u, b in bodies if LEAK.search(b)] == []
        assert errors == [] and csp == []
        user_id = page.evaluate("fetch('/api/session').then(r => r.json())")["user_id"]
        context.close()
        with app.app_context():
            arms = db.session.scalars(db.select(Message.arm).join(Message.conversation)
                                      .where(Message.role == "assistant")
                                      .filter_by(user_id=user_id)).all()
            db.session.remove()
        assert len(arms) == 4 and set(arms) <= {"control", "variant"}  # A, B, regenerated, the edit's answer
        seen_arms |= set(arms)
    assert seen_arms == {"control", "variant"}


def test_an_admin_using_the_chat_sees_version_and_arm_after_the_vote(browser, experiment_server):
    server, _ = experiment_server
    context, page, errors, csp, _ = open_chat(browser, server.url, login=True)
    expect(page.locator("#sidebar-footer")).to_be_visible()
    expect(page.locator("#model-badge")).to_have_text(re.compile(r"^Model v(1-base|2-ppo) · (control|variant)$"))
    send(page, "How can I save money?")
    page.wait_for_selector(".compare .vote[data-winner='a']")
    assert not LEAK.search(page.locator(".compare").inner_html())  # A and B, to an admin too
    page.click(".compare .vote[data-winner='a']")
    page.wait_for_selector(".sibling-pos:text('your pick')")
    meta = page.locator(".assistant-message .meta").last.inner_text()
    assert re.fullmatch(r"v(1-base|2-ppo) · (control|variant)", meta), meta
    assert errors == [] and csp == []
    context.close()
