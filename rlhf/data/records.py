"""Plain records of stored feedback: what the web layer hands to the training code.

``rlhf`` never touches the database; ``webapp`` reads conversations into these dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FeedbackRecord:
    thumb: str | None = None  # "up" / "down"
    rating: int | None = None  # 1..5
    correction: str | None = None
    comment: str | None = None
    reasons: tuple[str, ...] = ()
    flag: str | None = None  # the user's flag category (rlhf.data.criteria.FLAG_VALUES), None when not flagged

    def score(self) -> float | None:
        """Thumbs and stars folded into one number in [-1, 1] (None when neither was given):
        up = +1, down = -1, rating r = (r - 3) / 2; both given -> their mean."""
        parts = []
        if self.thumb == "up":
            parts.append(1.0)
        elif self.thumb == "down":
            parts.append(-1.0)
        if self.rating is not None:
            parts.append((self.rating - 3) / 2)
        return sum(parts) / len(parts) if parts else None


@dataclass(frozen=True)
class MessageRecord:
    id: int
    role: str  # "user" / "assistant" / "system"
    content: str
    parent_id: int | None = None
    feedback: FeedbackRecord | None = None  # the conversation owner's feedback (assistant messages)
    model_version: str | None = None
    # A guided regeneration's instruction ("More Concise"): this answer was asked for instead of a sibling,
    # with that change in mind; its prompt is still its question (the parent), never the sibling.
    guidance: str | None = None
    cut: bool = False  # the answer stopped at the generation limit, not where the model ended it


@dataclass(frozen=True)
class ComparisonRecord:
    id: int
    prompt_message_id: int
    a_id: int
    b_id: int
    winner: str | None  # "a" / "b" / "tie" / "both_bad" / None (not voted)


@dataclass(frozen=True)
class ConversationRecord:
    id: int
    messages: tuple[MessageRecord, ...]
    comparisons: tuple[ComparisonRecord, ...] = field(default=())
    user_id: int | None = None
