"""Requests a front end makes for itself rather than for a person's chat turn.

Open WebUI asks its task model -- by default the chat model itself -- for chat titles, tags,
follow-up suggestions, search queries, autocompletions, image prompts and emoji: one user message
built from a template, sent with the chat's ``X-OpenWebUI-Chat-Id``. Stored, each became a turn of
that person's conversation (Open WebUI's own titles then read "Task: Generate a concise title..."),
and training data that taught the model to answer questions with JSON titles. They are answered
like any completion and never stored: no conversation, no answer to rate, nothing to train on.

Recognised by the opening of Open WebUI's default templates (its ``DEFAULT_*_PROMPT_TEMPLATE``
settings): "### Task:" for all but two, whose openings are listed too. A template an
admin rewrote to open differently is not recognised (docs/integrations/open-webui.md).
"""
from __future__ import annotations

from typing import Sequence

TASK_OPENINGS = (
    "### Task:",  # title, tags, follow-ups, search queries, autocompletion, image prompt
    "Your task is to reflect the speaker's likely facial expression",  # emoji (voice calls)
    "You have been provided with a set of responses from various models",  # mixture of agents
)


def is_frontend_task(messages: Sequence[dict[str, str]]) -> bool:
    """Whether a request's messages are a front end's task prompt: one user message (a system
    message beside it at most) that opens like one of Open WebUI's task templates."""
    users = [m for m in messages if m["role"] == "user"]
    return (len(users) == 1 and all(m["role"] in ("system", "user") for m in messages)
            and users[0]["content"].lstrip().startswith(TASK_OPENINGS))
