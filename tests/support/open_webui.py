"""A real Open WebUI for the opt-in live test (tests/integrations/test_open_webui_live.py): the
process, its users and export, and a recording proxy between it and this app's /v1 API.

Open WebUI is a separate install (a virtualenv of its own: docs/integrations/open-webui.md); the
test finds it only through ``RLHF_OPEN_WEBUI``, the path of its ``open-webui`` executable. It runs
offline, on a data folder of its own, with its defaults otherwise (task generation on).
"""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from tests.support.live_server import free_port, stop_process

ENV_VAR = "RLHF_OPEN_WEBUI"
EXPORT_PATH = "/api/v1/evaluations/feedbacks/all/export"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer",
              "upgrade", "proxy-authorization", "proxy-authenticate"}
FORWARDED_PREFIX = "x-openwebui-"


def answer_text(body: bytes, streamed: bool) -> tuple[str, list[str]]:
    """What a chat completion answered: the concatenated content of its ``chat.completion.chunk``
    events (or of a ``chat.completion`` object), and the finish reasons it gave."""
    if not streamed:
        data = json.loads(body)
        choice = data["choices"][0]
        return choice["message"]["content"] or "", [choice.get("finish_reason")]
    text, reasons = [], []
    for line in body.decode("utf-8").splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        for choice in event.get("choices") or []:
            text.append((choice.get("delta") or {}).get("content") or "")
            if choice.get("finish_reason"):
                reasons.append(choice["finish_reason"])
        if "error" in event:
            reasons.append(f"error: {event['error'].get('message')}")
    return "".join(text), reasons


