"""The /v1 API as a client sees it: the production server (tests/support/live_server.py) driven by the
official ``openai`` package -- models, streamed and whole completions, usage, ``stop``,
``max_completion_tokens``, a client that goes away mid-stream, feedback by completion id, and the
SDK's own exceptions for a bad key, a bad request, a used-up rate limit and an unknown model."""
from __future__ import annotations

import threading
import time

import openai
import pytest
from openai import OpenAI

from tests.support.app import flask_cli, make_app, register_model
from tests.support.live_server import v1_server_fixture
from webapp.core.extensions import db
from webapp.core.models import Message
from webapp.openai_api.keys import create_api_key

MODEL = "rlhf-chat"
RICE = [{"role": "user", "content": "How do I cook rice?"}]
SEEDED = {"seed": 0, "temperature": 1.0, "top_p": 1.0}  # a sampled answer, the same every time


live = v1_server_fixture("v1-sdk")


def sdk(live, key: str = "sdk") -> OpenAI:
    server, _, keys = live
    return OpenAI(base_url=server.url + "/v1", api_key=keys.get(key, key), max_retries=0, timeout=60)


def stored(live, completion_id: str) -> Message | None:
    app = make_app(live[1])
    with app.app_context():
        try:
            return db.session.scalars(db.select(Message).filter_by(completion_id=completion_id)).first()
        finally:
            db.session.remove()
            db.engine.dispose()


def test_models(live):
    client = sdk(live)
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("v1-base")


def test_a_whole_completion_with_usage(live):
    raw = sdk(live).chat.completions.with_raw_response.create(model=MODEL, messages=RICE, user="ann", **SEEDED)
    assert "set-cookie" not in raw.headers
    out = raw.parse()
    assert out.id.startswith("chatcmpl-") and out.model == MODEL and out.object == "chat.completion"
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 60 and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    answer = stored(live, out.id)
    assert answer.content == choice.message.content and answer.token_count == 60


def test_a_streamed_completion_with_usage(live):
    chunks = list(sdk(live).chat.completions.create(model=MODEL, messages=RICE, stream=True, user="ann",
                                                    stream_options={"include_usage": True}, **SEEDED))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and {c.model for c in chunks} == {MODEL}
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 60
    whole = sdk(live).chat.completions.create(model=MODEL, messages=RICE, **SEEDED)
    assert text.strip() == whole.choices[0].message.content == stored(live, chunks[0].id).content
    # without include_usage there is no usage chunk
    plain = list(sdk(live).chat.completions.create(model=MODEL, messages=RICE, stream=True, max_tokens=3))
    assert all(c.choices for c in plain) and all(c.usage is None for c in plain)


def test_stop_and_max_completion_tokens(live):
    client = sdk(live)
    text = client.chat.completions.create(model=MODEL, messages=RICE, **SEEDED).choices[0].message.content
    short = client.chat.completions.create(model=MODEL, messages=RICE, max_completion_tokens=5, **SEEDED)
    assert short.usage.completion_tokens == 5 and short.choices[0].finish_reason == "length"
    assert text.startswith(short.choices[0].message.content)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = client.chat.completions.create(model=MODEL, messages=RICE, stop=[stop, "zzzz"], **SEEDED)
    assert cut.choices[0].message.content == text[:text.index(stop)].strip()
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens < 60
    streamed = client.chat.completions.create(model=MODEL, messages=RICE, stop=stop, stream=True, **SEEDED)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices).strip() == \
        cut.choices[0].message.content


