"""A real Open WebUI in front of this app, driven in Chromium (opt-in: ``RLHF_OPEN_WEBUI`` names
Open WebUI's ``open-webui`` executable; docs/integrations/open-webui.md says how to install it).

The production server on the embedded model, an API key made with the documented command, and an
Open WebUI (auth on: an admin and a plain user, task generation on as by default) whose OpenAI
connection is this app's /v1 through a recording proxy. As each person, in the browser: several
chats, a plain regenerate, guided regenerations ("More Concise", "Add Details", a typed change), an
edited question, a "Continue Response", thumbs up and down with a 1-10 score, a reason and a
comment, one rating changed later. Then Open WebUI's admin export is imported with the CLI, twice,
and the scheduler's pull fetches it from the live Open WebUI, twice.

Checked: every rating matched the stored answer its rater saw (the text Open WebUI shows, in that
person's conversation) with the right thumb, stars, reason and comment; a second import or pull
changes nothing, a rating changed in Open WebUI is taken; no task prompt is stored; each chat is
one conversation whose branches are Open WebUI's.

With ``RLHF_OPEN_WEBUI_RECORD=1`` the run also writes what CI replays
(tests/webapp/training/test_openwebui_recorded.py): Open WebUI's export as it sent it, its chats,
and the /v1 exchange, into tests/fixtures/open_webui/ (see the README there).
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.open_webui import ENV_VAR, OpenWebUI, Person, RecordingProxy, is_task

EXECUTABLE = os.environ.get(ENV_VAR)
if not EXECUTABLE:
    pytest.skip(f"opt-in: {ENV_VAR} names no Open WebUI executable (docs/integrations/open-webui.md)",
                allow_module_level=True)

from tests.support.app import make_app, register_model  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from tests.support.paths import FIXTURES, ROOT  # noqa: E402
from webapp.core.extensions import db  # noqa: E402
from webapp.core.identity import api_anon_id  # noqa: E402
from webapp.core.models import Comparison, Conversation, Feedback, Message, User  # noqa: E402
from webapp.training.openwebui_export import REASON_CHIPS, REASON_LABELS  # noqa: E402
from webapp.training.openwebui_pull import pull_tick  # noqa: E402

pytestmark = pytest.mark.browser

RECORDING = FIXTURES / "open_webui"
ADMIN = ("Ada Admin", "ada@example.org", "ada-live-test-1")
USER = ("Bo User", "bo@example.org", "bo-live-test-1")
CLIENT = "open-webui"
# The connection headers docs/integrations/open-webui.md recommends: ratings matched by message id,
# every guided regeneration (a typed change too) recognised by its question's id, tasks by name.
CONNECTION_HEADERS = {"X-OpenWebUI-Message-Id": "{{MESSAGE_ID}}", "X-OpenWebUI-User-Message-Id": "{{USER_MESSAGE_ID}}",
                      "X-OpenWebUI-Task": "{{TASK}}"}


@dataclass
class Rating:
    """One rating given in the browser: what was rated, how, and the text the page showed."""

    person: Person
    answer_id: str
    up: bool
    score: int
    reason: str  # the button's label
    comment: str
    chat_id: str = ""
    seen: str = ""


@dataclass
class Session:
    ratings: list[Rating] = field(default_factory=list)
    guided: dict[str, str] = field(default_factory=dict)  # Open WebUI answer id -> the instruction
    continued: list[str] = field(default_factory=list)  # Open WebUI answer ids
    counts: dict[str, int] = field(default_factory=dict)


def rate(session: Session, admin_token: str, person: Person, answer: dict, up: bool, score: int, reason: str,
         comment: str) -> None:
    r = Rating(person, answer["id"], up, score, reason, comment, person.chat_id, person.seen_text(answer["id"]))
    person.rate(answer["id"], up, score, reason, comment, admin_token)
    session.ratings.append(r)


def play(ada: Person, bo: Person, admin_token: str) -> Session:
    """What the two people do in Open WebUI (module docstring)."""
    s = Session()
    count = s.counts

    def did(kind: str) -> None:
        count[kind] = count.get(kind, 0) + 1

    # Ada: a plain regenerate, then "More Concise" of the answer shown; she rates the concise one
    ada.new_chat()
    first = ada.ask("How do I keep basil alive on a windowsill?")
    again = ada.regenerate(first["id"])
    did("try again")
    concise = ada.regenerate(again["id"], "More Concise")
    s.guided[concise["id"]] = "More Concise"
    rate(s, admin_token, ada, concise, True, 8, "Accurate information", "Short and to the point.")

    # Ada: two turns, "Add Details" on the second, then the second question edited
    ada.new_chat()
    ada.ask("What is a good warm-up before a run?")
    second = ada.ask("How long should it take?")
    detailed = ada.regenerate(second["id"], "Add Details")
    s.guided[detailed["id"]] = "Add Details"
    edited = ada.edit_question(second["parentId"], "How long should the warm-up take?")
    did("edited question")
    rate(s, admin_token, ada, edited, False, 3, "Not helpful", "It is not about running.")

    # Ada: Continue Response; she rates the whole answer
    ada.new_chat()
    sleep = ada.ask("How can I fall asleep faster?")
    longer = ada.continue_response(sleep["id"])
    s.continued.append(longer["id"])
    rate(s, admin_token, ada, longer, True, 10, "Thorough explanation", "Long, but it covers it.")

    # Bo: a typed change; he rates it and, paging back, the first answer too
    bo.new_chat()
    saving = bo.ask("How do I start saving money?")
    listed = bo.regenerate(saving["id"], typed="Use a numbered list")
    s.guided[listed["id"]] = "Use a numbered list"
    rate(s, admin_token, bo, listed, False, 2, "Too verbose", "Too long for a list.")
    shown = bo.previous_answer(listed["id"])
    assert shown["id"] == saving["id"]
    rate(s, admin_token, bo, shown, True, 6, "Positive attitude", "Friendly.")

    # Bo: a plain regenerate, continued
    bo.new_chat()
    egg = bo.ask("How long should I boil an egg?")
    again = bo.regenerate(egg["id"])
    did("try again")
    longer = bo.continue_response(again["id"])
    s.continued.append(longer["id"])
    rate(s, admin_token, bo, longer, False, 4, "Not factually correct", "Nine minutes, not this.")

    # Bo: Ada's first question, in a chat of his own
    bo.new_chat()
    basil = bo.ask("How do I keep basil alive on a windowsill?")
    rate(s, admin_token, bo, basil, True, 9, "Followed instructions perfectly", "Nice.")

    count["chats"] = 6
    count["guided regenerations"] = len(s.guided)
    count["continues"] = len(s.continued)
    count["ratings"] = len(s.ratings)
    return s


# ---------------------------------------------------------------------------- the app's side

def _cli(instance: Path, *args: str) -> str:
    env = {**os.environ, "RLHF_INSTANCE_DIR": str(instance), "RLHF_SCHEDULER": "0"}
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "webapp", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def import_file(instance: Path, path: Path) -> dict:
    """``import-feedback --format open-webui --json`` of ``path``, as an operator runs it."""
    return json.loads(_cli(instance, "import-feedback", "--format", "open-webui", "--json", str(path)))


def stored(app) -> dict:
    """Every feedback row and comparison (their values and times)."""
    with app.app_context():
        fb = {(f.user_id, f.message_id): (f.thumb, f.rating, f.comment, tuple(f.reasons or ()), f.updated_at)
              for f in db.session.scalars(db.select(Feedback))}
        votes = [(c.user_id, c.message_a_id, c.message_b_id, c.winner, c.voted_at)
                 for c in db.session.scalars(db.select(Comparison).order_by(Comparison.id))]
        return {"feedback": fb, "votes": votes}


def exchange_json(version: str, exchanges: list[dict]) -> str:
    """The recorded /v1 exchange as a file: one request and its answer a line."""
    lines = ",\n".join(json.dumps(e, ensure_ascii=False) for e in exchanges)
    return f'{{"open_webui_version": {json.dumps(version)},\n"exchanges": [\n{lines}\n]}}\n'


@dataclass
class Live:
    app: object
    session: Session
    people: list[Person]
    export: list  # the final export's records
    chats: dict  # Open WebUI's chats by id, as its API returns them
    exchanges: list
    first: dict
    second: dict
    pulls: list
    unchanged: dict
    changed: Rating
    key: str
    secrets: list[str]
    timings: dict[str, float]


@pytest.fixture(scope="module")
def live(tmp_path_factory, default_model_dir, browser):
    timings: dict[str, float] = {}
    start = time.monotonic()
    root = tmp_path_factory.mktemp("open-webui-live")
    instance = root / "instance"
    register_model(make_app(instance), default_model_dir)
    server = LiveServer(instance, env={"RLHF_MAX_NEW_TOKENS": "60"})
    proxy = RecordingProxy(server.url)
    ui: OpenWebUI | None = None
    people: list[Person] = []
    try:
        key = _cli(instance, "create-api-key", "open-webui", "--client", CLIENT, "--forwards-user-headers").strip()
        assert key.startswith("rlhf-")
        timings["app up"] = time.monotonic() - start
        mark = time.monotonic()
        ui = OpenWebUI(EXECUTABLE, root / "open-webui", proxy.url + "/v1", key, ADMIN, CONNECTION_HEADERS)
        timings["Open WebUI up"] = time.monotonic() - mark
        admin_token = ui.signin(ADMIN[1], ADMIN[2])
        ui.add_user(admin_token, *USER)
        mark = time.monotonic()
        ada = Person(ui, proxy, browser, *ADMIN, admin=True)
        bo = Person(ui, proxy, browser, *USER)
        people = [ada, bo]
        try:
            session = play(ada, bo, admin_token)
        except Exception:  # what each page showed, beside Open WebUI's log (pytest's temporary folder)
            for person in people:
                person.page.screenshot(path=str(root / f"{person.name}.png"), full_page=True)
                (root / f"{person.name}.html").write_text(person.page.content())
            raise
        timings["browser session"] = time.monotonic() - mark

        mark = time.monotonic()
        export_path = root / "export-1.json"
        export_path.write_bytes(ui.export(admin_token))
        app = make_app(instance)
        first = import_file(instance, export_path)
        before = stored(app)
        second = import_file(instance, export_path)
        unchanged = {"before": before, "after": stored(app)}
        timings["export and two imports"] = time.monotonic() - mark

        # Ada changes her mind about the answer to her edited question; the scheduler's pull takes it
        time.sleep(1.5)  # Open WebUI dates a change in whole seconds: after the import's time
        changed = next(r for r in session.ratings if r.person is ada and not r.up and r.score == 3)
        ada.open_chat(changed.chat_id)
        ada.rate(changed.answer_id, True, 7, "Attention to detail", "On second thought, fair.", admin_token)
        changed = Rating(ada, changed.answer_id, True, 7, "Attention to detail", "On second thought, fair.",
                         changed.chat_id, changed.seen)
        session.ratings = [changed if r.answer_id == changed.answer_id else r for r in session.ratings]
        mark = time.monotonic()
        admin_key = ui.api_key(admin_token)
        pull_app = make_app(instance, RLHF_OPENWEBUI_URL=ui.url, RLHF_OPENWEBUI_API_KEY=admin_key)
        with pull_app.app_context():
            pulls = [pull_tick(), pull_tick()]
        timings["two pulls"] = time.monotonic() - mark

        raw = ui.export(admin_token)
        owner = {e["headers"]["X-OpenWebUI-Chat-Id"]: e["headers"]["X-OpenWebUI-User-Id"] for e in proxy.exchanges}
        by_id = {p.user_id: p for p in people}
        chats = {cid: by_id[uid].chat(cid) for cid, uid in owner.items()}
        secrets = [key, admin_key, admin_token, ada.token, bo.token, ADMIN[2], USER[2]]
        target = RECORDING if os.environ.get("RLHF_OPEN_WEBUI_RECORD") == "1" else root / "recording"
        target.mkdir(parents=True, exist_ok=True)
        (target / "export.json").write_bytes(raw)  # as Open WebUI sent it
        (target / "chats.json").write_text(json.dumps(chats, indent=1, ensure_ascii=False) + "\n")
        (target / "exchange.json").write_text(exchange_json(ui.version(), proxy.exchanges))
        for name in ("export.json", "chats.json", "exchange.json"):
            text = (target / name).read_text()
            assert not [s for s in secrets if s in text], f"a secret in {name}"
        timings["total"] = time.monotonic() - start
        print("\nOpen WebUI live test:", ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()),
              "|", session.counts, f"| {len(proxy.exchanges)} /v1 chat completions",
              "| reloads:", [r for p in people for r in p.reloads] or "none", file=sys.__stderr__)
        yield Live(app, session, people, json.loads(raw), chats, list(proxy.exchanges), first, second, pulls,
                   unchanged, changed, key, secrets, timings)
    finally:
        for person in people:
            person.close()
        if ui is not None:
            ui.stop()
        proxy.stop()
        server.stop()


# ---------------------------------------------------------------------------- checks

def _stars(score: int) -> int:
    return math.ceil(score / 2)


def _expected(r: Rating) -> tuple:
    key = re.sub(r"[^a-z0-9]+", "_", r.reason.lower().replace("'", "")).strip("_")
    chips = [REASON_CHIPS[key]] if key in REASON_CHIPS else []
    comment = "\n".join([r.comment] + ([] if chips else [f"Reason: {REASON_LABELS[key]}"]))
    return "up" if r.up else "down", _stars(r.score), comment, chips


def test_every_rating_matched_the_answer_its_rater_saw(live):
    records = {rec["meta"]["message_id"]: rec for rec in live.export}
    assert set(records) == {r.answer_id for r in live.session.ratings}
    results = {res["id"]: res for res in live.first["results"]}
    assert live.first["matched"] == len(live.session.ratings), live.first["results"]
    with live.app.app_context():
        for r in live.session.ratings:
            record = records[r.answer_id]
            chat = live.chats[record["meta"]["chat_id"]]
            shown = chat["history"]["messages"][r.answer_id]
            asked = chat["history"]["messages"][shown["parentId"]]
            assert results[record["id"]]["matched_by"] == "message id"  # X-OpenWebUI-Message-Id
            message = db.session.get(Message, results[record["id"]]["message_id"])
            assert message.content == shown["content"].strip(), r.answer_id  # the text Open WebUI shows
            assert " ".join(message.content.split()) == " ".join(r.seen.split())  # and the page rendered
            assert db.session.get(Message, message.parent_id).content == asked["content"].strip()
            conv = message.conversation
            assert conv.external_chat_id == record["meta"]["chat_id"]
            assert conv.user.anon_id == api_anon_id(CLIENT, r.person.user_id)  # that person's conversation
            fb = db.session.scalars(db.select(Feedback).filter_by(message_id=message.id)).one()
            assert fb.user_id == conv.user_id
            assert (fb.thumb, fb.rating, fb.comment, fb.reasons or []) == _expected(r), r


def test_a_second_import_and_pull_change_nothing_and_a_changed_rating_is_taken(live):
    n = len(live.session.ratings)
    assert live.first["feedback"]["created"] == n
    assert live.second["matched"] == n and live.second["feedback"] == \
        {"created": 0, "updated": 0, "unchanged": n, "kept": 0}
    assert live.second["comparisons"]["created"] == live.second["comparisons"]["updated"] == 0
    assert live.unchanged["after"] == live.unchanged["before"]
    assert live.first["comparisons"]["created"] >= 1  # Bo rated both of his two answers to one question

    changed, again = live.pulls
    assert changed["action"] == "imported", changed
    assert changed["summary"]["feedback"] == {"created": 0, "updated": 1, "unchanged": n - 1, "kept": 0}
    assert again["action"] == "idle", again
    assert again["summary"]["feedback"] == {"created": 0, "updated": 0, "unchanged": n, "kept": 0}
    with live.app.app_context():
        user = db.session.scalars(db.select(User).filter_by(
            anon_id=api_anon_id(CLIENT, live.changed.person.user_id))).one()
        rows = {f.message.content: f for f in db.session.scalars(db.select(Feedback).filter_by(user_id=user.id))}
        chat = next(c for c in live.chats.values() if live.changed.answer_id in c["history"]["messages"])
        fb = rows[chat["history"]["messages"][live.changed.answer_id]["content"].strip()]
        assert (fb.thumb, fb.rating, fb.comment, fb.reasons or []) == _expected(live.changed)


def test_task_generation_ran_and_no_task_prompt_was_stored(live):
    tasks = [e for e in live.exchanges if is_task(e["request"])]
    prompts = {re.sub(r"\s+", " ", e["request"]["messages"][-1]["content"])[:60] for e in tasks}
    assert any("title" in p for p in prompts) and any("tags" in p for p in prompts), prompts
    with live.app.app_context():
        texts = list(db.session.scalars(db.select(Message.content)))
        titles = list(db.session.scalars(db.select(Conversation.title)))
    assert not [t for t in texts + titles if "### Task:" in t or "<chat_history>" in t]


def _tree(nodes: dict, roots: list[str]) -> list:
    """A message tree as nested [role, text, children] lists, siblings in a stable order."""
    return sorted(([nodes[i]["role"], nodes[i]["content"].strip(), _tree(nodes, nodes[i]["childrenIds"])]
                   for i in roots), key=repr)


def test_every_chat_is_one_conversation_with_open_webuis_branches(live):
    with live.app.app_context():
        for chat_id, chat in live.chats.items():
            convs = list(db.session.scalars(db.select(Conversation).filter_by(external_chat_id=chat_id)))
            assert len(convs) == 1, chat_id
            rows = {m.id: m for m in convs[0].messages}
            nodes = {i: {"role": m.role, "content": m.content,
                         "childrenIds": [c.id for c in rows.values() if c.parent_id == i]} for i, m in rows.items()}
            theirs = chat["history"]["messages"]
            assert _tree(nodes, [i for i, m in rows.items() if m.parent_id is None]) == \
                _tree(theirs, [i for i, m in theirs.items() if not m.get("parentId")]), chat_id
            for answer_id, instruction in live.session.guided.items():
                if answer_id in theirs:
                    [row] = [m for m in rows.values() if m.role == "assistant"
                             and m.content == theirs[answer_id]["content"].strip()]
                    assert row.guidance == instruction  # kept as the reason of the regeneration


def test_the_recording_holds_every_request_and_no_secret(live):
    chats = [e for e in live.exchanges if not is_task(e["request"])]
    assert len(chats) == 15 and all(e["status"] == 200 for e in live.exchanges)
    assert sum(e["request"]["messages"][-1]["role"] == "assistant" for e in chats) == len(live.session.continued)
    assert {e["request"]["messages"][-1]["content"] for e in chats} >= set(live.session.guided.values())
    for e in live.exchanges:
        assert set(e["headers"]) >= {"X-OpenWebUI-User-Id", "X-OpenWebUI-Chat-Id", *CONNECTION_HEADERS}
        assert bool(e["headers"]["X-OpenWebUI-Task"]) == is_task(e["request"])  # "title_generation", ...
        assert "Authorization" not in e["headers"]
    dump = json.dumps([live.export, live.chats, live.exchanges])
    assert not [s for s in live.secrets if s in dump]