class RecordingProxy:
    """Forwards every request to ``upstream`` unchanged (streams as they come) and records each
    ``POST .../chat/completions``: its JSON body, the X-OpenWebUI-* headers it carried, the HTTP
    status and the answer text the app sent. Nothing secret is recorded (no Authorization)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.exchanges: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection, the body ends when it closes

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=600)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    response = conn.getresponse()
                    self.send_response(response.status, response.reason)
                    for k, v in response.getheaders():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    self.end_headers()
                    received = bytearray()
                    while chunk := response.read1(65536):
                        received += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                finally:
                    conn.close()
                if self.command == "POST" and self.path.rstrip("/").endswith("/chat/completions"):
                    proxy._record(self.path, self.headers, body, response.status,
                                  response.getheader("Content-Type") or "", bytes(received))

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _record(self, path: str, headers, body: bytes, status: int, content_type: str, received: bytes) -> None:
        streamed = content_type.startswith("text/event-stream")
        entry: dict[str, Any] = {
            "path": path,
            "headers": {k: v for k, v in headers.items() if k.lower().startswith(FORWARDED_PREFIX)},
            "request": json.loads(body), "status": status, "streamed": streamed}
        if status == 200:
            entry["answer"], entry["finish_reasons"] = answer_text(received, streamed)
        else:
            entry["error"] = json.loads(received).get("error")
        with self._lock:
            self.exchanges.append(entry)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class OpenWebUI:
    """``open-webui serve`` on a free port of 127.0.0.1 with a data folder in ``data_dir``: offline,
    its first admin made from the environment, the OpenAI connection ``openai_url`` with ``api_key``
    (and ``headers``: the connection's custom headers, ``{{...}}`` variables filled in per request),
    user headers forwarded, every model visible to every user."""

    def __init__(self, executable: str, data_dir: Path, openai_url: str, api_key: str,
                 admin: tuple[str, str, str], headers: dict[str, str] | None = None, timeout: float = 240.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / "open-webui.log"
        name, email, password = admin
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data_dir), "LANG": "C.UTF-8",
            "DATA_DIR": str(data_dir), "WEBUI_SECRET_KEY": "live-test-only-secret",
            "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "ENABLE_VERSION_UPDATE_CHECK": "false",
            "ENABLE_OLLAMA_API": "false", "RAG_EMBEDDING_ENGINE": "openai",  # no embedding model to load
            "OPENAI_API_BASE_URL": openai_url, "OPENAI_API_KEY": api_key,
            "ENABLE_FORWARD_USER_INFO_HEADERS": "true", "BYPASS_MODEL_ACCESS_CONTROL": "true",
            "ENABLE_API_KEYS": "true",  # the scheduler's pull signs in with an admin's API key
            "WEBUI_ADMIN_NAME": name, "WEBUI_ADMIN_EMAIL": email, "WEBUI_ADMIN_PASSWORD": password,
            "ENABLE_COMMUNITY_SHARING": "false",
            **({"OPENAI_API_CONFIGS": json.dumps({"0": {"headers": headers}})} if headers else {}),
            "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "true", "ANONYMIZED_TELEMETRY": "false",
        }
        self._log = open(self.log_path, "wb")
        # cwd: `serve` writes a .webui_secret_key file there when WEBUI_SECRET_KEY is unset
        self.proc = subprocess.Popen([executable, "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                                     cwd=data_dir, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Open WebUI exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if requests.get(self.url + "/health", timeout=2).ok:
                    return
            except (requests.ConnectionError, requests.Timeout):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"Open WebUI did not come up in {timeout}s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc, grace=15)
        self._log.close()

    # ------------------------------------------------------------------ its API, as a signed-in user

    def signin(self, email: str, password: str) -> str:
        r = requests.post(self.url + "/api/v1/auths/signin", json={"email": email, "password": password}, timeout=30)
        r.raise_for_status()
        return r.json()["token"]

    def add_user(self, admin_token: str, name: str, email: str, password: str, role: str = "user") -> dict:
        r = requests.post(self.url + "/api/v1/auths/add", headers={"Authorization": f"Bearer {admin_token}"},
                          json={"name": name, "email": email, "password": password, "role": role}, timeout=30)
        r.raise_for_status()
        return r.json()

    def api_key(self, token: str) -> str:
        """A new API key of the signed-in user (``sk-...``)."""
        r = requests.post(self.url + "/api/v1/auths/api_key", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        r.raise_for_status()
        return r.json()["api_key"]

    def get(self, token: str, path: str) -> Any:
        r = requests.get(self.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        r.raise_for_status()
        return r.json()

    def version(self) -> str:
        return requests.get(self.url + "/api/version", timeout=30).json()["version"]

    def export(self, admin_token: str) -> bytes:
        """The admin export of every feedback record, as Open WebUI sends it."""
        r = requests.get(self.url + EXPORT_PATH, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60)
        r.raise_for_status()
        return r.content


# ---------------------------------------------------------------------------- a person in Chromium

def wait_for(predicate, timeout: float, what: str, interval: float = 0.3):
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError naming
    ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    assert value, f"timed out after {timeout:g} s waiting for {what}"
    return value


def is_task(request: dict) -> bool:
    """One of Open WebUI's own task requests (title, tags, follow-ups...): its prompt opens with
    "### Task:" (the templates of 0.12.4 that run with default settings)."""
    return any(isinstance(m.get("content"), str) and m["content"].lstrip().startswith("### Task:")
               for m in request.get("messages") or [])


class Person:
    """One Open WebUI user in a browser context of their own: signs in, chats, regenerates,
    continues, edits and rates through the page, and waits for each answer to be shown and saved
    (Open WebUI's own API, with the person's session token, says what the page shows)."""

    ANSWER_TIMEOUT = 240.0  # an answer and the task requests around it, on a busy 2-core machine

    def __init__(self, ui: OpenWebUI, proxy: RecordingProxy, browser, name: str, email: str, password: str,
                 admin: bool = False):
        self.ui, self.proxy, self.name, self.email = ui, proxy, name, email
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(60_000)
        self.page.goto(ui.url + "/auth")
        self.page.fill("input[name=email]", email)
        self.page.fill("input[name=password]", password)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.locator("#chat-input").wait_for()
        self.token = self.page.evaluate("localStorage.token")
        self.user_id = ui.get(self.token, "/api/v1/auths/")["id"]
        if admin:  # an admin's first visit opens the release notes over the page
            self.page.get_by_role("button", name="Okay, Let's Go!").click()
        self.chat_id: str | None = None
        self.reloads: list[str] = []

    def close(self) -> None:
        self.context.close()

    # -- what Open WebUI holds

    def chat(self, chat_id: str | None = None) -> dict:
        """The chat as Open WebUI stores it (``history.messages``, ``history.currentId``)."""
        return self.ui.get(self.token, f"/api/v1/chats/{chat_id or self.chat_id}")["chat"]

    def shown(self) -> dict:
        """The message the chat shows last (its current answer)."""
        history = self.chat()["history"]
        return history["messages"][history["currentId"]]

    def _chats_sent(self) -> list[dict]:
        return [e for e in self.proxy.exchanges if not is_task(e["request"])
                and e["headers"].get("X-OpenWebUI-User-Id") == self.user_id]

    def _answered(self, before: int) -> dict:
        """Waits for the chat request sent after ``before`` ones, its answer shown and saved."""
        exchange = wait_for(lambda: self._chats_sent()[before] if len(self._chats_sent()) > before else None,
                            self.ANSWER_TIMEOUT, f"{self.name}'s chat request to be answered")
        assert exchange["status"] == 200, exchange
        self.chat_id = exchange["headers"]["X-OpenWebUI-Chat-Id"]
        text = exchange["answer"].strip()

        def saved() -> dict | None:
            m = self.shown()
            return m if m["role"] == "assistant" and m.get("done") and m["content"].strip().endswith(text) else None

        message = wait_for(saved, 60, f"{self.name}'s answer to be saved in Open WebUI")
        self.message(message["id"]).get_by_role("button", name="Regenerate").wait_for()
        return message

    # -- what the person does

    def message(self, message_id: str):
        return self.page.locator(f"#message-{message_id}")

    def new_chat(self) -> None:
        self.page.goto(self.ui.url + "/")
        self.page.locator("#chat-input").wait_for()
        self.chat_id = None

    def open_chat(self, chat_id: str) -> None:
        """The chat's page, its last answer shown."""
        self.page.goto(f"{self.ui.url}/c/{chat_id}")
        self.chat_id = chat_id
        self.message(self.shown()["id"]).get_by_role("button", name="Regenerate").wait_for()

    def ask(self, text: str) -> dict:
        before = len(self._chats_sent())
        self.page.locator("#chat-input").click()
        self.page.keyboard.type(text)
        self.page.locator("#send-message-button").click()
        return self._answered(before)

    def regenerate(self, answer_id: str, how: str | None = None, typed: str | None = None) -> dict:
        """The regenerate menu of an answer: "Try Again" (``how`` None), a listed change ("More
        Concise", "Add Details") or a ``typed`` one."""
        before = len(self._chats_sent())
        self.message(answer_id).get_by_role("button", name="Regenerate").click()
        if typed is not None:
            self.page.locator("#floating-message-input").fill(typed)
            self.page.keyboard.press("Enter")
        else:
            self.page.get_by_role("button", name=how or "Try Again", exact=True).click()
        return self._answered(before)

    def continue_response(self, answer_id: str) -> dict:
        before = len(self._chats_sent())
        self.message(answer_id).get_by_role("button", name="Continue Response").click()
        return self._answered(before)

    def edit_question(self, question_id: str, text: str) -> dict:
        before = len(self._chats_sent())
        question = self.message(question_id)
        question.hover()
        question.get_by_role("button", name="Edit").click()
        self.page.locator(f"#message-edit-{question_id}").fill(text)
        self.page.locator("#confirm-edit-message-button").click()
        return self._answered(before)

    def previous_answer(self, answer_id: str) -> dict:
        """Pages back to the answer before ``answer_id`` among its siblings (the "<" under it)."""
        self.message(answer_id).get_by_role("button", name="Previous message").click()
        parent = self.chat()["history"]["messages"][answer_id]["parentId"]
        siblings = self.chat()["history"]["messages"][parent]["childrenIds"]
        shown = siblings[siblings.index(answer_id) - 1]
        self.message(shown).get_by_role("button", name="Regenerate").wait_for()
        return self.chat()["history"]["messages"][shown]

    def seen_text(self, answer_id: str) -> str:
        """The answer's text as the page renders it."""
        return self.message(answer_id).locator("#response-content-container").inner_text()

    def rate(self, answer_id: str, up: bool, score: int, reason: str, comment: str, admin_token: str) -> dict:
        """Thumbs up or down, then the 1-10 score, a reason and a comment, saved; waits until the
        admin export holds the record with these values and returns it."""
        thumb = 1 if up else -1
        first = "tags" not in (self.chat()["history"]["messages"][answer_id].get("annotation") or {})
        self._thumb(answer_id, "Good Response" if up else "Bad Response")
        if first:
            # A first thumb asks the task model for tags, then writes the record again with the
            # annotation it had at the thumb: a score, reason and comment saved before the tags came
            # back are overwritten (Open WebUI 0.12.4). A person is slower than that; so is this.
            wait_for(lambda: self._record(admin_token, answer_id, lambda r: r["data"].get("rating") == thumb
                                          and "tags" in r["data"]), self.ANSWER_TIMEOUT,
                     f"the tags of {self.name}'s rating of {answer_id}")
        form = self.page.locator(f"#message-feedback-{answer_id}")
        form.get_by_role("button", name=f"Rate {score} out of 10", exact=True).click()
        form.get_by_role("button", name=reason, exact=True).click()
        form.get_by_label("Additional feedback comments").fill(comment)
        form.get_by_role("button", name="Save", exact=True).click()

        def saved(record: dict) -> bool:
            data = record["data"]
            return (data.get("rating") == thumb and (data.get("details") or {}).get("rating") == score
                    and data.get("comment") == comment)

        return wait_for(lambda: self._record(admin_token, answer_id, saved), 60,
                        f"{self.name}'s rating of {answer_id} in Open WebUI's export")

    def _thumb(self, answer_id: str, name: str) -> None:
        """Clicks the answer's thumb. Once in a few runs Open WebUI 0.12.4's page, after a Continue
        Response, shows the answer without its rating buttons (its saved chat is complete); the
        person then reloads the chat, as anyone would, and that is noted in ``self.reloads``."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        for attempt in (1, 2):
            answer = self.message(answer_id)
            try:
                answer.hover(timeout=20_000)
                answer.get_by_role("button", name=name).click(timeout=20_000)
                return
            except PlaywrightTimeout:
                if attempt == 2:
                    raise
                self.reloads.append(f"{name} of {answer_id}: no button; chat reloaded")
                self.open_chat(self.chat_id)

    def _record(self, admin_token: str, answer_id: str, check) -> dict | None:
        """The export's record of ``answer_id`` when ``check`` holds for it."""
        for record in json.loads(self.ui.export(admin_token)):
            if record["meta"]["message_id"] == answer_id and check(record):
                return record
        return None
