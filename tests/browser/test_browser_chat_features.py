"""The chat page's ChatGPT-like features in a real Chromium at 1280x900, against the production
server on the embedded model: markdown (safely), copy, edit-and-resend branches, rename and
delete, date groups, scroll-to-bottom, one-shot compare, a stable action row, keyboard stars,
the live region, dark mode and axe-core checks. Each test asserts what the user sees and, where
something is stored, the database rows; every page is watched for CSP violations and errors."""
from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.test_browser_chat import send, wait_for_answers, wait_for_count
from tests.support.accessibility import assert_accessible
from tests.support.browser_checks import assert_nothing_injected, watch_dialogs
from tests.support.live_server import chat_server_fixture
from webapp.core.extensions import db
from webapp.core.models import Comparison, Conversation, Feedback, Message, utcnow

pytestmark = pytest.mark.browser

DESKTOP = {"width": 1280, "height": 900}
SHOTS = Path("/tmp/shots")

MARKDOWN_ANSWER = """Here is how to **cook rice**:

1. Rinse the rice.
2. Simmer it with `2 cups` of water.

```python
def cook(rice):
    return rice * 2  # <b>not bold</b>
```

| Step | Minutes |
|:-----|-------:|
| Boil | 5 |

See [the guide](https://example.com/rice) and [this](javascript:alert(1)).
![tracker](https://example.com/pixel.png)
<script>window.__xss=9</script> <img src=x onerror="window.__xss=8"> and <b>raw html</b>"""
CODE = 'def cook(rice):\n    return rice * 2  # <b>not bold</b>'
MARKDOWN_QUESTION = "Why is **this** <script>window.__xss=7</script> `code`?"


chat_server = chat_server_fixture("browser-features")


@pytest.fixture
def page(open_page):
    return open_page()


def user_id(page) -> int:
    return page.evaluate("fetch('/api/session').then(r => r.json())")["user_id"]


def seed(store, page, turns, title="Seeded chat", when: datetime | None = None, compare_last=False) -> dict:
    """A conversation of the page's visitor, stored directly: ``turns`` is a list of
    (question or [question variants], [answers]); each turn replies to the last answer of the
    turn before, its answers answer its last question variant. ``compare_last``: the last
    turn's two answers are an unvoted side-by-side pair. ``when``: its last activity (now)."""
    when = when or utcnow()
    with store.app_context():
        conv = Conversation(user_id=user_id(page), title=title, created_at=when, updated_at=when)
        db.session.add(conv)
        db.session.flush()
        parent, ids = None, {"id": conv.id, "questions": [], "answers": []}
        for questions, answers in turns:
            qs = []
            for text in ([questions] if isinstance(questions, str) else questions):
                q = Message(conversation_id=conv.id, role="user", content=text, parent_id=parent, created_at=when)
                db.session.add(q)
                db.session.flush()
                qs.append(q.id)
            ans = []
            for text in answers:
                a = Message(conversation_id=conv.id, role="assistant", content=text, parent_id=qs[-1],
                            model_version_id=1, created_at=when)
                db.session.add(a)
                db.session.flush()
                ans.append(a.id)
            ids["questions"].append(qs)
            ids["answers"].append(ans)
            parent = ans[-1]
        if compare_last:
            db.session.add(Comparison(user_id=conv.user_id, prompt_message_id=ids["questions"][-1][-1],
                                      message_a_id=ids["answers"][-1][0], message_b_id=ids["answers"][-1][1]))
        db.session.commit()
        return ids


def show(page, conversation_id: int) -> None:
    """Open a (seeded) conversation as a user arriving at its address would."""
    page.goto(page.url.split("#")[0] + f"#/c/{conversation_id}")
    page.reload()
    page.wait_for_selector("body.ready")
    item = page.locator(f"#conversation-list .conversation-item[data-id='{conversation_id}'].active")
    item.wait_for(state="attached")  # in the closed drawer on a phone
    page.locator("#messages .message").first.wait_for()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"chat-{name}.png"))


