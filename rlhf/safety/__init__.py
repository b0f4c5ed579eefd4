"""The output rail: safety checks on an answer before it is shown.

- ``rules``: blocked phrases, regular expressions and personal-data presets (e-mail, phone, payment
  card with Luhn, US SSN, IBAN), compiled from plain ``(kind, value)`` specs, with input validation.
- ``checker``: the incremental checker that releases streamed text only once no rule (nor the
  cost check) can still object to it.
- ``guard``: the rail around generation: whole answers and streamed ones, refuse or regenerate.

Pure Python: no Flask, no database (the web layer stores rules and interventions).
"""
from __future__ import annotations

from rlhf.safety.checker import RiskFn, StreamChecker, Violation, check_text
from rlhf.safety.rail import ACTIONS, DEFAULT_REFUSAL, Block, Outcome, Rail, RailedStream, RailPolicy, railed_result
from rlhf.safety.rules import (
                    KINDS,
                    MAX_PATTERN_CHARS,
                    MAX_PHRASE_CHARS,
                    PRESETS,
                    Rule,
                    build_rule,
                    build_rules,
                    iban_ok,
                    luhn_ok,
                    validate_pattern,
                    validate_phrase,
)

__all__ = [
    "ACTIONS", "Block", "DEFAULT_REFUSAL", "RailedStream", "KINDS", "MAX_PATTERN_CHARS", "MAX_PHRASE_CHARS",
    "Outcome", "PRESETS", "RailPolicy", "Rail", "RiskFn", "Rule", "StreamChecker", "Violation", "build_rule",
    "build_rules", "check_text", "railed_result", "iban_ok", "luhn_ok", "validate_pattern", "validate_phrase",
]
