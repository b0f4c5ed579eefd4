"""Generation on an OpenAI-compatible inference server (vLLM, or ``rlhf.generation.openai_server``).

The same interface as in-process generation: :class:`RemotePool` stands in for ``ModelPool``
(``get(path, name)`` -> a :class:`RemoteModel`, a ``LoadedModel`` without weights), and
``stream_chat`` / ``generate_chat`` / ``generate_chats`` (``stream``) accept a ``RemoteModel``
and return the same ``StreamHandle`` and ``GenerationResult``.

What stays here: the prompt is rendered and fitted to the context with the version's own
tokenizer and chat template (``pool.fit_to_context``) and sent as token ids, so the server sees
exactly the tokens in-process generation would; the answer's text goes through the same
stop-string cut as in-process answers (``rows.Row``), and the template's stop strings and
end-of-turn ids are sent along (``stop``, ``stop_token_ids``) so the server stops there too.

What the server does: the forward passes and sampling, one request per answer on
``POST /v1/completions`` with ``stream: true`` (server-sent events). The model name of a request
is the version's name: the base version is the model the server serves (matched by name or by
its path, ``root`` in ``/v1/models``); a LoRA adapter version is registered at the server when it
is first served (``POST /v1/load_lora_adapter``; vLLM needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``)
and is then chosen per request by its name. The server must read the model store at the same
paths as this process. A full-weights version other than the served base cannot be served there:
``get`` raises ``ModelLoadError`` and the web app serves a fallback, as for a broken directory.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import requests
import torch

from rlhf.generation.batcher import DEFAULT_TOP_K, BatchStats, worker_of
from rlhf.generation.pool import GenerationSettings, LoadedModel
from rlhf.generation.rows import Done, Row
from rlhf.models.adapters import base_of, is_adapter
from rlhf.models.chat_format import prepare_tokenizer
from rlhf.models.loading import ModelLoadError

CONNECT_TIMEOUT_S = 5.0


class InferenceServerError(RuntimeError):
    """The inference server could not be reached, or refused or broke off a request (``status``:
    the HTTP status of a refusal)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class InferenceServerUnavailable(InferenceServerError):
    """The inference server cannot be reached at all (not a problem of one version)."""


def _error_text(resp: requests.Response) -> str:
    """The message of an error response (vLLM: ``{"message": ...}`` or ``{"error": {"message": ...}}``)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:300] or resp.reason
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        return str(inner.get("message") or inner.get("detail") or body)[:300]
    return str(body)[:300]


class InferenceClient:
    """The HTTP calls to one OpenAI-compatible server."""

    def __init__(self, url: str, timeout: float = 120.0, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            return requests.request(method, self.url + path, headers=self.headers,
                                    timeout=(CONNECT_TIMEOUT_S, kwargs.pop("timeout", self.timeout)), **kwargs)
        except requests.ConnectionError as exc:
            raise InferenceServerUnavailable(f"the inference server at {self.url} cannot be reached "
                                             f"({type(exc).__name__})") from exc
        except requests.Timeout as exc:
            raise InferenceServerUnavailable(f"the inference server at {self.url} did not answer in time") from exc

    def models(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """``GET /v1/models``: what the server serves (base models and loaded adapters)."""
        resp = self._call("GET", "/v1/models", timeout=timeout or self.timeout)
        if not resp.ok:
            raise InferenceServerUnavailable(f"the inference server at {self.url} answered "
                                             f"{resp.status_code} to /v1/models: {_error_text(resp)}")
        return list(resp.json().get("data") or [])

    def load_adapter(self, name: str, path: str) -> None:
        resp = self._call("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        if not resp.ok and "already" not in _error_text(resp).lower():
            raise ModelLoadError(f"adapter version {name}: the inference server refused to load it "
                                 f"({resp.status_code}: {_error_text(resp)})")

    def unload_adapter(self, name: str) -> None:
        resp = self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": name})
        if not resp.ok and resp.status_code != 404:
            raise InferenceServerError(f"unloading {name}: {resp.status_code}: {_error_text(resp)}")

    def complete(self, body: dict[str, Any]) -> requests.Response:
        """``POST /v1/completions`` with ``stream: true``; the open response (raises on an error status)."""
        resp = self._call("POST", "/v1/completions", json=body, stream=True)
        if not resp.ok:
            text = _error_text(resp)
            resp.close()
            raise InferenceServerError(f"the inference server answered {resp.status_code}: {text}", resp.status_code)
        return resp


@dataclass
class RemoteModel(LoadedModel):
    """A version served by the inference server: its tokenizer here, its weights there."""

    client: InferenceClient | None = None
    served_name: str = ""  # the model name of its requests
    adapter_path: str | None = None  # a LoRA version: its directory (registered again if the server forgot it)
    max_model_len: int | None = None
    top_k: int = DEFAULT_TOP_K

    @property
    def context_window(self) -> int:
        if self.max_model_len:
            return self.max_model_len
        return super().context_window


class _Config:
    """Stands in for ``model.config`` (``LoadedModel.context_window`` reads it)."""

    def __init__(self, cfg: Any) -> None:
        self.__dict__.update({k: getattr(cfg, k) for k in ("n_positions", "max_position_embeddings", "n_ctx")
                              if isinstance(getattr(cfg, k, None), int)})


class _NoWeights:
    """``RemoteModel.model``: the config only (the weights are on the server)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoConfig, GenerationConfig

        self.config = _Config(AutoConfig.from_pretrained(path))
        try:
            self.generation_config = GenerationConfig.from_pretrained(path)
        except OSError:
            self.generation_config = None


