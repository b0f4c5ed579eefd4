"""Preference functions tell the corpus's answer styles apart the way their docstrings say."""
import random

import pytest

from rlhf.data import corpus
from rlhf.sim.preferences import PREFERENCES, ZOO, preference, satisfies


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
    for name in [*PREFERENCES, *ZOO]:
        assert callable(preference(name))
    assert set(PREFERENCES).isdisjoint(ZOO)
    with pytest.raises(ValueError, match="unknown preference 'kind'.*polite"):
        preference("kind")


# ---------------------------------------------------------------------------- the zoo

TIP = "Rinse the rice in cold water before you cook it."  # a cooking tip without a number
NUMBER_TIP = "Use about two cups of water for every cup of rice."
QUESTION = "How do I cook rice?"


@pytest.mark.parametrize("name, good, bad", [
    ("brief", TIP, f"Sure! {TIP} {NUMBER_TIP} Good luck!"),
    ("thorough", f"Sure! {TIP} {NUMBER_TIP} Let the rice rest with the lid on for ten minutes after cooking. "
                 "Good luck!", f"Sure! {TIP}"),
    ("calm", f"Of course. {TIP}", f"Sure! {TIP}"),
    ("specific", NUMBER_TIP, TIP),
    ("on_topic", TIP, "Plant tomatoes in a spot with at least six hours of sun."),
    ("echoes", TIP, "Bring a large pot of salted water to a boil."),
    ("signs_off", f"{TIP} Good luck!", f"Good luck! {TIP}"),
    ("polite_brief", f"Of course. {TIP}", f"Of course. {TIP} {NUMBER_TIP} Let me know if you have more questions."),
])
def test_each_zoo_preference_separates_its_good_and_bad_answer(name, good, bad):
    assert satisfies(name, QUESTION, good)
    assert not satisfies(name, QUESTION, bad)
    assert not satisfies(name, QUESTION, "")  # an empty answer never satisfies


def test_zoo_preferences_cut_across_the_corpus_styles():
    """Not one quality in disguise: every zoo preference is satisfied by some answers and not by
    others of at least one quality, or splits the qualities other than the way the shipped ones do."""
    rng = random.Random(1)
    for name in ZOO:
        mixed = 0
        for quality in corpus.QUALITIES:
            shares = _share(name, quality)
            mixed += 0.05 < shares < 0.95
        assert mixed >= 1 or name in ("on_topic", "brief", "thorough"), name
    assert rng  # deterministic corpus draws above


def test_length_budgets_are_graded_and_exact_at_the_budget():
    twelve, thirteen = " ".join(["word"] * 12), " ".join(["word"] * 13)
    assert preference("brief")("q", twelve) == 1.0
    assert preference("brief")("q", thirteen) < 0.5
    assert preference("thorough")("q", " ".join(["word"] * 30)) == 1.0
    assert preference("thorough")("q", " ".join(["word"] * 29)) < 0.5
    assert preference("thorough")("q", " ".join(["word"] * 25)) > preference("thorough")("q", twelve)


def test_two_criteria_mix_needs_both():
    long_polite = f"Of course. {TIP} {NUMBER_TIP} Let me know if you have more questions."
    assert preference("polite_brief")(QUESTION, f"Of course. {TIP}") == 1.0
    assert preference("polite_brief")(QUESTION, TIP) == 0.4  # brief, not polite
    assert preference("polite_brief")(QUESTION, long_polite) == 0.4  # polite, not brief
    assert preference("polite_brief")(QUESTION, f"Ugh, fine. {TIP}") == 0.4  # rude is not polite


def test_deployment_questions_are_few_fixed_and_a_quarter_outside_the_corpus():
    from rlhf.sim.questions import deployment_questions

    for n in (8, 16, 32):
        questions = deployment_questions(n)
        assert len(set(questions)) == n and questions == deployment_questions(n)
        outside = [q for q in questions if corpus.topic_of(q) is None]
        assert len(outside) == -(-n // 4), outside
        assert corpus.topic_of(questions[0]) is not None and corpus.topic_of(questions[3]) is None
    with pytest.raises(ValueError, match="between 1 and"):
        deployment_questions(0)


SMOLLM2_LIKE = ("Growing tomatoes is rewarding. Here are some tips:\n\n1. **Sunlight**: six to eight hours a day.\n"
                "2. **Water**: deeply, twice a week.\n3. **Soil**: rich and well drained.\n\nHappy gardening!")


def test_real_model_tastes_read_the_text_a_pretrained_chat_model_writes():
    from rlhf.sim.preferences import REAL, preference
    assert set(REAL) == {"short_answer", "as_list", "answer_first"} and preference("as_list") is REAL["as_list"]
    assert satisfies("as_list", "q", SMOLLM2_LIKE) and satisfies("answer_first", "q", SMOLLM2_LIKE)
    wind_up = ("When it comes to keeping your pet healthy and happy, it is important to consider a few key "
               "factors. First, feed it well.")
    assert not satisfies("answer_first", "q", wind_up)
    assert satisfies("answer_first", "q", "Feed it well and see a vet yearly. " + wind_up)
    assert not satisfies("as_list", "q", "- one bullet is not a list")
    assert satisfies("short_answer", "q", SMOLLM2_LIKE)
    assert satisfies("short_answer", "q", "word " * 120) and not satisfies("short_answer", "q", "word " * 121)
    assert not satisfies("short_answer", "q", "") and not satisfies("answer_first", "q", " ")
