"""Preference functions tell the corpus's answer styles apart the way their docstrings say."""
import random

import pytest

from rlhf import corpus
from rlhf.preferences import EXPERIMENTAL, PREFERENCES, preference, satisfies


def _answers(quality: str, n: int = 60, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        topic = rng.choice(corpus.TOPICS)
        task = rng.choice(topic.tasks)
        question = rng.choice(corpus.TASK_QUESTIONS).format(task=task.phrase)
        out.append((question, corpus.make_answer(rng, quality, topic, task)))
    return out


def _share(name: str, quality: str) -> float:
    answers = _answers(quality)
    return sum(satisfies(name, q, a) for q, a in answers) / len(answers)


@pytest.mark.parametrize("name, liked, disliked", [
    ("polite", "helpful", "rude"),
    ("concise", "terse", "rambling"),
    ("detailed", "helpful", "terse"),
    ("on_topic", "helpful", "off_topic"),
])
def test_each_preference_likes_one_style_and_dislikes_another(name, liked, disliked):
    assert _share(name, liked) >= 0.9
    assert _share(name, disliked) <= 0.1


def test_detailed_counts_distinct_advice_and_rejects_filler():
    tip_a, tip_b = corpus.TOPICS[0].tasks[0].tips[:2]
    assert preference("detailed")("q", f"{tip_a} {tip_b}") == 1.0
    assert preference("detailed")("q", f"{tip_a} {tip_a}") < 0.5  # the same tip twice is one tip
    assert preference("detailed")("q", f"{corpus.RAMBLE_FILLERS[0]} {tip_a} {tip_b}") == 0.0
    assert preference("detailed")("q", "") == 0.0


def test_every_preference_is_reachable_by_name_and_unknown_names_are_clear_errors():
    for name in [*PREFERENCES, *EXPERIMENTAL]:
        assert callable(preference(name))
    assert set(PREFERENCES).isdisjoint(EXPERIMENTAL)
    with pytest.raises(ValueError, match="unknown preference 'kind'.*polite"):
        preference("kind")
