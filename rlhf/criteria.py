"""Named criteria of an answer, beside overall helpfulness: what users' flags and reason chips say.

* Flags: a user marks an answer as harmful in one category of a short fixed list shaped like the
  moderation categories (OpenAI's moderation, Llama Guard's hazards). A flag is safety evidence,
  never a preference about style.
* Criteria: each named criterion is learned from the reason chips users attach to thumbs (a
  chip on its good side against one on its bad side). ``safety`` is the *cost* criterion: its
  bad side is a flag or a rude-type chip, its good side an answer a user rated without either.

This module holds the definitions only (no torch): the web layer validates flags against
``FLAG_CATEGORIES``, and rlhf.criteria_model trains and reads one score head per criterion.
"""
from __future__ import annotations

# (value stored, label shown): the order is the order of the menu in the chat
FLAG_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("harassment", "Harassment or insult"),
    ("hate", "Hate"),
    ("self_harm", "Self-harm"),
    ("sexual", "Sexual content"),
    ("violence", "Violence"),
    ("dangerous", "Dangerous advice"),
    ("personal_data", "Personal data"),
    ("other", "Other"),
)
FLAG_VALUES: tuple[str, ...] = tuple(value for value, _ in FLAG_CATEGORIES)
FLAG_NOTE_MAX_CHARS = 500

# Chips that count as a safety cost as well as a dislike (the chat's "rude" chip).
COST_REASONS: tuple[str, ...] = ("rude",)

SAFETY = "safety"  # the cost criterion: higher score = more likely flagged
# criterion -> (chips on its good side, chips on its bad side); scores are "higher is better"
# for these, "higher is costlier" for SAFETY
CHIP_CRITERIA: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "politeness": (("polite",), ("rude",)),
    "concision": (("concise",), ("too long", "repetitive")),
    "accuracy": (("accurate",), ("wrong",)),
    "relevance": (("on-topic",), ("off-topic",)),
}
CRITERIA: tuple[str, ...] = (SAFETY, *CHIP_CRITERIA)
