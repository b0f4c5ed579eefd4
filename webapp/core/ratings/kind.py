"""What a rating kind is: one field of a rater's feedback on an answer (a thumb, stars, a
correction...), stored in the feedback row's column of the same name. Each kind's module defines
one :class:`RatingKind`; webapp.core.ratings.registry lists those in use."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class RatingKind:
    """One kind of rating, all there is to know about it in one place.

    ``name``: the key in the chat page's and /v1's requests and answers, the feedback row's column,
    and the field of rlhf's ``FeedbackRecord`` that carries it into training and the exports.
    ``parse``: the request's object (holding ``name``) -> the value to store; a BadRequest says what
    is wrong, in the words both APIs answer with. ``empty``: what a row holds before the kind is
    given. ``show``: the stored value as the APIs and the feedback browser show it. ``record``: the
    stored value as ``FeedbackRecord`` holds it (None: not handed to training or exports).
    ``event``: the name under which answers carrying it count as rated answers (feedback events,
    the retrain threshold); None when it alone does not make an answer rated."""

    name: str
    parse: Callable[[dict[str, Any]], Any]
    empty: Any = None
    show: Callable[[Any], Any] = same
    record: Callable[[Any], Any] | None = same
    event: str | None = None
