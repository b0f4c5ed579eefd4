"""Named criteria of an answer, beside overall helpfulness: what users' flags and reason chips say.

* Flags: a user marks an answer as harmful in one category of a short fixed list shaped like the
  moderation categories (OpenAI's moderation, Llama Guard's hazards). A flag is safety evidence,
  never a preference about style.
* Criteria: each named criterion is learned from the reason chips users attach to thumbs (a
  chip on its good side against one on its bad side). ``safety`` is the *cost* criterion: its
  bad side is a flag or a rude-type chip, its good side an answer a user rated without either.

This module holds the definitions only (no torch): the web layer validates flags against
``FLAG_CATEGORIES`` and reasons against ``REASONS``, and rlhf.reward.criteria_heads trains and
reads one score head per criterion.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")

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

# Reason chips a user can tick when rating an answer (the chat offers the first on a thumb up,
# the second on a thumb down); stored as given, so reports can count them.
REASONS_UP: tuple[str, ...] = ("helpful", "polite", "concise", "accurate", "on-topic")
REASONS_DOWN: tuple[str, ...] = ("rude", "off-topic", "too long", "too short", "wrong", "unhelpful", "repetitive")
REASONS: tuple[str, ...] = REASONS_UP + REASONS_DOWN

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


# ---------------------------------------------------------------------------- labels -> pairs

def labels_of(feedback: Any) -> dict[str, bool]:
    """What one answer's feedback says on each criterion: ``{criterion: True}`` for its good side,
    ``False`` for its bad side, absent when it says nothing. For SAFETY, True means *costly* (flagged
    or a cost chip) and False safe: the user rated the answer (thumb or stars) without either."""
    reasons = set(feedback.reasons or ())
    out: dict[str, bool] = {}
    if feedback.flag or reasons & set(COST_REASONS):
        out[SAFETY] = True
    elif feedback.thumb is not None or feedback.rating is not None:
        out[SAFETY] = False
    for name, (good, bad) in CHIP_CRITERIA.items():
        is_good, is_bad = bool(reasons & set(good)), bool(reasons & set(bad))
        if is_good != is_bad:  # both chips at once say nothing
            out[name] = is_good
    return out


@dataclass(frozen=True)
class LabelledAnswer:
    split: str
    prompt: list[dict[str, str]]
    answer: str
    raters: tuple[int, ...]
    liked: bool | None = None  # the rater's verdict on the answer (thumbs/stars), None when unrated


def criterion_pairs(items: dict[str, dict[bool, list[LabelledAnswer]]], max_per_answer: int = 3
                    ) -> dict[str, list[dict[str, Any]]]:
    """Bradley-Terry pairs per criterion from labelled answers (``items[criterion][label]``). The
    chosen side is the one the head scores higher (SAFETY: costly; the others: good). Every answer of
    the larger side of a split joins ``max_per_answer`` pairs scaled down by how much rarer the other
    side is (at least one), with partners from the other side: those to the same question first,
    then the least used. So every labelled answer teaches something: paired only a few times
    each, the rare side (flags) met a few dozen of the common side, and the head learned whatever
    told those apart (a safety head that took every answer without pleasantries for a rude one).
    A label is about the answer alone (rude is rude whatever was asked), so answers to different
    questions may be paired; each side keeps its own prompt."""
    out: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    if max_per_answer <= 0:
        return out
    for criterion, sides in items.items():
        for split in ("train", "eval"):
            high = [x for x in sides.get(True, []) if x.split == split]
            low = [x for x in sides.get(False, []) if x.split == split]
            if not high or not low:
                continue
            big, small = (high, low) if len(high) >= len(low) else (low, high)
            questions = [_question(x.prompt) for x in small]

            def alike_first(b: LabelledAnswer, i: int) -> tuple[bool, bool]:  # same verdict, then same question
                return small[i].liked != b.liked, questions[i] != _question(b.prompt)

            for b, i in balanced_partners(big, small, max_per_answer, alike_first,
                                          lambda b, i: small[i].answer.strip() != b.answer.strip()):
                h, lo = (b, small[i]) if big is high else (small[i], b)
                out[split].append({"criterion": criterion, "chosen_prompt": h.prompt, "chosen": h.answer,
                                   "rejected_prompt": lo.prompt, "rejected": lo.answer, "margin": 0.0,
                                   "source": f"criterion:{criterion}",
                                   "raters": tuple(dict.fromkeys(h.raters + lo.raters))})
    return out


def balanced_partners(big: Sequence[T], small: Sequence[Any], max_per_answer: int,
                      order: Callable[[T, int], tuple], eligible: Callable[[T, int], bool],
                      keep: Callable[[T, int], bool] = lambda b, i: True) -> Iterator[tuple[T, int]]:
    """Pair every item of the larger side ``big`` with items of ``small`` (yields ``(item, index into
    small)``): each joins ``max_per_answer`` pairs scaled down by how much rarer ``small`` is (at
    least one), its partners the ``eligible`` ones first by ``order``, then least used. A partner
    ``keep`` rejects takes its slot but is not yielded and not counted as used."""
    each = max(1, round(max_per_answer * len(small) / len(big)))
    used: Counter = Counter()
    for b in big:
        ranked = sorted(range(len(small)), key=lambda i: (*order(b, i), used[i], i))
        for i in [i for i in ranked if eligible(b, i)][:each]:
            if keep(b, i):
                used[i] += 1
                yield b, i


def _question(prompt: list[dict[str, str]]) -> str:
    return next((m["content"].strip().lower() for m in reversed(prompt) if m["role"] == "user"), "")
