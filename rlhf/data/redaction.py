"""Redaction of e-mail addresses and phone numbers in free text (exports and training data).

Pure Python, no Flask: ``redact_text`` replaces each e-mail address with ``[EMAIL]`` and each
phone number with ``[PHONE]``; ``redact_value`` does it to every string inside nested dicts,
lists and tuples (export rows); ``redact_records`` to the text of plain feedback records
(message contents, corrections, comments).

Phone numbers are recognised by their shape, not by a country's numbering plan, so that
ordinary numbers survive: years (2024), prices (1,299.99), versions (1.12.0), times (12:30),
dates (2024-01-15), IP addresses and short counts are never touched. What counts as a phone:

* international: ``+`` or ``00`` and a country code, then groups separated by spaces, dots,
  dashes or parentheses, 8 to 15 digits in all (E.164's maximum): ``+44 20 7946 0958``,
  ``+1 (555) 123-4567``, ``0049 30 1234 5678``, ``+4915112345678``;
* North American: ``(555) 123-4567``, ``555-123-4567``, ``555.123.4567``, ``555 123 4567``;
* national numbers with a trunk ``0``: ``020 7946 0958``, ``07700 900123``, ``06 12 34 56 78``,
  ``030-12345678``, ``07700900123`` (9 to 12 digits).

A bare digit run without ``+``/``00``/``0`` in front and without separators (an order number,
a timestamp) is left alone: it cannot be told apart from an ordinary number.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable

EMAIL_TOKEN = "[EMAIL]"
PHONE_TOKEN = "[PHONE]"

_EMAIL = re.compile(
    r"(?<![\w.%+-])"  # not in the middle of a longer token
    r"[A-Za-z0-9](?:[A-Za-z0-9._%+-]*[A-Za-z0-9_%+-])?"  # local part (plus tags, dots)
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,24}"  # (sub)domains and TLD
    r"(?![\w-])")

_SEP = r"[ .\-\u00a0]"  # one separator between digit groups
_PHONE = re.compile(
    r"(?<![\w+.,-])"  # not glued to a word, a decimal or a version
    r"(?:"  # (only two adjacent digit runs without a separator: no catastrophic backtracking)
    # international: +CC or 00CC, an optional (area), then up to 6 groups
    rf"(?:\+|\b00)\d{{1,3}}(?:{_SEP}?\(\d{{1,4}}\))?{_SEP}?\d{{1,12}}(?:{_SEP}(?:\(\d{{1,12}}\)|\d{{1,12}})){{0,5}}"
    # North American: (555) 123-4567 / 555-123-4567 / 555.123.4567 / 555 123 4567
    rf"|(?:\(\d{{3}}\){_SEP}?|\b[2-9]\d{{2}}{_SEP})\d{{3}}{_SEP}\d{{4}}"
    # national with trunk 0: 020 7946 0958, 07700 900123, 06 12 34 56 78, 07700900123
    rf"|\b0\d{{1,4}}{_SEP}?\d{{2,8}}(?:{_SEP}\d{{2,8}}){{0,3}}"
    r")"
    r"(?![\w.,:/-]?\d)(?!\w)")  # ... and not followed by more digits of the same number


def _digits(text: str) -> int:
    return sum(c.isdigit() for c in text)


def is_phone_number(text: str) -> bool:
    """Whether ``text``, a match of the phone pattern, has a phone number's digit count (the
    safety rail's phone preset uses the same rules: ``rlhf.safety.rules``)."""
    digits = _digits(text)
    if text.startswith("+"):
        ok = 8 <= digits <= 15
    elif text.startswith("00"):
        ok = 10 <= digits <= 17  # 00 + up to 15 digits
    elif text.startswith("0"):
        ok = 9 <= digits <= 12 and not re.fullmatch(r"0\d{3}-\d{2}-\d{2}", text)  # not a date like 0024-01-15
    else:
        ok = digits == 10
    return ok


def _phone(match: re.Match) -> str:
    text = match.group(0)
    return PHONE_TOKEN if is_phone_number(text) else text


def redact_text(text: str) -> str:
    """``text`` with every e-mail address replaced by ``[EMAIL]`` and phone number by ``[PHONE]``."""
    if not text or not any(c.isdigit() or c == "@" for c in text):
        return text
    return _PHONE.sub(_phone, _EMAIL.sub(EMAIL_TOKEN, text))


def redact_value(value: Any) -> Any:
    """Every string inside ``value`` (dicts, lists, tuples; keys are kept) redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def redact_records(records: Iterable[Any]) -> list[Any]:
    """Plain feedback records (:mod:`rlhf.data.records`) with their free text redacted: message
    contents, corrections and comments. Ids, roles, ratings and versions are kept."""
    out = []
    for conv in records:
        messages = []
        for m in conv.messages:
            fb = m.feedback
            if fb is not None:
                fb = replace(fb, correction=redact_text(fb.correction) if fb.correction else fb.correction,
                             comment=redact_text(fb.comment) if fb.comment else fb.comment)
            messages.append(replace(m, content=redact_text(m.content), feedback=fb))
        out.append(replace(conv, messages=tuple(messages)))
    return out
