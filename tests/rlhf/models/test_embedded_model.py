"""Corpus, tokenizer, embedded model build, model store and the init-model command."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
from click.testing import CliRunner
from flask.cli import FlaskGroup
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from rlhf.data import corpus
from rlhf.models import registry
from rlhf.models.chat_format import PLAIN_CHAT_TEMPLATE, render_prompt
from rlhf.models.embedded import build_embedded_model, spec_for, train_tokenizer
from webapp import create_app
from webapp.core.extensions import db
from webapp.core.models import ModelVersion


def test_corpus_is_seeded_and_mixes_every_quality():
    a = corpus.generate_corpus(2000, seed=7)
    assert a == corpus.generate_corpus(2000, seed=7)
    assert a != corpus.generate_corpus(2000, seed=8)
    counts = Counter(q for d in a for q in d.qualities)
    assert set(counts) == set(corpus.QUALITIES)
    assert counts["helpful"] > counts["rude"] > 100
    assert len({d.topic for d in a}) == len(corpus.TOPICS) >= 10
    assert len({d.messages[0]["content"] for d in a}) > 300  # many question forms


def test_answer_qualities_differ_in_the_ways_feedback_can_learn():
    rng = __import__("random").Random(0)
    topic = corpus.TOPIC_BY_NAME["cooking"]
    task = topic.tasks[0]
    rude = corpus.make_answer(rng, "rude", topic, task).lower()
    helpful = corpus.make_answer(rng, "helpful", topic, task).lower()
    rambling = corpus.make_answer(rng, "rambling", topic, task)
    off = corpus.make_answer(rng, "off_topic", topic, task).lower()
    assert any(m in rude for m in corpus.RUDE_MARKERS)
    assert not any(m in helpful for m in corpus.RUDE_MARKERS)
    assert len(rambling) > 2 * len(corpus.make_answer(rng, "terse", topic, task))
    assert not any(tip.lower() in off for tip in task.tips)
    assert corpus.topic_of("How do I cook rice?") is topic


def test_every_corpus_question_maps_back_to_its_topic():
    # every question form about every task and topic (a task phrase with a capital "I" once fell through)
    for topic in corpus.TOPICS:
        for form in corpus.TASK_QUESTIONS:
            for task in topic.tasks:
                assert corpus.topic_of(form.format(task=task.phrase)) is topic, form.format(task=task.phrase)
        for form in corpus.TOPIC_QUESTIONS:
            assert corpus.topic_of(form.format(topic=topic.name)) is topic


def test_tokenizer_has_distinct_pad_left_padding_and_chat_template():
    tok = train_tokenizer(["Hello there. How do I cook rice?"] * 50, vocab_size=300)
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    text = render_prompt(tok, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
                               {"role": "user", "content": "Again?"}])
    assert text == "User: Hi\nAssistant: Yo<|endoftext|>\nUser: Again?\nAssistant:"
    # Byte-level: any text, including emoji and markup, round-trips.
    sample = "Crème brûlée 🍮 <script>"
    assert tok.decode(tok(sample)["input_ids"]) == sample


def test_the_build_is_defined_by_its_spec_not_by_the_machine(tmp_path, micro_model_dir):
    """Same spec, same weights, whatever the machine's load or the caller's thread count (the
    build runs on the spec's torch threads and restores the caller's); no time cap cuts it short."""
    from safetensors.torch import load_file

    spec = spec_for("micro")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        metrics = build_embedded_model(tmp_path / "again", spec)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert metrics["train_steps"] == spec.steps and "max_train_seconds" not in metrics["spec"]
    cached = json.loads((micro_model_dir / "build_metrics.json").read_text())
    assert metrics["val_loss"] == cached["val_loss"]
    ours, theirs = load_file(tmp_path / "again" / "model.safetensors"), load_file(micro_model_dir / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_micro_model_builds_reloads_and_generates(tmp_path):
    metrics = build_embedded_model(tmp_path / "m", spec_for("micro"))
    assert metrics["parameters"] > 10_000 and metrics["train_steps"] == 30
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
    assert tok.chat_template == PLAIN_CHAT_TEMPLATE
    assert model.config.pad_token_id == tok.pad_token_id
    enc = tok(render_prompt(tok, [{"role": "user", "content": "How do I cook rice?"}]), return_tensors="pt",
              add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > enc["input_ids"].shape[1]


def test_training_lowers_the_loss(tmp_path):
    short = build_embedded_model(tmp_path / "a", spec_for("micro", steps=2))
    longer = build_embedded_model(tmp_path / "b", spec_for("micro", steps=60))
    assert longer["val_loss"] < short["val_loss"] - 0.5


def test_store_writes_atomically(tmp_path):
    def crash(tmp):
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        registry.write_version(tmp_path, "ppo", crash)
    assert list(tmp_path.iterdir()) == []  # no half-written version, no temporary left

    name, path, _ = registry.write_version(tmp_path, "base", lambda tmp: (tmp / "config.json").write_text("{}")
                                           and {"ok": 1}, lineage={"parent": None})
    assert name == "v1-base" and registry.is_complete(path)
    assert json.loads((path / "version.json").read_text())["metrics"] == {"ok": 1}
    assert registry.next_version_name(tmp_path, "ppo") == "v2-ppo"


def _cli(tmp_path, monkeypatch, **env):
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(tmp_path))
    monkeypatch.setenv("RLHF_EMBEDDED_PRESET", "micro")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return lambda *args: CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), list(args))


def _versions(tmp_path):
    app = create_app({"INSTANCE_DIR": str(tmp_path)})
    with app.app_context():
        return [(v.name, v.kind, v.status, v.location) for v in db.session.scalars(db.select(ModelVersion)
                                                                              .order_by(ModelVersion.id))]


def test_init_model_registers_active_base_and_force_replaces_it(tmp_path, monkeypatch):
    run = _cli(tmp_path, monkeypatch)
    first = run("init-model")
    assert first.exit_code == 0, first.output
    assert "Active model version: v1-base" in first.output
    [(name, kind, status, path)] = _versions(tmp_path)
    assert (name, kind, status) == ("v1-base", "base", "active")
    assert registry.is_complete(path)
    AutoModelForCausalLM.from_pretrained(path)  # an ordinary save_pretrained directory

    again = run("init-model")  # nothing to do
    assert again.exit_code == 0 and len(_versions(tmp_path)) == 1

    forced = run("init-model", "--force")
    assert forced.exit_code == 0, forced.output
    assert [(n, s) for n, _, s, _ in _versions(tmp_path)] == [("v1-base", "retired"), ("v2-base", "active")]


@pytest.mark.parametrize("source", ["/nonexistent/model/dir", "no-such-org/no-such-model"])
def test_bad_base_model_is_a_one_line_error_naming_the_setting(tmp_path, monkeypatch, source):
    run = _cli(tmp_path, monkeypatch, RLHF_BASE_MODEL=source)
    result = run("init-model")
    assert result.exit_code == 1
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: RLHF_BASE_MODEL='{source}' could not be loaded")
    assert _versions(tmp_path) == []  # nothing registered
    assert [p.name for p in (tmp_path / "models").iterdir()] == []  # nothing half-written


def test_other_base_model_goes_through_from_pretrained_and_is_made_chat_ready(tmp_path, monkeypatch):
    # A GPT-2-style model as found on the hub: EOS only, no pad token, no chat template.
    raw = tmp_path / "gpt2-like"
    tok = train_tokenizer(["How do I cook rice? Rinse it first."] * 20, vocab_size=280)
    hub_tok = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<|endoftext|>",
                                      bos_token="<|endoftext|>")
    eos = hub_tok.eos_token_id
    GPT2LMHeadModel(GPT2Config(vocab_size=len(hub_tok), n_embd=16, n_layer=1, n_head=2, n_positions=64,
                               bos_token_id=eos, eos_token_id=eos)).save_pretrained(raw)
    hub_tok.save_pretrained(raw)
    assert AutoTokenizer.from_pretrained(raw).pad_token is None

    run = _cli(tmp_path / "inst", monkeypatch, RLHF_BASE_MODEL=str(raw))
    result = run("init-model")
    assert result.exit_code == 0, result.output
    [(_, kind, status, path)] = _versions(tmp_path / "inst")
    assert (kind, status) == ("base", "active")
    tok2 = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert tok2.pad_token_id not in (None, tok2.eos_token_id) and tok2.padding_side == "left"
    assert tok2.chat_template == PLAIN_CHAT_TEMPLATE
    assert model.get_input_embeddings().weight.shape[0] >= len(tok2)
    assert json.loads((registry.Path(path) / "version.json").read_text())["source"] == str(raw)


@pytest.mark.slow
def test_default_model_answers_in_english_in_the_corpus_style(default_model_dir):
    """What a user gets from the embedded model, through the serving path (role markers and EOS
    end an answer), with a fixed seed: plain English, about what was asked, no leaked turns."""
    from rlhf.generation import GenerationSettings, ModelPool, generate_chat

    loaded = ModelPool("cpu").get(default_model_dir)
    vocab = {w.lower() for d in corpus.generate_corpus(3000) for m in d.messages
             for w in re.findall(r"[A-Za-z']+", m["content"])}
    torch.manual_seed(0)
    questions = corpus.sample_prompts(20)
    answers = [generate_chat(loaded, [{"role": "user", "content": q}], GenerationSettings(max_new_tokens=80)).text
               for q in questions]
    assert not [a for a in answers if "User:" in a or "Assistant:" in a]  # no leaked turns
    words = [w.lower() for a in answers for w in re.findall(r"[A-Za-z']+", a)]
    assert len(words) > 100
    assert sum(w in vocab for w in words) / len(words) > 0.97  # real words, not noise
    sentences = [s for a in answers for s in re.split(r"(?<=[.!?])\s+", a) if s]
    well_formed = [s for s in sentences if s[0].isupper()]
    assert len(well_formed) / len(sentences) > 0.9
    # Most answers are about what was asked (the base model also has a deliberate share of
    # off-topic answers, 15 % of its corpus, which feedback should teach it to avoid).
    on_topic = 0
    for q, a in zip(questions, answers):
        topic = corpus.topic_of(q)
        on_topic += any(k in a.lower() for k in topic.keywords)
    assert on_topic >= 12, list(zip(questions, answers))  # 13 of 20 with this seed
