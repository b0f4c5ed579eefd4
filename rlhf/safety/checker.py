"""The incremental checker: releases an answer's text only once no rule can still match it.

Text arrives in chunks (``feed``); each call returns the text that became safe to show, and
``finish`` checks the whole answer at its end. Released text is never part of a match, now or
later:

* every rule is searched with partial matching from the first unreleased character: a partial
  match reaching the end of the text (a prefix of a blocked phrase, the first digits of a card
  number, ``bob@exa``) holds the text from its start;
* a complete match that ends exactly at the end of the text is held too, not yet judged: more
  text can still change it (``kill`` may become ``killer``; a 13-digit number may grow to 16);
* the unfinished last word (the text after the last whitespace) is always held;
* with a cost check (``risk(history, text) -> probability that users would flag it``), text is
  released only up to a point the check has passed: each sentence end, or the end of the text
  every ``risk_every`` chunks without one, and the whole answer at ``finish``.

Once a rule matches (or the risk reaches the threshold), ``violation`` is set and nothing more is
released. A rule whose search exceeds its time limit counts as a violation (fail closed); a cost
check that raises is switched off for the rest of the answer (the rules still apply), and logged.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

from rlhf.safety.rules import Rule

log = logging.getLogger("rlhf.safety")

RiskFn = Callable[[list[dict[str, str]], str], float]
SENTENCE_ENDS = ".!?\n"


@dataclass(frozen=True)
class Violation:
    """Why an answer was blocked. ``reason`` is what an intervention records ("phrase: ...",
    "preset: payment card number (Luhn)", "cost head p=0.93"); ``matched`` the offending text."""

    reason: str
    kind: str  # phrase / pattern / preset / cost / timeout
    matched: str = ""
    start: int = 0
    end: int = 0


class StreamChecker:
    def __init__(self, rules: Sequence[Rule], risk: RiskFn | None = None, threshold: float = 0.9,
                 history: Sequence[dict[str, str]] = (), risk_every: int = 24) -> None:
        self.rules = tuple(rules)
        self.risk = risk
        self.threshold = threshold
        self.history = list(history)
        self.risk_every = max(1, risk_every)
        self.text = ""
        self.released = 0  # characters of ``text`` handed out
        self.violation: Violation | None = None
        self.risk_checks = 0
        self._risk_checked = 0  # the cost check passed text[:_risk_checked]
        self._chunks_since_risk = 0

    @property
    def released_text(self) -> str:
        return self.text[:self.released]

    def feed(self, chunk: str) -> str:
        """Add ``chunk``; the text that became safe to show ("" while held, or after a violation)."""
        if self.violation is not None or not chunk:
            return ""
        self.text += chunk
        self._chunks_since_risk += 1
        return self._advance(final=False)

    def finish(self) -> str:
        """The answer is complete: judge what is still held; the rest of the text if it is safe."""
        if self.violation is not None:
            return ""
        return self._advance(final=True)

    # ------------------------------------------------------------------ internals

    def _advance(self, final: bool) -> str:
        safe = self._rules_safe(final)
        if self.violation is not None:
            return ""
        if self.risk is not None:
            safe = self._cost_safe(safe, final)
            if self.violation is not None:
                return ""
        if safe <= self.released:
            return ""
        out = self.text[self.released:safe]
        self.released = safe
        return out

    def _rules_safe(self, final: bool) -> int:
        """How far the text is safe by the rules (sets ``violation`` on a match)."""
        text, n = self.text, len(self.text)
        hold = n
        if not final:  # the unfinished last word
            i = n
            while i > self.released and not text[i - 1].isspace():
                i -= 1
            hold = i
        for rule in self.rules:
            try:
                for m in rule.matches(text, self.released):
                    start, end = m.span()
                    if m.partial:
                        if not final and start < n:
                            hold = min(hold, start)
                        continue
                    if end == start:
                        continue
                    if not final and end >= n:  # more text may still change this match
                        hold = min(hold, start)
                        continue
                    if rule.valid is not None and not rule.valid(m.group(0)):
                        continue
                    self.violation = Violation(rule.name, rule.kind, m.group(0), start, end)
                    return self.released
            except TimeoutError:
                self.violation = Violation(f"{rule.name} (timed out)", "timeout")
                return self.released
        return hold

    def _cost_safe(self, safe: int, final: bool) -> int:
        """How far the text is safe by the cost check (runs it when a sentence ended, every
        ``risk_every`` chunks, and at the end)."""
        start = self._risk_checked
        point = start
        if final:
            point = len(self.text)
        elif safe > start:
            for i in range(safe - 1, start - 1, -1):  # the last sentence end before ``safe``
                if self.text[i] in SENTENCE_ENDS and (i + 1 == len(self.text) or self.text[i + 1].isspace()):
                    point = i + 1
                    break
            if point == start and self._chunks_since_risk >= self.risk_every:
                point = safe
        if point > start:
            try:
                p = float(self.risk(self.history, self.text[:point]))  # type: ignore[misc]
            except Exception:
                log.exception("the safety cost check failed; it is off for the rest of this answer")
                self.risk = None
                return safe
            self.risk_checks += 1
            self._chunks_since_risk = 0
            if p >= self.threshold:
                self.violation = Violation(f"cost head p={p:.2f}", "cost")
                return self.released
            self._risk_checked = point
        return min(safe, self._risk_checked)


def check_text(rules: Sequence[Rule], text: str, risk: RiskFn | None = None, threshold: float = 0.9,
               history: Sequence[dict[str, str]] = ()) -> Violation | None:
    """The violation in a whole answer, or None (rules, then the cost check once on the whole text)."""
    checker = StreamChecker(rules, risk, threshold, history, risk_every=1 << 30)
    checker.text = text
    checker.finish()
    return checker.violation