def answers_in_db(store, conversation_id: int) -> list[Message]:
    with store.app_context():
        return db.session.scalars(db.select(Message).filter_by(conversation_id=conversation_id, role="assistant")
                                  .order_by(Message.id)).all()


def luminance(rgb: str) -> float:
    """Relative luminance (WCAG) of a computed CSS colour "rgb(r, g, b)"."""
    parts = [int(float(x)) for x in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3]]
    lin = [(c / 255) / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in parts]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


# ---------------------------------------------------------------------------- markdown

def test_answers_render_markdown_and_no_raw_html(page, store):
    dialogs = watch_dialogs(page)
    ids = seed(store, page, [(MARKDOWN_QUESTION, [MARKDOWN_ANSWER])])
    show(page, ids["id"])
    answer = page.locator(".assistant-message .content")
    expect(answer.locator("strong")).to_have_text("cook rice")
    expect(answer.locator("ol > li")).to_have_count(2)
    expect(answer.locator("li > code")).to_have_text("2 cups")
    expect(answer.locator(".code-block .code-lang")).to_have_text("python")
    assert answer.locator(".code-block pre code").text_content() == CODE + "\n"
    assert answer.locator(".code-block pre code").get_attribute("class") == "language-python"
    expect(answer.locator("td.align-right")).to_have_text("5")
    link = answer.locator("a[href='https://example.com/rice']")
    assert link.get_attribute("target") == "_blank"
    assert set(link.get_attribute("rel").split()) >= {"noopener", "noreferrer"}
    # refused: a javascript: link, images (nothing is loaded), raw HTML (shown as text), inline styles
    assert answer.locator("a[href^='javascript']").count() == 0
    assert page.locator("#messages img").count() == 0
    image = answer.locator("a.image-link")
    assert (image.inner_text(), image.get_attribute("href")) == ("tracker", "https://example.com/pixel.png")
    assert image.get_attribute("rel") == "noopener noreferrer nofollow"
    text = answer.inner_text()
    assert '<script>window.__xss=9</script> <img src=x onerror="window.__xss=8"> and <b>raw html</b>' in text
    assert "[this](javascript:alert(1))" in text
    assert page.locator("#messages [style], #messages b, #messages script").count() == 0
    # the question is the user's text, shown as written
    assert page.locator(".user-message .bubble").inner_text() == MARKDOWN_QUESTION
    assert page.locator(".user-message .bubble strong").count() == 0
    assert_nothing_injected(page, dialogs)


def test_streamed_markdown_updates_in_place(page):
    """Re-rendering a growing answer keeps every finished block as the same DOM node (nothing is
    torn down and rebuilt, so nothing flickers), never fails on half-written markdown (an open
    code fence, half a table, "**bo"), and ends exactly where a one-shot render ends."""
    result = page.evaluate("""async (text) => {
        const markdown = await import("/static/js/markdown.js");  // the module the chat page imports
        const el = document.createElement("div");
        document.body.append(el);
        let firstBlock = null, codeBlock = null, renders = 0;
        for (let i = 1; i <= text.length; i += 2) {
            markdown.update(el, text.slice(0, i));
            renders++;
            if (!firstBlock) firstBlock = el.firstElementChild;
            if (!codeBlock && text.slice(0, i).includes("def cook")) codeBlock = el.querySelector(".code-block");
        }
        markdown.update(el, text);
        const fresh = document.createElement("div");
        fresh.innerHTML = markdown.html(text);
        // isEqualNode: the same tree (innerHTML could differ in the order of a kept node's attributes)
        const out = {renders, same: el.isEqualNode(fresh), firstKept: el.firstElementChild === firstBlock,
                     codeKept: el.querySelector(".code-block") === codeBlock && codeBlock !== null,
                     scripts: el.querySelectorAll("script, img, [style]").length};
        el.remove();
        return out;
    }""", MARKDOWN_ANSWER)
    assert result["renders"] > 100 and result["same"], result
    assert result["firstKept"] and result["codeKept"], result
    assert result["scripts"] == 0