def test_a_client_that_goes_away_mid_stream_stops_the_generation(tmp_path, micro_model_dir, monkeypatch):
    """The answer's generation ends when its client goes away: the row is cancelled, far short of the
    answer it would have become. The app is served in this process (werkzeug's threaded server, a
    real socket) so that the test can gate the model's worker: the answer's row reaches the worker
    only after the client has read the stream's first event and hung up, whatever the machine's
    speed."""
    from werkzeug.serving import make_server

    from rlhf.generation.batcher import _Batcher

    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=80)
    register_model(app, micro_model_dir)
    with app.app_context():
        key = create_api_key("quitter", None)[1]
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key=key, max_retries=0, timeout=60)
        full = client.chat.completions.create(model=MODEL, messages=RICE, **SEEDED)
        assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens >= 60  # a long answer
        rows, gone = [], threading.Event()
        submit = _Batcher.submit

        def gated(batcher, row):  # whichever model worker takes the row: it waits for the hang-up
            rows.append(row)
            assert gone.wait(60), "the client never hung up"
            submit(batcher, row)

        monkeypatch.setattr(_Batcher, "submit", gated)
        stream = client.chat.completions.create(model=MODEL, messages=RICE, stream=True, user="quitter", **SEEDED)
        first = next(iter(stream))
        assert first.choices[0].delta.role == "assistant"
        stream.close()  # the connection is closed before the answer's first token
        gone.set()
        deadline = time.monotonic() + 60
        while not rows and time.monotonic() < deadline:  # the request's thread reached the worker
            time.sleep(0.05)
        assert len(rows) == 1, rows
        row = rows[0]
        assert row.finished.wait(60), "the generation never ended"
        assert row.finish == "cancelled" and len(row.ids) < full.usage.completion_tokens, (row.finish, len(row.ids))
        assert client.chat.completions.create(model=MODEL, messages=RICE, max_tokens=2).choices  # still serving
    finally:
        server.shutdown()
        with app.app_context():
            db.engine.dispose()


def test_feedback_by_completion_id(live):
    client = sdk(live, "front-a")
    out = client.chat.completions.create(model=MODEL, messages=RICE, max_tokens=4,
                                         extra_body={"user": {"id": "ann", "name": "Ann"}})  # Open WebUI's form
    body = client.post("/feedback", cast_to=object, body={"completion_id": out.id, "thumb": "up", "rating": 5,
                                                          "user": "ann"})
    assert body["completion_id"] == out.id and body["feedback"]["thumb"] == "up" and body["feedback"]["rating"] == 5
    with pytest.raises(openai.NotFoundError):  # a key of the same front end, but not the one that produced it
        sdk(live, "front-b").post("/feedback", cast_to=object, body={"completion_id": out.id, "thumb": "down"})
    with pytest.raises(openai.BadRequestError):
        client.post("/feedback", cast_to=object, body={"completion_id": out.id, "rating": 9})


def test_the_sdks_exceptions(live, monkeypatch):
    with pytest.raises(openai.AuthenticationError) as wrong:
        sdk(live, "rlhf-not-a-key").models.list()
    assert wrong.value.status_code == 401 and wrong.value.code == "invalid_api_key"
    doomed = sdk(live, "doomed")
    assert doomed.models.list()
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(live[1]))
    assert flask_cli("revoke-api-key", "doomed").exit_code == 0  # another process revokes it
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        doomed.models.list()

    client = sdk(live)
    for bad in ({"n": 2}, {"temperature": 3}, {"max_completion_tokens": 0}, {"stop": ["a"] * 5}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=RICE, **bad)
        assert refused.value.status_code == 400 and refused.value.param == next(iter(bad))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "assistant", "content": "Hi."}])
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=RICE)
    assert missing.value.code == "model_not_found"

    limited = sdk(live, "limited")  # "2 per hour"
    assert limited.models.list() and limited.chat.completions.create(model=MODEL, messages=RICE, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as limit:
        limited.models.list()
    assert 0 < int(limit.value.response.headers["retry-after"]) <= 3600
    assert client.models.list()  # the other keys have their own limits



@pytest.mark.parametrize("raw", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-OpenWebUI-Chat-Id: a\x01b\r\nContent-Length: 0\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n",
    b"GET /v1/models\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_a_request_the_server_cannot_parse_gets_an_openai_shaped_error(live, raw):
    """gunicorn refuses these before the app sees them; its answer is JSON in OpenAI's error shape
    (it was an HTML page), so a client reads every /v1 error the same way."""
    import json
    import socket

    server = live[0]
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *headers = head.decode("latin-1").split("\r\n")
    assert status_line.startswith("HTTP/1.1 400 "), status_line
    assert "Content-Type: application/json" in headers
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("Bad Request")
    assert set(error) == {"message", "type", "param", "code"}
