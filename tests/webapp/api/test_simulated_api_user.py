"""The simulated /v1 client (rlhf.sim.users.ApiUser, closed_loop.py --via openai) against a
stand-in that records what it is sent: the /v1 API's contract (models, chat completions naming the
user, feedback by completion id), with the key on every request and nothing else called."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlhf.sim.users import ApiUser, Behaviour

KEY = "rlhf-test-key"
ANSWERS = ["Happy to help. Water it when the soil is dry, and give it sun.",  # polite
           "Ugh, fine. Water it. Figure out the rest yourself."]  # rude


class FakeV1:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict | None, str | None]] = []
        self.n = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802
                outer.calls.append(("GET", self.path, None, self.headers.get("Authorization")))
                self._reply({"object": "list", "data": [{"id": "v1-base", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append(("POST", self.path, body, self.headers.get("Authorization")))
                if self.path == "/v1/chat/completions":
                    outer.n += 1
                    self._reply({"id": f"chatcmpl-{outer.n}", "object": "chat.completion", "model": body["model"],
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": ANSWERS[outer.n % 2]}}]})
                else:
                    self._reply({"completion_id": body["completion_id"], "feedback": {}})

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def v1():
    fake = FakeV1()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_an_api_user_speaks_only_the_v1_contract(v1):
    rater = ApiUser(v1.url, KEY, "polite", seed=3, behaviour=Behaviour(noise=0, rate_prob=1, regenerate_prob=1,
                                                                        flag_prob=1, chip_prob=1))
    interactions = rater.ask("How do I keep basil alive?")
    watcher = ApiUser(v1.url, KEY, "polite", seed=4, rate=False, model="v1-base")
    watched = watcher.ask("How do I keep basil alive?")

    assert {auth for *_, auth in v1.calls} == {f"Bearer {KEY}"}
    assert {path for _, path, *_ in v1.calls} == {"/v1/models", "/v1/chat/completions", "/v1/feedback"}
    completions = [body for _, path, body, _ in v1.calls if path == "/v1/chat/completions"]
    assert all(b["user"] in ("sim-3", "sim-4") and b["model"] == "v1-base" and b["stream"] is False
               and b["messages"] == [{"role": "user", "content": "How do I keep basil alive?"}] for b in completions)
    # the first answer (rude) disappoints: rated, asked again, the second (polite) rated too
    assert [(i.completion_id, i.message_id, i.events) for i in interactions] == \
        [("chatcmpl-1", None, 1), ("chatcmpl-2", None, 1)]
    feedback = [body for _, path, body, _ in v1.calls if path == "/v1/feedback"]
    assert [(f["completion_id"], f["user"], f["thumb"]) for f in feedback] == \
        [("chatcmpl-1", "sim-3", "down"), ("chatcmpl-2", "sim-3", "up")]
    assert feedback[0]["flag"] == {"category": "harassment"} and "flag" not in feedback[1]
    assert all(1 <= f["rating"] <= 5 and isinstance(f.get("reasons", []), list) for f in feedback)
    # a chat-only user rates nothing
    assert [i.events for i in watched] == [0] and len(feedback) == 2