def _same_dir(a: str | Path | None, b: str | Path) -> bool:
    try:
        return a is not None and Path(str(a)).resolve() == Path(str(b)).resolve()
    except OSError:
        return False


class RemotePool:
    """``ModelPool``'s interface for versions served by an inference server. ``get`` checks that
    the server can serve the version (registering a LoRA adapter there first) and loads its
    tokenizer here; it raises ``ModelLoadError`` for a version the server cannot serve and
    ``InferenceServerUnavailable`` when the server cannot be reached."""

    def __init__(self, url: str, timeout: float = 120.0, api_key: str | None = None) -> None:
        self.client = InferenceClient(url, timeout, api_key)
        self.device = torch.device("cpu")
        self._models: dict[str, RemoteModel] = {}
        self._lock = threading.Lock()

    def get(self, path: str | Path, name: str | None = None) -> RemoteModel:
        key = str(path)
        found = self._models.get(key)
        if found is not None:
            return found
        with self._lock:
            if key not in self._models:
                self._models[key] = self._register(key, name or Path(key).name)
        return self._models[key]

    def loaded(self) -> list[str]:
        return list(self._models)

    def forget(self, path: str | Path) -> None:
        """Unload a LoRA version at the server (a retired version); a no-op for others."""
        model = self._models.pop(str(path), None)
        if model is not None and model.adapter_path is not None:
            self.client.unload_adapter(model.served_name)

    def _register(self, key: str, name: str) -> RemoteModel:
        from transformers import AutoTokenizer

        served = self.client.models()
        adapter = is_adapter(key)
        base_dir = str(base_of(key)) if adapter else key
        base = next((m for m in served if m.get("id") == name and not adapter), None) or \
            next((m for m in served if _same_dir(m.get("root"), base_dir) and not m.get("parent")), None)
        if base is None:
            names = ", ".join(str(m.get("id")) for m in served) or "nothing"
            what = f"its base {Path(base_dir).name!r}" if adapter else "it"
            raise ModelLoadError(f"version {name}: the inference server at {self.client.url} does not serve "
                                 f"{what} (it serves {names}); start it on {base_dir}")
        if adapter:
            if not any(m.get("id") == name for m in served):
                self.client.load_adapter(name, str(Path(key).resolve()))
            served_name = name
        else:
            served_name = str(base["id"])
        try:
            tokenizer = AutoTokenizer.from_pretrained(key if (Path(key) / "tokenizer_config.json").is_file()
                                                      else base_dir)
            prepare_tokenizer(tokenizer)  # as load_causal_lm does in-process: the same chat template
            weights = _NoWeights(base_dir)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"version {name}: its tokenizer or config cannot be read: {exc}") from exc
        top_k = getattr(weights.generation_config, "top_k", None)
        return RemoteModel(name, weights, tokenizer, self.device, client=self.client, served_name=served_name,
                           adapter_path=str(Path(key).resolve()) if adapter else None,
                           max_model_len=base.get("max_model_len"),
                           top_k=DEFAULT_TOP_K if top_k is None else int(top_k))

    def check(self) -> str | None:
        """Why the server cannot serve right now (None: it answers ``/v1/models``)."""
        try:
            self.client.models(timeout=3.0)
        except InferenceServerError as exc:
            return str(exc)
        return None


# ---------------------------------------------------------------------------- one answer

