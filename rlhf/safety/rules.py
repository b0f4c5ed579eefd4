"""The output rail's rules: blocked phrases, regular expressions and personal-data presets.

Pure Python (the ``regex`` package, which transformers already needs): ``build_rules`` turns
plain ``(kind, value)`` specs into compiled :class:`Rule` objects, ``validate_pattern`` and
``validate_phrase`` say what is wrong with an admin's input (a message, or None).

* ``phrase``: case-insensitive, word-boundary aware where the phrase starts/ends with a letter or
  digit ("ass" blocks "ass", never "class"); the words may be separated by any run of whitespace.
* ``pattern``: a regular expression (case-insensitive), at most ``MAX_PATTERN_CHARS`` long; one that
  does not compile, matches the empty string or backtracks catastrophically on probe strings is
  refused. Every search runs with a time limit (``SEARCH_TIMEOUT_S``): a rule that exceeds it
  counts as a violation (fail closed) rather than letting text through unchecked.
* ``preset``: built-in personal-data detectors (``PRESETS``): e-mail address, phone number (the
  shapes :mod:`rlhf.data.redaction` redacts), payment card number (13-19 digits passing the Luhn check),
  US SSN-shaped number (``123-45-6789``, never the invalid 000/666/9xx areas), IBAN (country code,
  check digits, mod-97 valid).

Rules are matched with ``partial=True`` by the streaming checker (``rlhf.safety.checker``): a
partial match reaching the end of the text so far is a prefix that could still become a match.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import regex

from rlhf.data.redaction import _EMAIL, _PHONE, is_phone_number

KINDS = ("phrase", "pattern", "preset")
MAX_PATTERN_CHARS = 200
MAX_PHRASE_CHARS = 200
SEARCH_TIMEOUT_S = 0.05  # per rule and check; far above a sane rule's cost on an answer (microseconds)
PROBE_TIMEOUT_S = 0.02
# strings a catastrophic pattern backtracks on (each repeated character, then a character that breaks the match)
_PROBES = tuple(c * 200 + end for c in ("a", "1", " ", ".", "-", "x@", "ab") for end in ("!", "\x00"))


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a payment card number (digits only)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_ok(text: str) -> bool:
    digits = "".join(c for c in text if c.isdigit())
    return 13 <= len(digits) <= 19 and len(set(digits)) > 1 and luhn_ok(digits)


def iban_ok(text: str) -> bool:
    """ISO 13616: 15-34 characters, the check digits make the number mod 97 equal 1."""
    s = "".join(text.split()).upper()
    if not 15 <= len(s) <= 34 or not s[:2].isalpha() or not s[2:4].isdigit() or not s.isalnum():
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


@dataclass(frozen=True)
class Preset:
    label: str
    pattern: str
    flags: int = 0
    valid: Callable[[str], bool] | None = None


PRESETS: dict[str, Preset] = {
    "email": Preset("e-mail address", _EMAIL.pattern),
    "phone": Preset("phone number", _PHONE.pattern, valid=is_phone_number),
    "card": Preset("payment card number (Luhn)", r"(?<![\d.,-])\d(?:[ -]?\d){12,18}(?![\d])", valid=_card_ok),
    "ssn": Preset("US SSN-shaped number", r"(?<![\d-])(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?![\d-])"),
    "iban": Preset("IBAN", r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])", valid=iban_ok),
}


@dataclass(frozen=True)
class Rule:
    """One compiled rule. ``name`` is what an intervention records as its reason."""

    kind: str
    value: str
    compiled: "regex.Pattern"
    valid: Callable[[str], bool] | None = None

    @property
    def name(self) -> str:
        if self.kind == "preset":
            return f"preset: {PRESETS[self.value].label}"
        return f"{self.kind}: {self.value}"

    def matches(self, text: str, pos: int = 0) -> Iterator["regex.Match"]:
        """Matches from ``pos`` on, the last one possibly partial (``m.partial``); raises TimeoutError."""
        return self.compiled.finditer(text, pos, partial=True, timeout=SEARCH_TIMEOUT_S)


def phrase_regex(phrase: str) -> str:
    words = phrase.split()
    body = r"\s+".join(regex.escape(w) for w in words)
    start = r"(?<!\w)" if regex.match(r"\w", words[0]) else ""
    end = r"(?!\w)" if regex.search(r"\w$", words[-1]) else ""
    return start + body + end


def validate_phrase(phrase: str) -> str | None:
    """Why ``phrase`` cannot be a rule (None: it can)."""
    if not phrase.strip():
        return "A phrase must not be empty."
    if len(phrase) > MAX_PHRASE_CHARS:
        return f"A phrase may have at most {MAX_PHRASE_CHARS} characters."
    return None


def _compile_pattern(pattern: str) -> "regex.Pattern":
    return regex.compile(pattern, regex.IGNORECASE | regex.V0)


def validate_pattern(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a rule (None: it can): empty, too long, not a regular expression,
    matches the empty string (it would block every answer), or too slow on probe strings."""
    if not pattern.strip():
        return "A pattern must not be empty."
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"A pattern may have at most {MAX_PATTERN_CHARS} characters."
    try:
        compiled = _compile_pattern(pattern)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        return f"Not a valid regular expression: {exc}."
    try:
        for probe in ("", "x", " ", "1"):
            found = compiled.search(probe, timeout=PROBE_TIMEOUT_S)
            if found is not None and found.group(0) == "":
                return "The pattern matches the empty string (it would block every answer)."
        own = sorted({c for c in pattern if c.isalnum()})[:20]  # runs of the pattern's own characters too
        for probe in _PROBES + tuple(c * 200 + end for c in own for end in ("!", "\x00")):
            compiled.search(probe, timeout=PROBE_TIMEOUT_S)
            compiled.search(probe, partial=True, timeout=PROBE_TIMEOUT_S)
    except TimeoutError:
        return ("The pattern is too slow (catastrophic backtracking, e.g. nested repetition like (a+)+): "
                "write it without repeating a repeated group.")
    return None


def build_rule(kind: str, value: str) -> Rule:
    """A compiled rule; ValueError with the reason when ``value`` is not usable."""
    if kind == "phrase":
        problem = validate_phrase(value)
        if problem:
            raise ValueError(problem)
        return Rule(kind, value.strip(), regex.compile(phrase_regex(value.strip()), regex.IGNORECASE | regex.V0))
    if kind == "pattern":
        problem = validate_pattern(value)
        if problem:
            raise ValueError(problem)
        return Rule(kind, value, _compile_pattern(value))
    if kind == "preset":
        preset = PRESETS.get(value)
        if preset is None:
            raise ValueError(f"Unknown preset {value!r}; presets: {', '.join(PRESETS)}.")
        return Rule(kind, value, regex.compile(preset.pattern, preset.flags | regex.V0), preset.valid)
    raise ValueError(f"Unknown rule kind {kind!r}; kinds: {', '.join(KINDS)}.")


def build_rules(specs: Iterable[tuple[str, str]]) -> tuple[Rule, ...]:
    """Rules from ``(kind, value)`` specs; a spec that no longer builds (a stored pattern this version
    refuses) is skipped, never an error at answer time."""
    rules = []
    for kind, value in specs:
        try:
            rules.append(build_rule(kind, value))
        except ValueError:
            continue
    return tuple(rules)
