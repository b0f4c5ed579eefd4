"""Concurrent answers share one batch (rlhf.generation.batcher's per-model worker) and stay independent:
each row gets exactly the answer it gets alone, with its own settings, stopping and cancelling."""
from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

import rlhf.generation.batcher as batcher_module
import rlhf.generation.rows as rows_module
from rlhf.generation import (
    GenerationSettings,
    LoadedModel,
    ModelPool,
    batch_stats,
    batcher_for,
    generate_chat,
    generate_chats,
    stream_chat,
)

GREEDY = GenerationSettings(max_new_tokens=40, do_sample=False)
# prompts of different lengths, so rows are left-padded against each other
PROMPTS = ["Hi", "How do I cook rice?", "What is a good way to learn to play the guitar as an adult beginner?",
           "Tell me about the weather tomorrow, please."]


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def loaded(micro_model_dir):
    """A GPT-2 with large random weights and the micro model's tokenizer: its greedy answers are
    different gibberish for every prompt (the trained micro model greedily answers blanks), with
    clear margins between the best tokens, so any mix-up between rows would show."""
    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=64, n_layer=2, n_head=4, initializer_range=0.3,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LoadedModel("random", GPT2LMHeadModel(config).eval(), tok, torch.device("cpu"))


@pytest.fixture(scope="module")
def solo(loaded):
    """Each prompt's greedy answer generated alone."""
    return {p: generate_chat(loaded, ask(p), GREEDY) for p in PROMPTS}


def drain(handles) -> list:
    """Read every handle to the end, concurrently (as request threads do)."""
    chunks: list[list[str]] = [[] for _ in handles]
    errors: list[BaseException | None] = [None] * len(handles)

    def read(i: int) -> None:
        try:
            chunks[i].extend(handles[i].chunks)
        except Exception as exc:
            errors[i] = exc

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return [(c, e) for c, e in zip(chunks, errors)]


def test_concurrent_requests_share_one_batch_and_get_their_solo_answers(loaded, solo):
    stats = batch_stats(loaded)
    prefills, steps, rows = stats.prefills, stats.steps, stats.rows_stepped
    with batcher_for(loaded).held():  # all four arrive before the worker looks
        handles = [stream_chat(loaded, ask(p), GREEDY) for p in PROMPTS]
    out = drain(handles)
    assert stats.prefills == prefills + 1  # one forward pass started all four
    assert stats.max_rows >= 4
    # every step carried several rows: far fewer forward passes than tokens generated
    assert stats.rows_stepped - rows > 2 * (stats.steps - steps)
    for p, h, (chunks, error) in zip(PROMPTS, handles, out):
        assert error is None
        alone = solo[p]
        assert h.result.text == alone.text and "".join(chunks).strip() == alone.text
        assert (h.result.token_count, h.result.finish_reason) == (alone.token_count, alone.finish_reason)
        assert h.result.first_token_ms is not None and h.result.latency_ms >= h.result.first_token_ms


def test_a_request_joins_a_running_batch(loaded, solo):
    stats = batch_stats(loaded)
    prefills = stats.prefills
    long_settings = GenerationSettings(max_new_tokens=80, do_sample=False)
    first = stream_chat(loaded, ask(PROMPTS[2]), long_settings)
    next(first.chunks)  # generating
    second = stream_chat(loaded, ask(PROMPTS[1]), GREEDY)  # shorter prompt: padded against the running row
    (_, e1), (_, e2) = drain([first, second])
    assert e1 is None and e2 is None
    assert stats.prefills == prefills + 2 and stats.max_rows >= 2
    assert second.result.text == solo[PROMPTS[1]].text
    assert first.result.text == generate_chat(loaded, ask(PROMPTS[2]), long_settings).text


def test_cancelling_one_row_leaves_the_others_alone(loaded, solo):
    cancel = threading.Event()
    with batcher_for(loaded).held():
        handles = [stream_chat(loaded, ask(p), GREEDY) for p in PROMPTS[:2]]
        closed = stream_chat(loaded, ask(PROMPTS[2]), GREEDY)
        cancelled = stream_chat(loaded, ask(PROMPTS[3]), GREEDY, cancel=cancel)
    said = next(closed.chunks)
    closed.chunks.close()  # the client went away: the partial answer is kept
    assert closed.result.stopped and closed.result.finish_reason == "cancelled"
    assert closed.result.text == said.strip() and closed.result.token_count < GREEDY.max_new_tokens
    next(cancelled.chunks)
    cancel.set()  # the stop button
    list(cancelled.chunks)
    assert cancelled.result.finish_reason == "cancelled" and cancelled.result.token_count < GREEDY.max_new_tokens
    for p, h, (_, error) in zip(PROMPTS, handles, drain(handles)):
        assert error is None and h.result.text == solo[p].text and h.result.token_count == solo[p].token_count


def test_closing_before_the_first_chunk_stops_the_row(loaded):
    with batcher_for(loaded).held():
        handle = stream_chat(loaded, ask("Hi"), GREEDY)
        handle.chunks.close()
    assert handle.result.stopped and handle.result.text == "" and handle.result.token_count == 0


