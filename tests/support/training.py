"""What the reward, policy and gate tests share (tests/rlhf/reward, policy, gate): the micro policy's
settings, clean helpful-over-rude pairs, prompts from the corpus and a policy's mean reward."""
from __future__ import annotations

import random

import torch

from rlhf.data import corpus
from rlhf.models.loading import load_causal_lm
from rlhf.models.sampling import sample_answers
from rlhf.reward.scoring import load_reward_model, score_texts
from rlhf.settings import EvalSettings, PolicySettings

MICRO_POLICY = PolicySettings(episodes=128, batch_size=8, mini_batches=1, learning_rate=3e-3, response_length=24,
                              epochs=1.0, rloo_generations=4)


def clean_pairs(n: int, seed: int) -> list[dict]:
    """Helpful answers preferred over rude ones (a preference a reward model must learn)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topic = rng.choice(corpus.TOPICS)
        task = rng.choice(topic.tasks)
        q = rng.choice(corpus.TASK_QUESTIONS).format(task=task.phrase)
        rows.append({"prompt": [{"role": "user", "content": q}],
                     "chosen": [{"role": "assistant", "content": corpus.make_answer(rng, "helpful", topic, task)}],
                     "rejected": [{"role": "assistant", "content": corpus.make_answer(rng, "rude", topic, task)}],
                     "margin": 1.0})
    return rows



def prompts(n: int = 32) -> list[list[dict]]:
    return [[{"role": "user", "content": q}] for q in corpus.sample_prompts(n)]


def mean_reward(policy_dir, reward_path, seed: int = 0) -> float:
    model, tok = load_causal_lm(policy_dir, "cpu")
    rm, rtok = load_reward_model(reward_path)
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts()] * 4
    torch.manual_seed(seed)
    answers, _, _ = sample_answers(model, tok, texts, EvalSettings(max_new_tokens=24))
    scores = score_texts(rm, rtok, [p + " " + a + tok.eos_token for p, a in zip(texts, answers)])
    return sum(scores) / len(scores)