# ---------------------------------------------------------------------------- copy

def test_copy_answer_code_and_question(open_page, store, chat_server):
    page = open_page(permissions=["clipboard-read", "clipboard-write"])
    ids = seed(store, page, [("How do I cook rice?", [MARKDOWN_ANSWER])])
    show(page, ids["id"])
    # records every "Copied" confirmation (it goes away after two seconds)
    page.evaluate("""() => new MutationObserver(() => {
        const tip = document.querySelector('.copy-btn.copied .copy-tip:not([hidden]), .code-copy.copied');
        if (tip) document.body.dataset.copied = (document.body.dataset.copied || '') + '|' + tip.textContent.trim();
    }).observe(document.getElementById('messages'), {subtree: true, attributes: true, childList: true})""")

    page.click(".assistant-message .copy-answer")
    page.wait_for_selector("body[data-copied*='Copied']", state="attached")
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN_ANSWER
    expect(page.locator("#announcer")).to_have_text("Copied to the clipboard.")

    page.evaluate("delete document.body.dataset.copied")
    page.click(".assistant-message .code-copy")
    page.wait_for_selector("body[data-copied*='Copied']", state="attached")
    assert page.evaluate("navigator.clipboard.readText()") == CODE

    page.evaluate("delete document.body.dataset.copied")
    page.hover(".user-message .bubble")
    page.click(".user-message .copy-question")
    page.wait_for_selector("body[data-copied*='Copied']", state="attached")
    assert page.evaluate("navigator.clipboard.readText()") == "How do I cook rice?"


# ---------------------------------------------------------------------------- edit and resend

PAGER = ".question-pager:not([hidden])"


def test_edit_and_resend_pages_between_question_branches(page, store):
    send(page, "How do I cook rice?")
    wait_for_answers(page, 1)
    send(page, "And what about pasta?")
    wait_for_answers(page, 2)
    pasta_answer = page.locator(".assistant-message .content").nth(1).inner_text()

    second = page.locator(".user-message").nth(1)
    second.hover()
    second.locator(".edit-question").click()
    editor = second.locator(".edit-input")
    expect(editor).to_be_focused()
    assert editor.input_value() == "And what about pasta?"
    editor.fill("And what about noodles?")
    editor.press("Enter")
    expect(page.locator(PAGER + " .q-pos")).to_have_text("2 / 2")
    wait_for_answers(page, 2)
    expect(page.locator(".user-message .bubble").nth(1)).to_have_text("And what about noodles?")
    expect(page.locator(".assistant-message")).to_have_count(2)
    expect(page.locator("#announcer")).to_contain_text("Answer: ")

    # page back to the original question: its own answer comes back with it
    page.click(PAGER + " .q-prev")
    expect(page.locator(PAGER + " .q-pos")).to_have_text("1 / 2")
    expect(page.locator(".user-message .bubble").nth(1)).to_have_text("And what about pasta?")
    expect(page.locator(".assistant-message .content").nth(1)).to_have_text(pasta_answer)
    expect(page.locator(PAGER + " .q-prev")).to_be_disabled()
    page.click(PAGER + " .q-next")
    expect(page.locator(".user-message .bubble").nth(1)).to_have_text("And what about noodles?")

    # editing the first question branches at the root; the whole older branch stays reachable
    first = page.locator(".user-message").first
    first.hover()
    first.locator(".edit-question").click()
    first.locator(".edit-input").fill("How do I cook quinoa?")
    first.locator(".send-edit").click()
    expect(page.locator(".user-message").first.locator(".q-pos")).to_have_text("2 / 2")
    expect(page.locator(PAGER)).to_have_count(1)
    wait_for_answers(page, 1)
    expect(page.locator(".user-message")).to_have_count(1)
    page.locator(".user-message").first.locator(".q-prev").click()
    expect(page.locator(".user-message .bubble")).to_have_text(["How do I cook rice?", "And what about noodles?"])
    expect(page.locator(PAGER + " .q-pos")).to_have_text(["1 / 2", "2 / 2"])

    # after a reload the newest branch is shown
    page.reload()
    page.wait_for_selector(".assistant-message")
    expect(page.locator(".user-message .bubble")).to_have_text(["How do I cook quinoa?"])

    conv_id = int(page.url.rsplit("/", 1)[1])
    with store.app_context():
        questions = db.session.scalars(db.select(Message).filter_by(conversation_id=conv_id, role="user")
                                       .order_by(Message.id)).all()
        assert [q.content for q in questions] == ["How do I cook rice?", "And what about pasta?",
                                                  "And what about noodles?", "How do I cook quinoa?"]
        rice, pasta, noodles, quinoa = questions
        assert pasta.parent_id == noodles.parent_id is not None  # siblings: same parent answer
        assert rice.parent_id is None and quinoa.parent_id is None
        for q in questions:  # every question has its own answer
            assert db.session.query(Message).filter_by(parent_id=q.id, role="assistant").count() == 1
        assert db.session.get(Conversation, conv_id).title == "How do I cook rice"


