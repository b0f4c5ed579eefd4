"""rlhf.generation on the micro model: streaming, stopping, truncation, the model pool."""
from __future__ import annotations

import copy
import threading

import pytest

from rlhf.generation import GenerationSettings, ModelPool, fit_to_context, generate_chat, stream_chat
from rlhf.generation.rows import Row, stop_prefix_len
from rlhf.models.chat_format import STOP_STRINGS, turn_markers


@pytest.fixture(scope="module")
def loaded(micro_model_dir):
    return ModelPool("cpu").get(micro_model_dir)


def test_stream_yields_the_same_text_that_is_returned(loaded):
    handle = stream_chat(loaded, [{"role": "user", "content": "How do I cook rice?"}],
                         GenerationSettings(max_new_tokens=24))
    chunks = list(handle.chunks)
    assert len(chunks) >= 2
    assert "".join(chunks).strip() == handle.result.text
    assert 0 < handle.result.token_count <= 24
    assert handle.result.first_token_ms is not None and handle.result.latency_ms >= handle.result.first_token_ms


def test_max_new_tokens_is_respected(loaded):
    result = generate_chat(loaded, [{"role": "user", "content": "Hi"}],
                           GenerationSettings(max_new_tokens=5, do_sample=False))
    assert result.token_count <= 5


def test_cancel_stops_generation(loaded):
    cancel = threading.Event()
    handle = stream_chat(loaded, [{"role": "user", "content": "Hi"}], GenerationSettings(max_new_tokens=60),
                         cancel=cancel)
    it = iter(handle.chunks)
    next(it)
    cancel.set()
    list(it)
    assert handle.result.token_count < 60 and handle.result.finish_reason in ("cancelled", "eos", "stop_string")


def test_closing_the_stream_keeps_the_partial_answer(loaded):
    handle = stream_chat(loaded, [{"role": "user", "content": "Hi"}], GenerationSettings(max_new_tokens=60))
    first = next(iter(handle.chunks))
    handle.chunks.close()
    assert handle.result.stopped and handle.result.text == first.strip()


def test_stop_string_prefixes_are_held_back():
    assert stop_prefix_len("Hello\n") == 1
    assert stop_prefix_len("Hello\nUse") == 4
    assert stop_prefix_len("Hello") == 0
    assert STOP_STRINGS == ("\nUser:", "\nAssistant:")
    assert stop_prefix_len("Hello\nAssis") == 6


def _answer_of(tokenizer, text: str) -> Row:
    row = Row([], GenerationSettings(max_new_tokens=200), threading.Event(), tokenizer)
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        row.take(token)
        if row.finish:
            break
    row.close()
    return row


@pytest.mark.parametrize("leak", ["\nAssistant: I am trying to help.", "\nUser: and then?"])
def test_an_answer_ends_where_the_model_starts_a_new_turn_of_either_role(loaded, leak):
    row = _answer_of(loaded.tokenizer, " Rinse the rice first." + leak + "\nAssistant: more")
    assert row.done.text == "Rinse the rice first." and row.done.finish == "stop_string"


def test_the_templates_end_of_turn_token_ends_an_answer(loaded):
    tok = copy.deepcopy(loaded.tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    stops, ends = turn_markers(tok)
    assert end in ends and tok.eos_token_id in ends
    row = _answer_of(tok, "Rinse the rice first.<|im_end|>\n<|im_start|>user\nmore")
    assert row.done.text == "Rinse the rice first." and row.done.finish == "eos"
    # a template with plain-text role markers gets them as stop strings
    tok.chat_template = "{% for m in messages %}### {{ m['role'] | capitalize }}:\n{{ m['content'] }}\n\n{% endfor %}"
    assert turn_markers(tok)[0] == ("\n### User:", "\n### Assistant:")


def test_long_conversations_are_truncated_to_the_context_window(loaded):
    turns = []
    for i in range(40):
        turns += [{"role": "user", "content": f"Question number {i} about cooking rice?"},
                  {"role": "assistant", "content": "Rinse it in cold water first. " * 3}]
    turns.append({"role": "user", "content": "Last question?"})
    ids = fit_to_context(loaded, turns, max_new_tokens=40)
    assert len(ids) <= loaded.context_window - 40
    assert loaded.tokenizer.decode(ids).endswith("User: Last question?\nAssistant:")  # newest turn kept
    huge = [{"role": "user", "content": "word " * 5000}]
    assert len(fit_to_context(loaded, huge, 40)) == loaded.context_window - 40
    result = generate_chat(loaded, huge, GenerationSettings(max_new_tokens=40))
    assert result.token_count <= 40


def test_invalid_settings_are_refused():
    for bad in (GenerationSettings(max_new_tokens=0), GenerationSettings(top_p=0), GenerationSettings(temperature=0)):
        with pytest.raises(ValueError):
            bad.validate()


def test_pool_loads_each_model_once(micro_model_dir):
    pool = ModelPool("cpu")
    results = []
    threads = [threading.Thread(target=lambda: results.append(pool.get(micro_model_dir))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in results}) == 1 and pool.loaded() == [str(micro_model_dir)]


@pytest.mark.parametrize("family", ["plain", "qwen2", "llama"])
def test_a_final_assistant_message_is_continued_not_answered(loaded, family):
    """An OpenAI request ending with the assistant's answer so far (Open WebUI's Continue Response):
    the prompt ends inside that answer, with no end of turn after it, and the continuation keeps its
    leading space."""
    from rlhf.models.chat_format import prepare_tokenizer, render_prompt
    from tests.support.model_families import build_tokenizer

    tok = loaded.tokenizer if family == "plain" else build_tokenizer(family)
    prepare_tokenizer(tok)
    chat = [{"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France"}]
    prompt = render_prompt(tok, chat)
    assert prompt.endswith("The capital of France")
    asked = render_prompt(tok, chat[:1])  # the question's own rendering, ending with the generation prompt
    assert prompt.startswith(asked) and prompt[len(asked):].strip() == "The capital of France"
    row = Row([], GenerationSettings(max_new_tokens=50), threading.Event(), tok)
    row.continues = True
    for token in tok(" is Paris.", add_special_tokens=False)["input_ids"]:
        row.take(token)
    row.close()
    assert row.done.text == " is Paris."
    new = Row([], GenerationSettings(max_new_tokens=50), threading.Event(), tok)
    for token in tok(" Paris.", add_special_tokens=False)["input_ids"]:
        new.take(token)
    new.close()
    assert new.done.text == "Paris."  # a new answer starts after the role marker's space, trimmed