def test_rows_keep_their_own_settings_in_one_batch(loaded, solo):
    stats = batch_stats(loaded)
    prefills = stats.prefills
    short = GenerationSettings(max_new_tokens=3, do_sample=False)
    sampled = GenerationSettings(max_new_tokens=30, temperature=1.5, top_p=0.9)
    with batcher_for(loaded).held():
        greedy = stream_chat(loaded, ask(PROMPTS[1]), GREEDY)
        cut = stream_chat(loaded, ask(PROMPTS[0]), short)
        hot = stream_chat(loaded, ask(PROMPTS[3]), sampled)
    drain([greedy, cut, hot])
    assert stats.prefills == prefills + 1
    assert greedy.result.text == solo[PROMPTS[1]].text
    assert cut.result.token_count == 3 and cut.result.finish_reason == "length"
    assert 0 < hot.result.token_count <= 30


def test_stop_strings_and_eos_end_a_row_exactly(loaded):
    tok = loaded.tokenizer
    ids = tok("Rinse it first.\nUser: and then?", add_special_tokens=False)["input_ids"]
    row = rows_module.Row([1], GREEDY, threading.Event(), tok)
    for token in ids:
        row.take(token)
        if row.finish:
            break
    row.close()
    chunks = []
    while not isinstance(item := row.out.get_nowait(), rows_module.Done):
        chunks.append(item)
    assert item.finish == "stop_string" and item.text == "Rinse it first."
    assert "".join(chunks) == "Rinse it first."  # the held-back "\n" never reached the reader
    # the token that completed "\nUser:" is the last one counted
    assert tok.decode(ids[:item.token_count]).endswith("User:") and item.token_count < len(ids)
    row = rows_module.Row([1], GREEDY, threading.Event(), tok)
    row.take(ids[0])
    row.take(tok.eos_token_id)
    assert row.finish == "eos" and len(row.ids) == 2


def test_a_failing_forward_fails_the_rows_in_flight_then_recovers(micro_model_dir):
    fresh = ModelPool("cpu").get(micro_model_dir)

    def broken(module, args):
        raise RuntimeError("CUDA out of memory")

    hook = fresh.model.register_forward_pre_hook(broken)
    try:
        with batcher_for(fresh).held():
            handles = [stream_chat(fresh, ask(p), GREEDY) for p in PROMPTS[:3]]
        for _, error in drain(handles):
            assert isinstance(error, RuntimeError) and "out of memory" in str(error)
        assert all(h.result is None for h in handles)
    finally:
        hook.remove()
    assert generate_chat(fresh, ask("Hi"), GREEDY).token_count > 0


def test_an_idle_worker_exits_and_a_new_request_starts_another(micro_model_dir, monkeypatch):
    monkeypatch.setattr(batcher_module, "WORKER_IDLE_EXIT_S", 0.05)  # read by the worker loop there
    fresh = ModelPool("cpu").get(micro_model_dir)
    assert generate_chat(fresh, ask("Hi"), GREEDY).token_count > 0
    worker = batcher_for(fresh)._thread
    worker.join(5)
    assert not worker.is_alive() and batcher_for(fresh)._thread is None
    assert generate_chat(fresh, ask("Hi"), GREEDY).token_count > 0


def test_generate_chats_answers_side_by_side_in_one_batch(loaded, solo):
    stats = batch_stats(loaded)
    prefills, steps, rows = stats.prefills, stats.steps, stats.rows_stepped
    batcher = batcher_for(loaded)
    results = []
    with batcher.held():  # generate_chats submits both before reading either
        thread = threading.Thread(target=lambda: results.extend(
            generate_chats([(loaded, ask(PROMPTS[0])), (loaded, ask(PROMPTS[1]))], GREEDY)))
        thread.start()
        while len(batcher._pending) < 2:
            thread.join(0.01)
    thread.join(60)
    assert [r.text for r in results] == [solo[PROMPTS[0]].text, solo[PROMPTS[1]].text]
    # one prefill for both, then each step advanced both rows while both were running
    counts = [r.token_count for r in results]
    assert stats.prefills == prefills + 1 and stats.steps - steps == max(counts) - 1
    assert stats.rows_stepped - rows == sum(c - 1 for c in counts)


def test_a_seed_gives_the_same_sampled_answer_alone_and_in_a_batch(loaded):
    """A seeded row samples from its own generator: the same seed, the same answer, whoever else is
    in the batch (each seeded row is warped and sampled on its own)."""
    seeded = GenerationSettings(max_new_tokens=30, temperature=1.5, top_p=0.95, seed=1234)
    alone = generate_chat(loaded, ask(PROMPTS[2]), seeded)
    again = generate_chat(loaded, ask(PROMPTS[2]), seeded)
    with batcher_for(loaded).held():
        handles = [stream_chat(loaded, ask(PROMPTS[2]), seeded),
                   stream_chat(loaded, ask(PROMPTS[2]), GenerationSettings(max_new_tokens=30, temperature=1.5,
                                                                          top_p=0.95, seed=99)),
                   stream_chat(loaded, ask(PROMPTS[2]), GenerationSettings(max_new_tokens=30, temperature=1.5,
                                                                          top_p=0.95))]
    drain(handles)
    assert alone.text and again.text == alone.text and handles[0].result.text == alone.text
    assert handles[1].result.text != alone.text  # another seed samples otherwise