def _events(resp: requests.Response) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to ``data: [DONE]``."""
    for line in resp.iter_lines(decode_unicode=False):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        event = json.loads(data)
        if "error" in event and not event.get("choices"):
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise InferenceServerError(f"the inference server failed: {message}")
        yield event


def request_body(model: RemoteModel, row: Row) -> dict[str, Any]:
    """The ``/v1/completions`` request of one answer: the prompt as token ids, the version's name,
    sampling as in-process generation does it (temperature 0: greedy, a seed passed on), its stops."""
    s: GenerationSettings = row.settings
    seed = {"seed": s.seed} if s.seed is not None and s.do_sample else {}
    return {**seed, "model": model.served_name, "prompt": row.prompt_ids, "max_tokens": s.max_new_tokens,
            "temperature": s.temperature if s.do_sample else 0.0, "top_p": s.top_p if s.do_sample else 1.0,
            "top_k": model.top_k if s.do_sample else -1, "stop": list(row.stops),
            "stop_token_ids": sorted(row.ends), "skip_special_tokens": True, "stream": True,
            "stream_options": {"include_usage": True}}


class RemoteWorker:
    """What ``StreamHandle`` submits a row to for a ``RemoteModel`` (the batcher's interface): one
    thread per answer that streams it from the server into the row's queue."""

    def __init__(self, model: RemoteModel) -> None:
        self.model = model
        self.stats = BatchStats()
        self._responses: dict[int, requests.Response] = {}
        self._lock = threading.Lock()

    def submit(self, row: Row) -> None:
        self.stats.requests += 1
        row.chunks_seen = 0  # type: ignore[attr-defined]  # text events received: the token count if no usage comes
        threading.Thread(target=self._run, args=(row,), name=f"remote-{self.model.name}", daemon=True).start()

    def withdraw(self, row: Row) -> None:
        """Stop ``row`` now (the reader went away): finish it as cancelled and drop the connection,
        which makes the server abort the request."""
        row.cancel.set()
        self._end(row, "cancelled")
        with self._lock:
            resp = self._responses.pop(id(row), None)
        if resp is not None:
            try:
                resp.raw._fp.fp.raw._sock.shutdown(2)  # wake the reading thread at once (SHUT_RDWR)
            except (AttributeError, OSError):
                pass

    def _end(self, row: Row, finish: str, tokens: int | None = None) -> None:
        """Hand out the held-back text, then how the answer ended (as ``Row.close``)."""
        with self._lock:
            if row.finished.is_set():
                return
            text = row.text.rstrip()
            if len(text) > row.emitted:
                row.out.put(text[row.emitted:])
            count = tokens if tokens is not None else row.chunks_seen  # type: ignore[attr-defined]
            row.done = Done(count, finish, text)
            row.finished.set()
            row.out.put(row.done)

    def _fail(self, row: Row, exc: BaseException) -> None:
        with self._lock:
            row.fail(exc)

    def _open(self, row: Row) -> requests.Response:
        body = request_body(self.model, row)
        try:
            return self.model.client.complete(body)
        except InferenceServerError as exc:
            # the server forgot a LoRA version (it restarted): register it again, once
            if self.model.adapter_path is None or exc.status != 404:
                raise
            self.model.client.load_adapter(self.model.served_name, self.model.adapter_path)
            return self.model.client.complete(body)

    def _run(self, row: Row) -> None:
        try:
            resp = self._open(row)
        except Exception as exc:
            self._fail(row, exc)
            return
        with self._lock:
            self._responses[id(row)] = resp
        finish, tokens = "eos", None
        try:
            for event in _events(resp):
                if row.cancel.is_set():
                    break
                if event.get("usage") and event["usage"].get("completion_tokens") is not None:
                    tokens = int(event["usage"]["completion_tokens"])
                for choice in event.get("choices") or []:
                    piece = choice.get("text") or ""
                    if piece:
                        row.chunks_seen += 1  # type: ignore[attr-defined]
                        with self._lock:
                            if row.finished.is_set():
                                break
                            row._add(piece)
                    reason = choice.get("finish_reason")
                    if reason == "length":
                        finish = "length"
                    elif reason == "stop":
                        finish = "stop_string" if isinstance(choice.get("stop_reason"), str) else "eos"
                if row.finish == "stop_string":  # cut here (a server that ignored ``stop``)
                    finish = "stop_string"
                    break
            self._end(row, "cancelled" if row.cancel.is_set() else finish, tokens)
        except Exception as exc:
            if row.cancel.is_set():
                self._end(row, "cancelled")
            else:
                self._fail(row, InferenceServerError(f"the answer broke off: {exc}") if not
                           isinstance(exc, InferenceServerError) else exc)
        finally:
            with self._lock:
                self._responses.pop(id(row), None)
            resp.close()


def remote_worker(model: RemoteModel) -> RemoteWorker:
    """The worker of ``model`` (one per model, created on first use)."""
    return worker_of(model, "_worker", RemoteWorker)


def wait_ready(url: str, timeout: float, proc: Any = None) -> list[dict[str, Any]]:
    """Poll ``/v1/models`` until the server answers (``proc``: its process, which must not exit)."""
    client = InferenceClient(url, timeout=5.0)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise InferenceServerUnavailable(f"the inference server exited with {proc.returncode}")
        try:
            return client.models(timeout=5.0)
        except InferenceServerError as exc:
            last = exc
        time.sleep(0.5)
    raise InferenceServerUnavailable(f"the inference server at {url} did not come up in {timeout:.0f} s: {last}")


__all__ = ["InferenceClient", "InferenceServerError", "InferenceServerUnavailable", "RemoteModel", "RemotePool",
           "RemoteWorker", "remote_worker", "request_body", "wait_ready"]
