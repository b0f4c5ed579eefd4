"""Training settings picked by the model's size (rlhf.models.size_settings)."""
from __future__ import annotations

import dataclasses

from transformers import AutoModelForCausalLM

from rlhf.models.size_settings import LARGE, LARGE_PARAMETERS, parameter_count, sized_to_model
from rlhf.settings import CycleSettings

SMOLLM2 = 134_515_584  # SmolLM2-135M-Instruct, as imported from its GGUF file


def _get(settings, dotted):
    for part in dotted.split("."):
        settings = getattr(settings, part)
    return settings


def test_parameter_count_reads_the_stored_weights(micro_model_dir):
    model = AutoModelForCausalLM.from_pretrained(micro_model_dir)
    assert parameter_count(micro_model_dir) == model.num_parameters()


def test_parameter_count_of_a_folder_without_weights_is_unknown(tmp_path):
    assert parameter_count(tmp_path) is None


def test_a_small_model_keeps_the_defaults():
    settings = CycleSettings()
    for parameters in (1_043_072, LARGE_PARAMETERS - 1, None):
        assert sized_to_model(settings, parameters) == (settings, [])


def test_a_large_model_gets_the_large_settings():
    sized, notes = sized_to_model(CycleSettings(), SMOLLM2)
    for name, value in LARGE.items():
        assert _get(sized, name) == value, name
    assert sized.reward.trainable_layers == 2 and sized.policy.lora
    assert len(notes) == 1 and "134.5 M parameters" in notes[0] and "reward.trainable_layers=2" in notes[0]
    # what the profile does not name stays as it was
    assert sized.gate == CycleSettings().gate and sized.reward.batch_size == CycleSettings().reward.batch_size
    sized.validate()


def test_what_the_operator_set_is_kept():
    mine = CycleSettings()
    mine = dataclasses.replace(mine, reward=dataclasses.replace(mine.reward, learning_rate=3e-5),
                               policy=dataclasses.replace(mine.policy, lora=False))
    sized, notes = sized_to_model(mine, SMOLLM2, explicit={"reward.learning_rate", "policy.lora"})
    assert sized.reward.learning_rate == 3e-5 and sized.policy.lora is False
    assert sized.reward.trainable_layers == 2
    assert "reward.learning_rate" not in notes[0] and "policy.lora" not in notes[0]


def test_settings_already_at_the_large_values_say_nothing():
    sized, _ = sized_to_model(CycleSettings(), SMOLLM2)
    assert sized_to_model(sized, SMOLLM2) == (sized, [])


def test_a_length_beyond_the_context_is_cut_to_fit(micro_model_dir):
    """A generation length meant for a large model (or set too high) on a small context: the answer
    stops where the positions end instead of indexing past them."""
    from rlhf.models import sampling
    from rlhf.models.loading import answer_length, context_length, load_causal_lm
    from rlhf.settings import EvalSettings

    model, tok = load_causal_lm(micro_model_dir)
    ctx = context_length(model)
    assert answer_length(model, 4096) == ctx - 8 and answer_length(model, 16) == 16
    prompt = tok.apply_chat_template([{"role": "user", "content": "How do I water tomatoes?"}], tokenize=False,
                                     add_generation_prompt=True)
    _, prompt_ids, answer_ids = sampling.sample_answers(model, tok, [prompt], EvalSettings(max_new_tokens=4096))
    assert len(prompt_ids[0]) + len(answer_ids[0]) <= ctx