# ---------------------------------------------------------------------------- sidebar

def test_rename_and_delete_a_conversation(page, store):
    ids = seed(store, page, [("How do I cook rice?", ["Rinse it."])], title="How do I cook rice")
    other = seed(store, page, [("Running tips?", ["Start slowly."])], title="Running tips")
    show(page, ids["id"])
    item = page.locator(f".conversation-item[data-id='{ids['id']}']")
    item.hover()
    item.locator(".rename-conversation").click()
    title = item.locator(".rename-input")
    expect(title).to_be_focused()
    title.fill("  Rice notes  ")
    title.press("Enter")
    expect(item.locator(".conversation-link")).to_have_text("Rice notes")
    expect(page.locator("#chat-title")).to_have_text("Rice notes")
    expect(page).to_have_title("Rice notes · Chat")
    expect(item.locator(".rename-conversation")).to_be_focused()
    with store.app_context():
        assert db.session.get(Conversation, ids["id"]).title == "Rice notes"

    # Escape leaves the title as it was
    item.locator(".rename-conversation").click()
    item.locator(".rename-input").fill("Something else")
    item.locator(".rename-input").press("Escape")
    expect(item.locator(".conversation-link")).to_have_text("Rice notes")
    with store.app_context():
        assert db.session.get(Conversation, ids["id"]).title == "Rice notes"

    page.on("dialog", lambda d: d.accept())
    item.locator(".delete-conversation").click()
    wait_for_count(page, ".conversation-item", 1)
    expect(page.locator(".welcome")).to_be_visible()
    expect(page.locator(".conversation-link")).to_have_text(["Running tips"])
    with store.app_context():
        assert db.session.get(Conversation, ids["id"]).deleted_at is not None
        assert db.session.get(Conversation, other["id"]).deleted_at is None


def test_sidebar_groups_conversations_by_date(open_page, store):
    page = open_page(timezone_id="UTC")
    midnight = datetime.combine(utcnow().date(), datetime.min.time())  # today, 00:00 UTC (the page's zone)
    times = {"Just now": utcnow(), "Yesterday noon": midnight - timedelta(hours=12),
             "Three days ago": midnight - timedelta(days=3), "Two weeks ago": midnight - timedelta(days=15),
             "Six weeks ago": midnight - timedelta(days=45), "Last year": midnight - timedelta(days=400)}
    for title, when in reversed(times.items()):
        seed(store, page, [("Hi", ["Hello."])], title=title, when=when)
    page.reload()
    page.wait_for_selector(".conversation-item")
    month = lambda days: (midnight - timedelta(days=days)).strftime("%B %Y")  # noqa: E731
    expected = [("Today", ["Just now"]), ("Yesterday", ["Yesterday noon"]), ("Previous 7 days", ["Three days ago"]),
                ("Previous 30 days", ["Two weeks ago"]), (month(45), ["Six weeks ago"]), (month(400), ["Last year"])]
    groups = page.locator(".conversation-group")
    expect(groups.locator(".group-label")).to_have_text([label for label, _ in expected])
    for i, (_, titles) in enumerate(expected):
        expect(groups.nth(i).locator(".conversation-link")).to_have_text(titles)
    shot(page, "desktop-light-groups")


