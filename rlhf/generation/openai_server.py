"""An OpenAI-compatible completions server on this package's own in-process generation.

A generation box without vLLM (or for a model vLLM cannot run) serves one base model and its
LoRA adapter versions the way ``RLHF_INFERENCE_URL`` expects, with the batching worker of
``batcher`` and the shared weights of ``rlhf.models.adapters``::

    python -m rlhf.generation.openai_server instance/models/v1-base --port 8000

Endpoints (the subset of vLLM's that ``remote`` uses, same shapes):

- ``GET /v1/models``: the base (``root`` its directory, ``max_model_len``) and loaded adapters
  (``parent`` the base's name).
- ``POST /v1/completions``: ``model``, ``prompt`` (token ids, or text), ``max_tokens``,
  ``temperature`` (0: greedy), ``top_p``, ``stop``, ``stop_token_ids``, ``stream`` and
  ``stream_options.include_usage``. The chat template's own stop strings and end-of-turn ids
  always apply too (as in-process). ``top_k`` and ``seed`` are accepted and ignored (the model's
  own top-k applies). A streamed answer ends with ``finish_reason`` ``stop`` (``stop_reason``
  ``"stop_string"`` when a stop string ended it, null at EOS) or ``length``; closing the
  connection stops it.
- ``POST /v1/load_lora_adapter`` (``lora_name``, ``lora_path``) and ``/v1/unload_lora_adapter``.
- ``GET /health``.

The standard library's threading HTTP server: one thread per request, every answer of a model
generated in one batch by its worker. No Flask here (``rlhf`` never imports it).
"""
from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rlhf.generation.pool import GenerationSettings, LoadedModel, ModelPool
from rlhf.generation.stream import stream_prompt
from rlhf.models.adapters import base_of, is_adapter


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class CompletionsService:
    """The models one server serves: a base version and the LoRA adapters loaded on it."""

    def __init__(self, base_path: str | Path, served_name: str | None = None, device: str = "cpu",
                 api_key: str | None = None) -> None:
        self.base_path = str(Path(base_path).resolve())
        self.name = served_name or Path(self.base_path).name
        self.pool = ModelPool(device)
        self.api_key = api_key
        self.adapters: dict[str, str] = {}  # name -> directory
        self._lock = threading.Lock()
        self.pool.get(self.base_path, self.name)  # load at start: a broken model fails here, not on a request

    def model(self, name: Any) -> LoadedModel:
        if name == self.name or name is None:
            return self.pool.get(self.base_path, self.name)
        path = self.adapters.get(str(name))
        if path is None:
            raise _BadRequest(404, f"The model `{name}` does not exist.", "NotFoundError")
        return self.pool.get(path, str(name))

    def models(self) -> list[dict[str, Any]]:
        base = self.pool.get(self.base_path, self.name)
        out = [{"id": self.name, "object": "model", "owned_by": "rlhf", "root": self.base_path, "parent": None,
                "max_model_len": base.context_window}]
        out += [{"id": name, "object": "model", "owned_by": "rlhf", "root": path, "parent": self.name}
                for name, path in self.adapters.items()]
        return out

    def load_adapter(self, body: dict[str, Any]) -> str:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise _BadRequest(400, "Both 'lora_name' and 'lora_path' must be provided.")
        with self._lock:
            if name in self.adapters or name == self.name:
                raise _BadRequest(400, f"The lora adapter '{name}' has already been loaded.")
            if not is_adapter(path):
                raise _BadRequest(400, f"{path} is not a LoRA adapter directory")
            if Path(base_of(path)).resolve() != Path(self.base_path):
                raise _BadRequest(400, f"the adapter's base {str(base_of(path))!r} is not the served model "
                                       f"{self.base_path!r}")
            try:
                self.pool.get(str(Path(path).resolve()), name)
            except Exception as exc:  # noqa: BLE001 - a broken adapter is the caller's 400
                raise _BadRequest(400, f"the adapter could not be loaded: {exc}") from exc
            self.adapters[name] = str(Path(path).resolve())
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_adapter(self, body: dict[str, Any]) -> str:
        name = body.get("lora_name")
        with self._lock:
            if self.adapters.pop(str(name), None) is None:
                raise _BadRequest(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        # its LoRA layers stay injected in the shared weights (unused) until the server restarts
        return f"Success: LoRA adapter '{name}' removed successfully."


def _settings(body: dict[str, Any]) -> GenerationSettings:
    try:
        temperature = float(1.0 if body.get("temperature") is None else body["temperature"])  # OpenAI's defaults
        top_p = float(1.0 if body.get("top_p") is None else body["top_p"])
        max_tokens = int(body.get("max_tokens") or 16)
        settings = GenerationSettings(max_new_tokens=max_tokens, temperature=temperature if temperature > 0 else 1.0,
                                      top_p=top_p, do_sample=temperature > 0)
        return settings.validate()
    except (TypeError, ValueError) as exc:
        raise _BadRequest(400, str(exc)) from exc


def _prompt_ids(loaded: LoadedModel, prompt: Any, max_tokens: int) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = loaded.tokenizer(prompt)["input_ids"]
    elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        ids = list(prompt)
    else:
        raise _BadRequest(400, "'prompt' must be a string or a non-empty list of token ids (one prompt)")
    vocab = len(loaded.tokenizer)
    if any(not 0 <= i < vocab for i in ids):
        raise _BadRequest(400, f"token ids must be in [0, {vocab})")
    budget = max(1, loaded.context_window - max_tokens)
    return ids[-budget:]  # as fit_to_context does with one message that is too long


def _finish_reason(finish: str) -> tuple[str, str | None]:
    if finish == "length":
        return "length", None
    return "stop", ("stop_string" if finish == "stop_string" else None)


def make_handler(service: CompletionsService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "rlhf-openai-server"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _send_json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, exc: _BadRequest) -> None:
            self._send_json(exc.status, {"error": {"message": str(exc), "type": exc.kind, "param": None,
                                                   "code": exc.status}})

        def _authorised(self) -> bool:
            if service.api_key and self.headers.get("Authorization") != f"Bearer {service.api_key}":
                self._send_json(401, {"error": {"message": "Unauthorized", "type": "AuthenticationError",
                                                "code": 401}})
                return False
            return True

        def _body(self) -> dict[str, Any]:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError as exc:
                raise _BadRequest(400, f"the body is not JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise _BadRequest(400, "the body must be a JSON object")
            return body

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._send_json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                if self._authorised():
                    self._send_json(200, {"object": "list", "data": service.models()})
            else:
                self._error(_BadRequest(404, f"{self.path} not found", "NotFoundError"))

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            try:
                body = self._body()
                if self.path == "/v1/completions":
                    self._complete(body)
                elif self.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                    text = (service.load_adapter if "unload" not in self.path else service.unload_adapter)(body)
                    data = text.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    raise _BadRequest(404, f"{self.path} not found", "NotFoundError")
            except _BadRequest as exc:
                self._error(exc)

        def _complete(self, body: dict[str, Any]) -> None:
            loaded = service.model(body.get("model"))
            settings = _settings(body)
            ids = _prompt_ids(loaded, body.get("prompt"), settings.max_new_tokens)
            stops = body.get("stop") or ()
            stops = (stops,) if isinstance(stops, str) else tuple(str(s) for s in stops)
            ends = tuple(int(i) for i in body.get("stop_token_ids") or ())
            handle = stream_prompt(loaded, ids, settings, extra_stops=stops, extra_end_ids=ends)
            ident, created, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), str(body.get("model") or service.name)

            def chunk(text: str, finish: str | None = None, stop_reason: str | None = None) -> dict[str, Any]:
                return {"id": ident, "object": "text_completion", "created": created, "model": name,
                        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                     "stop_reason": stop_reason}]}

            if not body.get("stream"):
                for _ in handle.chunks:
                    pass
                result = handle.result
                assert result is not None
                out = chunk(result.text, *_finish_reason(result.finish_reason))
                out["usage"] = {"prompt_tokens": len(ids), "completion_tokens": result.token_count,
                                "total_tokens": len(ids) + result.token_count}
                self._send_json(200, out)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()

            def send(payload: Any) -> None:
                self.wfile.write(f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode())
                self.wfile.flush()

            try:
                try:
                    for text in handle.chunks:
                        send(chunk(text))
                except (BrokenPipeError, ConnectionResetError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the generation failed: say so in the stream
                    send({"error": {"message": f"{type(exc).__name__}: {exc}", "type": "InternalServerError",
                                    "code": 500}})
                    send("[DONE]")
                    return
                result = handle.result
                assert result is not None
                send(chunk("", *_finish_reason(result.finish_reason)))
                if (body.get("stream_options") or {}).get("include_usage"):
                    send({"id": ident, "object": "text_completion", "created": created, "model": name, "choices": [],
                          "usage": {"prompt_tokens": len(ids), "completion_tokens": result.token_count,
                                    "total_tokens": len(ids) + result.token_count}})
                send("[DONE]")
            except (BrokenPipeError, ConnectionResetError):  # the client went away: stop the answer
                handle.chunks.close()

    return Handler


def make_server(service: CompletionsService, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), make_handler(service))
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the base model directory (a model store version)")
    parser.add_argument("--served-model-name", default=None, help="its model name (default: the directory's name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="cpu", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    service = CompletionsService(args.model, args.served_model_name, args.device, args.api_key)
    server = make_server(service, args.host, args.port)
    print(f"serving {service.name} ({service.base_path}) on http://{args.host}:{server.server_address[1]}",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
