"""What the reward model reads is what it was trained on: for every model family (GPT-2, Phi,
Llama-3, Qwen2.5's ChatML, Pythia) and SmolLM2-135M-Instruct's ChatML with its default system
prompt, the texts the gate (its run's reward model, its criterion heads and its judge), iterative DPO
and RLOO score for an answer after its conversation are exactly the reward model's training text of
that pair (``rlhf.data.datasets.to_standard``'s prompt + completion) -- an empty answer, a
multi-turn conversation and one with its own system message included. Each scorer runs for real on
a tiny model of the family, imported as the app imports one; only its sampling (gate, iterative DPO)
is fixed, so that the answers are known, and the reward model's scoring is recorded instead of
computed."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlhf.data.datasets import to_standard
from rlhf.models.loading import import_pretrained, load_causal_lm
from rlhf.settings import EvalSettings, PolicySettings
from tests.support.gguf_model import write_smollm2_gguf
from tests.support.model_families import FAMILIES, build_tiny_model

pytestmark = pytest.mark.slow

SMOLLM2 = "smollm2"
SMOLLM2_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

HISTORIES = [
    [{"role": "user", "content": "How do I cook rice?"}],
    [{"role": "user", "content": "How do I cook rice?"}, {"role": "assistant", "content": "Rinse it first."},
     {"role": "user", "content": "And then?"}],  # multi-turn
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Any tips for sleeping better?"}],
]
# answers as the sampler returns them (stripped, as serving stores them): an empty one, one over two lines
ANSWERS = ["Simmer it for 15 minutes.", "", "Keep a schedule.\nNo screens late."]


class Stop(Exception):
    """Raised by the recording scorer: what a scorer scores is known, its training need not run."""


def training_text(tok, history: list[dict], answer: str) -> str:
    """The reward model's training text of (history, answer), as rlhf.reward.training renders it."""
    row = to_standard({"prompt": history, "completion": [{"role": "assistant", "content": answer}]}, tok)
    return row["prompt"] + row["completion"]


@pytest.fixture(scope="module", params=[*FAMILIES, SMOLLM2])
def model(request, tmp_path_factory) -> tuple[str, Path, object]:
    """The family's tiny model (random weights) imported as the app imports a base model: the
    families' built with their tokenizers' shapes, SmolLM2 from a GGUF file with its own template."""
    family = request.param
    scratch = tmp_path_factory.mktemp(family)
    if family == SMOLLM2:
        source = scratch / "SmolLM2-tiny.Q8_0.gguf"
        write_smollm2_gguf(source)
    else:
        source = scratch / "source"
        build_tiny_model(family, source)
    out = scratch / "model"
    import_pretrained(str(source), out)
    return family, out, load_causal_lm(out)[1]


def recorder(calls: list[list[str]], stop: bool = False):
    """A stand-in for ``score_texts`` that records the texts it is given (and stops the caller)."""
    def score_texts(model, tokenizer, texts, *args, **kwargs):
        calls.append(list(texts))
        if stop:
            raise Stop
        return [0.0] * len(texts)
    return score_texts


def fixed_sampler(tok, calls: list[str]):
    """A stand-in for ``sample_answers``: the k-th prompt it is given gets ``ANSWERS[k % 3]``."""
    def sample_answers(model, tok_, prompts, settings):
        texts, prompt_ids, answer_ids = [], [], []
        for p in prompts:
            text = ANSWERS[len(calls) % len(ANSWERS)]
            calls.append(p)
            texts.append(text)
            prompt_ids.append(tok(p, add_special_tokens=False)["input_ids"])
            answer_ids.append(tok(text, add_special_tokens=False)["input_ids"] if text else [])
        return texts, prompt_ids, answer_ids
    return sample_answers


@pytest.mark.parametrize("model", [SMOLLM2], indirect=True)
def test_smollm2s_reward_text_keeps_its_default_system_prompt_and_adds_no_space(model):
    from rlhf.reward.scoring import reward_texts

    _, _, tok = model
    assert reward_texts(tok, HISTORIES[:1], ["Rinse it first."]) == [
        SMOLLM2_SYSTEM
        + "<|im_start|>user\nHow do I cook rice?<|im_end|>\n<|im_start|>assistant\nRinse it first.<|im_end|>"]
    assert reward_texts(tok, HISTORIES[:1], [""]) == [
        SMOLLM2_SYSTEM + "<|im_start|>user\nHow do I cook rice?<|im_end|>\n<|im_start|>assistant\n<|im_end|>"]


def test_reward_texts_are_the_training_texts(model):
    from rlhf.reward.scoring import reward_texts

    _, _, tok = model
    pairs = [(h, a) for h in HISTORIES for a in ANSWERS]
    expected = [training_text(tok, h, a) for h, a in pairs]
    assert reward_texts(tok, [h for h, _ in pairs], [a for _, a in pairs]) == expected


