"""The questions simulated users ask: a deployment's few distinct questions.

A team's help bot or a course assistant hears the same handful of questions all day, some of
them outside anything its base model was trained on. ``deployment_questions(n)`` is that shape:
``n`` fixed questions, a quarter of them (rounded up) about things the embedded corpus has no
topic for (``OUTSIDE_CORPUS``), the rest corpus-style questions (rlhf.data.corpus). The
closed-loop benchmark's ``--questions N`` and the zoo ablation's ``--questions N`` ask them.
"""
from __future__ import annotations

from rlhf.data import corpus

# everyday questions no corpus topic covers (rlhf.data.corpus.topic_of finds none of them)
OUTSIDE_CORPUS: tuple[str, ...] = (
    "How do I change a flat tire?",
    "What should I wear to a job interview?",
    "How do I get a stain out of a shirt?",
    "How can I learn to swim as an adult?",
    "What is a good way to clean an oven?",
    "How do I fix a squeaky door?",
    "How can I take better photos with my phone?",
    "How do I knit a scarf?",
    "What should I do if my car battery dies?",
    "How do I paint a room?",
    "How can I improve my chess?",
    "How do I make my phone battery last longer?",
)


def deployment_questions(n: int = 16, seed: int = 5) -> list[str]:
    """``n`` distinct questions: ``ceil(n / 4)`` from ``OUTSIDE_CORPUS`` and the rest corpus-style
    (``corpus.sample_prompts``), interleaved so any prefix mixes both; deterministic in ``seed``."""
    if not 1 <= n <= 4 * len(OUTSIDE_CORPUS):
        raise ValueError(f"questions must be between 1 and {4 * len(OUTSIDE_CORPUS)}, got {n}")
    outside = list(OUTSIDE_CORPUS[: -(-n // 4)])
    inside = corpus.sample_prompts(n - len(outside), seed=seed)
    out: list[str] = []
    for i in range(n):  # every fourth question is an outside one
        out.append(outside.pop(0) if i % 4 == 3 and outside else inside.pop(0) if inside else outside.pop(0))
    return out
