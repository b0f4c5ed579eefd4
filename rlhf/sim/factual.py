"""Simple factual questions and their right answers: the capability check of a real-model loop.

A candidate trained toward a taste (lists, brevity) must not forget what its parent knew. The check
asks each question greedily (the same text every time), counts the parent's right answers, and asks
how many of those the candidate still gets right (benchmarks/real_model_cycle.py). An answer is right
when it contains one of the accepted spellings as a word (case-insensitive).
"""
from __future__ import annotations

import re

# (question, accepted answers): facts a 135 M-parameter chat model mostly knows, one word or number each
FACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("paris",)),
    ("What is the capital of Japan?", ("tokyo",)),
    ("What is the capital of Italy?", ("rome",)),
    ("What is the capital of Germany?", ("berlin",)),
    ("What is the capital of Spain?", ("madrid",)),
    ("What is the capital of the United Kingdom?", ("london",)),
    ("What is the largest planet in our solar system?", ("jupiter",)),
    ("Which planet is known as the Red Planet?", ("mars",)),
    ("What is the chemical symbol for water?", ("h2o", "h₂o")),
    ("How many days are there in a week?", ("seven", "7")),
    ("How many continents are there on Earth?", ("seven", "7")),
    ("What is the boiling point of water in degrees Celsius at sea level?", ("100",)),
    ("What gas do plants absorb from the air for photosynthesis?", ("carbon dioxide", "co2")),
    ("Who wrote the play Romeo and Juliet?", ("shakespeare",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("What is 2 plus 2?", ("four", "4")),
    ("How many legs does a spider have?", ("eight", "8")),
    ("What is the freezing point of water in degrees Celsius?", ("0", "zero")),
    ("What is the closest star to Earth?", ("sun",)),
    ("Which animal is known as the king of the jungle?", ("lion",)),
    ("What color do you get when you mix blue and yellow?", ("green",)),
    ("How many hours are there in a day?", ("24", "twenty-four", "twenty four")),
    ("What is the main language spoken in Brazil?", ("portuguese",)),
    ("What is the tallest mountain in the world?", ("everest",)),
)


def is_right(answer: str, accepted: tuple[str, ...]) -> bool:
    """Whether ``answer`` contains one of ``accepted`` as a whole word or number."""
    text = answer.lower()
    return any(re.search(r"(?<![\w.])" + re.escape(a) + r"(?![\w])", text) for a in accepted)


def right_answers(answers: list[str]) -> list[bool]:
    """Which of ``answers`` (to :data:`FACTS`' questions, in order) are right."""
    if len(answers) != len(FACTS):
        raise ValueError(f"{len(answers)} answers to {len(FACTS)} questions")
    return [is_right(a, accepted) for a, (_, accepted) in zip(answers, FACTS)]


def kept_share(parent: list[bool], candidate: list[bool]) -> float | None:
    """Share of the parent's right answers the candidate still gets right (None: the parent knew none)."""
    known = [c for p, c in zip(parent, candidate) if p]
    return None if not known else sum(known) / len(known)