# ---------------------------------------------------------------------------- scrolling

def test_scroll_to_bottom_button(page, store):
    long_answer = "\n\n".join(f"Step {i}: keep going, this is a long answer." for i in range(6))
    ids = seed(store, page, [(f"Question {i}?", [long_answer]) for i in range(8)])
    show(page, ids["id"])
    button = page.locator("#scroll-down")
    expect(button).to_be_hidden()  # a conversation opens at its newest message
    page.locator("#messages").evaluate("el => { el.scrollTop = 0; }")
    expect(button).to_be_visible()
    button.click()
    expect(button).to_be_hidden()
    assert page.locator("#messages").evaluate("el => el.scrollHeight - el.scrollTop - el.clientHeight") < 80
    expect(page.locator("#composer-input")).to_be_focused()


# ---------------------------------------------------------------------------- compare

def test_compare_is_a_one_shot_option(page, store):
    send(page, "How do I cook rice?")
    wait_for_answers(page, 1)
    page.check("#compare-toggle")
    send(page, "How can I save money?")
    expect(page.locator("#compare-toggle")).not_to_be_checked()  # unchecked as soon as it is sent
    page.wait_for_selector(".compare .vote[data-winner='a']")
    expect(page.locator("#announcer")).to_have_text("Two answers are ready: pick the better one.")
    expect(page.locator("#compare-toggle")).not_to_be_checked()
    page.click(".compare .vote[data-winner='a']")
    page.wait_for_selector(".sibling-pos:text('your pick')")
    send(page, "Any tips to start running?")  # answered normally
    wait_for_answers(page, 3)
    expect(page.locator(".compare")).to_have_count(0)
    conv_id = int(page.url.rsplit("/", 1)[1])
    with store.app_context():
        pairs = db.session.scalars(db.select(Comparison).join(Message, Comparison.prompt_message_id == Message.id)
                                   .filter(Message.conversation_id == conv_id)).all()
        assert [(p.winner, db.session.get(Message, p.prompt_message_id).content) for p in pairs] == \
            [("a", "How can I save money?")]
        assert len(answers_in_db(store, conv_id)) == 4  # rice, A, B, running


# ---------------------------------------------------------------------------- action row

ROW_BOXES = """(article) => {
    const row = article.querySelector('.message-tools').getBoundingClientRect();
    return Array.from(article.querySelectorAll('.message-tools [data-key]')).map((el) => {
        const r = el.getBoundingClientRect();
        return [el.dataset.key, Math.round(r.x), Math.round(r.y - row.y), Math.round(r.width), Math.round(r.height)];
    });
}"""


def test_regenerate_leaves_the_action_row_in_place(page, store):
    """The bug this guards: after the first Regenerate the pager appeared at the start of the row
    and pushed every button ~70 px right, so a second click on Regenerate rated the answer 5
    stars. Now every button keeps its place (x, size, and its offset in the row; the row itself
    only moves down or up with the new answer's length)."""
    send(page, "How do I cook rice?")
    wait_for_answers(page, 1)
    answer = page.locator(".assistant-message").last
    before = answer.evaluate(ROW_BOXES)
    assert len(before) >= 10
    answer.locator(".regenerate").click()
    page.wait_for_selector(".sibling-pos:text('2 / 2')")
    wait_for_answers(page, 1)
    answer = page.locator(".assistant-message").last
    after = answer.evaluate(ROW_BOXES)
    assert after == before

    # a second click at the same spot regenerates again (and rates nothing)
    box = answer.locator(".regenerate").bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector(".sibling-pos:text('3 / 3')")
    wait_for_answers(page, 1)
    assert page.locator(".assistant-message").last.evaluate(ROW_BOXES) == before
    expect(page.locator(".regenerate")).to_be_focused()
    conv_id = int(page.url.rsplit("/", 1)[1])
    assert len(answers_in_db(store, conv_id)) == 3
    with store.app_context():
        assert db.session.query(Feedback).filter(Feedback.message_id.in_(
            [m.id for m in answers_in_db(store, conv_id)])).count() == 0


