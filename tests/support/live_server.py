"""Start the real production server (``flask --app webapp serve``) in a child process.

:class:`LiveServer` serves an instance folder as it is; :func:`live_instance` is the one way a test
sets one up first (the app's tables, a model registered as the active version, the test's own rows)
and serves it; :func:`chat_server_fixture` is that on the embedded default model as a fixture,
:func:`v1_server_fixture` on the micro model with /v1 API keys.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import requests

from tests.support.paths import ROOT  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM (a server finishes its requests and exits), SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LiveServer:
    def __init__(self, instance: Path, env: dict[str, str] | None = None, timeout: float = 120.0,
                 args: list[str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(instance) / "server.log"
        Path(instance).mkdir(parents=True, exist_ok=True)
        # the scheduler (on by default in `serve`) only where a test asks for it
        # (and, as in make_app, no limit on new identities: tests play many visitors from 127.0.0.1)
        full_env = {**os.environ, "RLHF_INSTANCE_DIR": str(instance), "PYTHONUNBUFFERED": "1",
                    "RLHF_SCHEDULER": "0", "RLHF_NEW_IDENTITIES_PER_HOUR": "0", **(env or {})}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "webapp", "serve", "--port", str(self.port), *(args or [])],
            cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/api/health", timeout=2).ok:
                    return
            except (requests.ConnectionError, requests.Timeout):  # not up yet, or busy starting (loaded machine)
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"server did not come up in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@dataclass
class LiveInstance:
    server: LiveServer
    app: Any  # the test's own Flask app on the same instance folder (to read what the server stored)
    instance: Path
    prepared: Any = None  # what ``prepare`` returned


@contextmanager
def live_instance(instance: Path, model_dir: Path, prepare: Callable[[Any], Any] | None = None,
                  env: dict[str, str] | None = None, args: list[str] | None = None) -> Iterator[LiveInstance]:
    """The production server on a new instance folder: tables made, ``model_dir`` registered as the
    active version, then ``prepare(app)`` run in an app context (rows, keys, an admin account: what it
    returns is ``prepared``); the server is stopped on the way out."""
    from tests.support.app import make_app, register_model
    from webapp.core.extensions import db

    app = make_app(instance)
    register_model(app, model_dir)
    with app.app_context():
        prepared = prepare(app) if prepare else None
        db.engine.dispose()  # the server opens its own connections
    server = LiveServer(instance, env=env, args=args)
    try:
        yield LiveInstance(server, app, Path(instance), prepared)
    finally:
        server.stop()


def chat_server_fixture(name: str):
    """A module-scoped fixture: the production server on the embedded default model, in a fresh
    instance folder; yields (server, instance)."""
    import pytest

    @pytest.fixture(scope="module")
    def chat_server(tmp_path_factory, default_model_dir):
        with live_instance(tmp_path_factory.mktemp(name) / "instance", default_model_dir) as live:
            yield live.server, live.instance

    return chat_server


def v1_server_fixture(name: str):
    """A module-scoped fixture: the production server on the micro model (answers of at most 60 tokens)
    in a fresh instance folder, with /v1 API keys: "sdk", "front-a" and "front-b" (one front end,
    "front"), "limited" (2 per hour), "doomed"; yields (server, instance, {key name: key})."""
    import pytest

    @pytest.fixture(scope="module")
    def live(tmp_path_factory, micro_model_dir):
        from webapp.openai_api.keys import create_api_key

        def keys(app):
            return {name: create_api_key(name, client, rate_limit=limit)[1] for name, client, limit in
                    (("sdk", None, None), ("front-a", "front", None), ("front-b", "front", None),
                     ("limited", None, "2 per hour"), ("doomed", None, None))}

        with live_instance(tmp_path_factory.mktemp(name) / "instance", micro_model_dir, keys,
                           env={"RLHF_EMBEDDED_PRESET": "micro", "RLHF_MAX_NEW_TOKENS": "60"}) as live:
            yield live.server, live.instance, live.prepared

    return live