def test_the_gate_its_judge_and_the_criterion_heads_score_the_training_texts(model, monkeypatch):
    from rlhf.gate import evaluation
    from rlhf.reward.criteria_heads import CriteriaScorer

    _, path, tok = model
    scored: list[list[str]] = []
    by_heads: list[list[str]] = []
    sampled: list[str] = []

    class RecordingHeads(CriteriaScorer):
        """The run's reward model with one criterion head, recording what it scores."""

        @classmethod
        def load(cls, reward_dir, device="cpu"):
            return cls(None, tok, ["helpfulness"], {})

        def score_texts(self, texts, batch_size=32):
            by_heads.append(list(texts))
            return {"helpfulness": [0.0] * len(texts)}

    monkeypatch.setattr(evaluation, "score_texts", recorder(scored))
    monkeypatch.setattr(evaluation, "CriteriaScorer", RecordingHeads)
    monkeypatch.setattr(evaluation, "sample_answers", fixed_sampler(tok, sampled))
    settings = EvalSettings(samples_per_prompt=2, max_new_tokens=8)
    evaluation.evaluate_candidate(path, path, path, HISTORIES, settings=settings, device="cpu", judge_dir=path,
                                  judge_info={"accuracy": 0.5, "accuracy_pairs": 10})
    spp = settings.samples_per_prompt
    per_model = len(HISTORIES) * spp
    answers = [ANSWERS[k % len(ANSWERS)] for k in range(per_model)]  # parent and candidate sample alike
    want = [training_text(tok, HISTORIES[i // spp], a) for i, a in enumerate(answers)]
    assert "" in answers and len(sampled) == 2 * per_model
    # the run's reward model (parent, candidate), then the judge (parent, candidate)
    assert scored == [want] * 4
    assert by_heads == [want] * 2  # the criterion heads: parent, candidate


def test_iterative_dpo_ranks_the_training_texts(model, monkeypatch, tmp_path):
    from rlhf.models import sampling
    from rlhf.policy import offline

    _, path, tok = model
    scored: list[list[str]] = []
    sampled: list[str] = []
    monkeypatch.setattr(offline, "score_texts", recorder(scored, stop=True))
    monkeypatch.setattr(sampling, "sample_answers", fixed_sampler(tok, sampled))
    settings = PolicySettings(samples_per_prompt=2, response_length=8)
    with pytest.raises(Stop):
        offline.train_iterative_dpo(path, path, HISTORIES, tmp_path / "out", settings, device="cpu")
    n = settings.samples_per_prompt
    answers = [ANSWERS[k % len(ANSWERS)] for k in range(len(HISTORIES) * n)]
    assert scored == [[training_text(tok, HISTORIES[j // n], a) for j, a in enumerate(answers)]]


def test_rloo_rewards_the_training_texts(model, monkeypatch, tmp_path):
    """TRL's RLOO hands the reward function prompt texts and completions: what it scores is each
    completion (stripped, as an answer is stored) after the conversation the prompt came from, and
    an empty or space-padded completion renders as that answer's training text too."""
    from rlhf.policy import rloo

    _, path, tok = model
    scored: list[list[str]] = []
    called: list[tuple[object, dict]] = []
    real = rloo._reward_function

    def recording_reward_function(*args, **kwargs):
        score = real(*args, **kwargs)

        def reward(**trl_kwargs):
            called.append((score, trl_kwargs))
            return score(**trl_kwargs)
        return reward

    monkeypatch.setattr(rloo, "score_texts", recorder(scored, stop=True))
    monkeypatch.setattr(rloo, "_reward_function", recording_reward_function)
    with pytest.raises(Stop):
        rloo.train_rloo(path, path, HISTORIES, tmp_path / "out",
                        PolicySettings(max_steps=1, batch_size=6, rloo_generations=2, response_length=8), device="cpu")
    by_text = {tok.apply_chat_template(h, tokenize=False, add_generation_prompt=True): h for h in HISTORIES}
    (score, trl_kwargs), = called
    prompts, completions = trl_kwargs["prompts"], trl_kwargs["completions"]
    assert set(prompts) == set(by_text)  # every conversation was asked in the step
    assert scored == [[training_text(tok, by_text[p], c.strip()) for p, c in zip(prompts, completions)]]

    # the same rows with known completions: an empty one, one with the spaces a generation may carry
    for completion, answer in (("", ""), (" Simmer it.\n", "Simmer it.")):
        scored.clear()
        with pytest.raises(Stop):
            score(**{**trl_kwargs, "completions": [completion] * len(prompts)})
        assert scored == [[training_text(tok, by_text[p], answer) for p in prompts]]