# ---------------------------------------------------------------------------- keyboard and screen readers

def test_stars_are_a_keyboard_radio_group(page, store):
    ids = seed(store, page, [("How do I cook rice?", ["Rinse it, then simmer it."])])
    answer_id = ids["answers"][0][0]
    show(page, ids["id"])
    stars = page.locator(".assistant-message .star")
    assert [stars.nth(i).get_attribute("tabindex") for i in range(5)] == ["0", "-1", "-1", "-1", "-1"]
    page.locator(".assistant-message .flag-btn").focus()  # thumbs, the flag, then the stars
    page.keyboard.press("Tab")
    expect(stars.nth(0)).to_be_focused()
    # keyboard focus is visible
    assert stars.nth(0).evaluate("el => getComputedStyle(el).outlineStyle") != "none"
    assert stars.nth(0).evaluate("el => parseFloat(getComputedStyle(el).outlineWidth)") >= 2

    def press(key):
        with page.expect_response(lambda r: r.url.endswith(f"/api/messages/{answer_id}/feedback")) as resp:
            page.keyboard.press(key)
        assert resp.value.ok

    for _ in range(3):
        press("ArrowRight")
    expect(stars.nth(3)).to_be_focused()
    expect(stars.nth(3)).to_have_attribute("aria-checked", "true")
    expect(page.locator(".assistant-message .star.on")).to_have_count(4)
    assert [stars.nth(i).get_attribute("tabindex") for i in range(5)] == ["-1", "-1", "-1", "0", "-1"]
    press("End")
    expect(stars.nth(4)).to_have_attribute("aria-checked", "true")
    press("Home")
    expect(stars.nth(0)).to_be_focused()
    press("ArrowUp")
    press("ArrowDown")
    expect(stars.nth(0)).to_have_attribute("aria-checked", "true")
    page.keyboard.press("ArrowLeft")  # already the lowest: nothing changes, nothing is sent
    expect(stars.nth(0)).to_be_focused()
    page.keyboard.press("Tab")  # one tab stop for the whole group
    expect(page.locator(".assistant-message .regenerate")).to_be_focused()
    page.keyboard.press("Shift+Tab")
    expect(stars.nth(0)).to_be_focused()
    with store.app_context():
        assert db.session.scalars(db.select(Feedback.rating).filter_by(message_id=answer_id)).one() == 1
    page.reload()
    page.wait_for_selector(".assistant-message")
    expect(page.locator(".assistant-message .star[aria-checked='true']")).to_have_attribute("data-value", "1")


def test_live_region_announces_new_answers_only(page, store):
    ids = seed(store, page, [("How do I cook rice?", ["Rinse it."]), ("And pasta?", ["Boil water."])])
    show(page, ids["id"])
    expect(page.locator(".assistant-message")).to_have_count(2)
    live = page.locator("[aria-live]")
    expect(live).to_have_count(1)  # only the announcer; the message list itself is not live
    assert live.get_attribute("id") == "announcer" and live.get_attribute("aria-live") == "polite"
    expect(page.locator("#announcer")).to_have_text("")  # the history on load is not read out
    page.evaluate("""() => {
        window.__announced = [];
        new MutationObserver(() => window.__announced.push(document.getElementById('announcer').textContent))
            .observe(document.getElementById('announcer'), {childList: true, characterData: true, subtree: true});
        window.__markdownWhileStreaming = false;
        new MutationObserver(() => {
            if (document.querySelector('.streaming .content > p')) window.__markdownWhileStreaming = true;
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
    }""")
    send(page, "Any tips to start running?")
    wait_for_answers(page, 3)
    expect(page.locator("#announcer")).to_have_text(
        "Answer: " + page.locator(".assistant-message .content").nth(2).inner_text())
    assert page.evaluate("window.__announced").count("") == 0
    assert len(page.evaluate("window.__announced")) == 1
    assert page.evaluate("window.__markdownWhileStreaming")  # rendered as markdown while it streamed
    newest = answers_in_db(store, ids["id"])[-1]
    assert page.locator("#announcer").inner_text() == f"Answer: {newest.content}"


