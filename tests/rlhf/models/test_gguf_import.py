"""A GGUF model (Ollama's, llama.cpp's, LM Studio's format; SmolLM2-135M-Instruct ships as one) as the
base model: named by its file or its folder, dequantized through transformers' GGUF support, stored
as a plain version that saves, loads and answers. The GGUF here is written by tests/support/gguf_model.py
(a tiny SmolLM2-shaped Llama, its matrices in Q8_0), so nothing is downloaded.

Before: ``save_pretrained`` of the loaded model refused ("The model is quantized with gguf and is not
serializable"), a copy kept ``quantization_config`` in config.json, and ``init-model`` failed."""
from __future__ import annotations

import json

import pytest
import torch

from rlhf.models.chat_format import render_prompt
from rlhf.models.loading import ModelLoadError, gguf_file, import_pretrained, load_causal_lm
from tests.support.app import flask_cli
from tests.support.gguf_model import write_smollm2_gguf


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    model, tokenizer = write_smollm2_gguf(folder / "SmolLM2-tiny.Q8_0.gguf")
    return folder / "SmolLM2-tiny.Q8_0.gguf", model, tokenizer


def test_a_gguf_file_imports_as_a_plain_model_with_its_weights_and_template(gguf_model, tmp_path):
    path, original, tokenizer = gguf_model
    info = import_pretrained(str(path), tmp_path / "v1-base")
    assert info["parameters"] > 0
    config = json.loads((tmp_path / "v1-base" / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"

    model, tok = load_causal_lm(tmp_path / "v1-base")
    ids = tokenizer("How do I cook rice?", return_tensors="pt").input_ids
    assert tok("How do I cook rice?").input_ids == ids[0].tolist()  # the same vocabulary and merges
    with torch.no_grad():
        want = original(ids).logits
        got = model(ids).logits[..., :want.shape[-1]]  # the added pad token's column aside
    assert (want - got).abs().max().item() < 0.05 * want.abs().max().item()  # Q8_0 is within a few per mille
    assert tok.eos_token == "<|im_end|>" and tok.pad_token != tok.eos_token  # a pad of its own for PPO
    prompt = render_prompt(tok, [{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_folder_holding_one_gguf_file_is_that_file(gguf_model, tmp_path):
    path = gguf_model[0]
    assert gguf_file(path.parent) == (str(path.parent), path.name)
    assert gguf_file(path) == (str(path.parent), path.name)
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"holds 2 GGUF files \(a.gguf, b.gguf\): name one of them"):
        gguf_file(tmp_path, "RLHF_BASE_MODEL")
    (tmp_path / "config.json").write_text("{}")  # a transformers folder is not a GGUF folder
    assert gguf_file(tmp_path) is None


def test_init_model_imports_a_gguf_file_and_the_chat_answers(gguf_model, tmp_path, monkeypatch):
    from tests.support.app import ApiClient, make_app, sse_events

    inst = tmp_path / "instance"
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    monkeypatch.setenv("RLHF_BASE_MODEL", str(gguf_model[0]))
    result = flask_cli("init-model")
    assert result.exit_code == 0, result.output
    assert "Active model version: v1-base" in result.output
    app = make_app(inst, RLHF_MAX_NEW_TOKENS=8)
    user = ApiClient(app.test_client())
    conv = user.post("/api/conversations", {}).get_json()["id"]
    resp = user.post(f"/api/conversations/{conv}/messages", {"content": "How do I cook rice?", "stream": True})
    assert resp.status_code == 200
    kinds = [kind for kind, _ in sse_events(resp)]
    assert kinds[-1] == "done" and "error" not in kinds


@pytest.mark.parametrize("content,needle", [
    (b"not a gguf file at all", "could not be loaded as GGUF"),
    (b"GGUF\x03\x00\x00\x00", "could not be loaded as GGUF"),  # the magic, then nothing
])
def test_a_broken_gguf_file_fails_at_init_model_with_one_line(tmp_path, monkeypatch, content, needle):
    source = tmp_path / "broken.gguf"
    source.write_bytes(content)
    inst = tmp_path / "instance"
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    monkeypatch.setenv("RLHF_BASE_MODEL", str(source))
    result = flask_cli("init-model")
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and needle in lines[0] and str(source) in lines[0], result.output