# ---------------------------------------------------------------------------- dark mode and axe

def seed_everything(store, page) -> dict:
    """A conversation with every kind of node: markdown, sibling answers, question variants and
    an unvoted compare pair."""
    return seed(store, page, [
        ("How do I cook rice?", ["Rinse it.", MARKDOWN_ANSWER]),
        (["And pasta?", "And noodles?"], ["Boil water, then add the noodles."]),
        ("How can I save money?", ["Spend less than you earn.", "Make a budget and stick to it."]),
    ], compare_last=True)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_color_scheme_follows_the_system_and_is_accessible(open_page, store, scheme):
    page = open_page(color_scheme=scheme)
    assert_accessible(page, f"welcome, {scheme}")
    ids = seed_everything(store, page)
    show(page, ids["id"])
    page.wait_for_selector(".compare")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    text = page.evaluate("getComputedStyle(document.body).color")
    if scheme == "dark":
        assert luminance(background) < 0.05, background
    else:
        assert luminance(background) > 0.9, background
    assert contrast(background, text) >= 7, (background, text)
    muted = page.locator(".group-label").first.evaluate("el => getComputedStyle(el).color")
    sidebar = page.locator("#sidebar").evaluate("el => getComputedStyle(el).backgroundColor")
    assert contrast(sidebar, muted) >= 4.5, (sidebar, muted)
    assert_accessible(page, f"conversation, {scheme}")
    shot(page, f"desktop-{scheme}-compare")

    page.click(".compare .vote[data-winner='b']")
    page.wait_for_selector(".sibling-pos:text('your pick')")
    first = page.locator(".assistant-message").first
    first.locator(".thumb-up").click()
    page.wait_for_selector(".feedback-panel:not([hidden])")
    first.locator(".feedback-panel .chip").first.click()
    first.locator(".correct").click()
    page.wait_for_selector(".correction-editor:not([hidden])")
    assert_accessible(page, f"feedback panel and correction editor open, {scheme}")
    shot(page, f"desktop-{scheme}-feedback")
    first.locator(".cancel-correction").click()
    first.locator(".cancel-feedback").click()
    page.locator(".user-message").nth(1).hover()
    page.locator(".user-message").nth(1).locator(".edit-question").click()
    page.locator(f".conversation-item[data-id='{ids['id']}'] .rename-conversation").click()
    assert_accessible(page, f"question editor and rename field open, {scheme}")
    page.keyboard.press("Escape")
    page.locator(".assistant-message").first.scroll_into_view_if_needed()
    shot(page, f"desktop-{scheme}")


def test_an_answer_cut_at_the_length_limit_says_so(page, store):
    ids = seed(store, page, [("How do I cook rice?", ["Rinse the rice, then simmer it in", "Rinse it."])])
    with store.app_context():
        cut = db.session.get(Message, ids["answers"][0][0])
        cut.finish_reason = "length"
        db.session.get(Message, ids["answers"][0][1]).finish_reason = "eos"
        db.session.commit()
    show(page, ids["id"])
    shown = page.locator("#messages .assistant-message")
    expect(shown.locator(".cut-note")).to_be_hidden()  # the newest answer (2 / 2) ended by itself
    page.locator("#messages .assistant-message .sibling-prev").click()
    expect(shown.locator(".cut-note")).to_have_text("Cut off at the length limit: this answer did not finish.")
    expect(shown.locator(".content")).to_contain_text("simmer it in")
