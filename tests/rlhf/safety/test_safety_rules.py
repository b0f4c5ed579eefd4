"""The output rail's pure logic (rlhf.safety): rules, presets, Luhn/IBAN, the incremental checker
and the refuse/regenerate guard."""
from __future__ import annotations

import pytest

from rlhf.generation.pool import GenerationResult
from rlhf.safety import (
    PRESETS,
    Rail,
    RailedStream,
    RailPolicy,
    StreamChecker,
    build_rule,
    build_rules,
    check_text,
    iban_ok,
    luhn_ok,
    railed_result,
    validate_pattern,
    validate_phrase,
)

ALL_PRESETS = build_rules([("preset", name) for name in PRESETS])


def stream(chunks, rules, **kw):
    """(released pieces, violation) of ``chunks`` fed one by one and finished."""
    checker = StreamChecker(rules, **kw)
    pieces = [checker.feed(c) for c in chunks] + [checker.finish()]
    return pieces, checker.violation, checker


def every_split(text: str):
    """Every way of cutting ``text`` into two chunks, and into single characters."""
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)


# ---------------------------------------------------------------------------- rules

@pytest.mark.parametrize("text,blocked", [
    ("You should kill yourself now.", True),
    ("YOU SHOULD KILL   YOURSELF", True),
    ("kill yourself", True),
    ("The skill yourselves need", False),  # word boundaries: not inside other words
    ("killer yourself", False),
    ("They kill yourselfie", False),
])
def test_phrases_are_case_insensitive_and_word_bounded(text, blocked):
    rules = build_rules([("phrase", "kill yourself")])
    assert (check_text(rules, text) is not None) is blocked


def test_a_phrase_of_symbols_matches_anywhere():
    rules = build_rules([("phrase", "$$$")])
    assert check_text(rules, "costs a$$$b") is not None


@pytest.mark.parametrize("number,ok", [("4111111111111111", True), ("4111111111111112", False),
                                       ("79927398713", True), ("79927398710", False), ("0", True)])
def test_luhn(number, ok):
    assert luhn_ok(number) is ok


@pytest.mark.parametrize("iban,ok", [("GB82 WEST 1234 5698 7654 32", True), ("DE89370400440532013000", True),
                                     ("GB82 WEST 1234 5698 7654 33", False), ("GB82", False)])
def test_iban_check_digits(iban, ok):
    assert iban_ok(iban) is ok


@pytest.mark.parametrize("text,preset", [
    ("write to jane.doe+news@mail.example.co.uk today", "email"),
    ("call +44 20 7946 0958 please", "phone"),
    ("call (555) 123-4567", "phone"),
    ("card 4111 1111 1111 1111 exp", "card"),
    ("card 4111-1111-1111-1111", "card"),
    ("ssn 123-45-6789.", "ssn"),
    ("iban GB82 WEST 1234 5698 7654 32", "iban"),
    ("iban DE89370400440532013000", "iban"),
])
def test_presets_find_personal_data(text, preset):
    violation = check_text(ALL_PRESETS, text)
    assert violation is not None and violation.reason == f"preset: {PRESETS[preset].label}"


@pytest.mark.parametrize("text", [
    "In 2024 there were 12 months and 365 days.",
    "Version 1.12.0 costs 1,299.99 at 12:30 on 2024-01-15.",
    "Order 4111111111111112 shipped",  # 16 digits failing the Luhn check
    "The SSN 000-12-3456 is invalid, 666-12-3456 too",
    "GB82 WEST 1234 5698 7654 33 has wrong check digits",
    "email me at the usual place",
])
def test_presets_leave_ordinary_text_alone(text):
    assert check_text(ALL_PRESETS, text) is None


@pytest.mark.parametrize("pattern,needle", [
    ("", "empty"), ("   ", "empty"), ("[", "valid regular expression"), ("(?P<x", "valid regular expression"),
    ("a*", "empty string"), ("(?=x)", "empty string"), ("x" * 201, "at most 200"),
    ("(a|a){1,100}b", "too slow"), ("(x+x+)+y", "too slow"),
])
def test_bad_patterns_are_refused_with_a_reason(pattern, needle):
    problem = validate_pattern(pattern)
    assert problem is not None and needle in problem
    with pytest.raises(ValueError):
        build_rule("pattern", pattern)


def test_good_patterns_and_phrases_are_accepted():
    assert validate_pattern(r"secret\s+code\d{2,4}") is None
    assert validate_phrase("  ") is not None and validate_phrase("x" * 201) is not None
    assert validate_phrase("bad word") is None
    assert [r.kind for r in build_rules([("pattern", "["), ("phrase", "ok"), ("preset", "nope")])] == ["phrase"]


def test_a_pattern_that_times_out_at_answer_time_blocks(monkeypatch):
    """Fail closed: a rule whose search exceeds its time limit counts as a violation."""
    import rlhf.safety.rules as rules_mod

    monkeypatch.setattr(rules_mod, "SEARCH_TIMEOUT_S", 1e-9)
    rule = build_rule("pattern", r"w\w*\s?z")  # accepted, then too slow for the (tiny) limit
    violation = check_text((rule,), "word " * 200)
    assert violation is not None and violation.kind == "timeout"


# ---------------------------------------------------------------------------- the incremental checker

PHRASE_RULES = build_rules([("phrase", "kill yourself")])


@pytest.mark.parametrize("chunks", list(every_split("Well, you could kill yourself laughing.")))
def test_a_blocked_phrase_split_across_chunks_is_never_released(chunks):
    pieces, violation, checker = stream(chunks, PHRASE_RULES)
    released = "".join(pieces)
    assert violation is not None and violation.matched == "kill yourself"
    assert "kill" not in released and "yourself" not in released and "k" not in released
    assert "Well, you could ".startswith(released)


def test_text_before_a_blocked_phrase_is_released_as_it_arrives():
    checker = StreamChecker(PHRASE_RULES)
    assert checker.feed("Hello there, ") == "Hello there, "
    assert checker.feed("you could ki") == "you could "  # "ki" could start the phrase
    assert checker.feed("ll your") == ""
    assert checker.feed("self") == ""  # complete, but "yourselfie" would not match: held, not yet judged
    assert checker.feed(" now") == "" and checker.violation is not None
    assert checker.finish() == "" and checker.released_text == "Hello there, you could "


def test_a_near_miss_is_released_once_it_cannot_match():
    pieces, violation, _ = stream(["you could ki", "ll your", "selfie now"], PHRASE_RULES)
    assert violation is None and "".join(pieces) == "you could kill yourselfie now"


@pytest.mark.parametrize("chunks", list(every_split("Call me on 555-123-4567 tonight")))
def test_a_phone_number_is_never_partially_released(chunks):
    pieces, violation, _ = stream(chunks, ALL_PRESETS)
    released = "".join(pieces)
    assert violation is not None and violation.matched == "555-123-4567"
    assert not any(c.isdigit() for c in released)
    assert "Call me on ".startswith(released)


@pytest.mark.parametrize("chunks", list(every_split("pay 4111 1111 1111 1111 now")))
def test_a_card_number_is_never_partially_released(chunks):
    pieces, violation, _ = stream(chunks, ALL_PRESETS)
    assert violation is not None and not any(c.isdigit() for c in "".join(pieces))


def test_unfinished_words_are_held_and_everything_is_released_at_the_end():
    checker = StreamChecker(ALL_PRESETS)
    assert checker.feed("The answ") == "The "
    assert checker.feed("er is 42") == "answer is "
    assert checker.finish() == "42" and checker.violation is None
    assert checker.released_text == "The answer is 42"


def test_nothing_is_released_after_a_violation():
    checker = StreamChecker(PHRASE_RULES)
    checker.feed("kill yourself. ")
    assert checker.violation is not None
    assert checker.feed("More harmless text. ") == "" and checker.finish() == ""
    assert checker.released_text == ""


def test_cost_check_runs_per_sentence_before_release():
    seen = []

    def risk(history, text):
        seen.append(text)
        return 0.95 if "awful" in text else 0.1

    checker = StreamChecker((), risk=risk, threshold=0.9, history=[{"role": "user", "content": "hi"}], risk_every=100)
    assert checker.feed("First sentence. Sec") == "First sentence."  # released up to the checked sentence end
    assert checker.feed("ond one is fine") == ""  # no sentence end yet: held for the check
    assert checker.feed(". Then an awful") == " Second one is fine."
    assert checker.finish() == "" and checker.violation is not None
    assert checker.violation.reason == "cost head p=0.95" and checker.violation.kind == "cost"
    assert seen == ["First sentence.", "First sentence. Second one is fine.",
                    "First sentence. Second one is fine. Then an awful"]


def test_cost_check_every_k_chunks_without_a_sentence_end():
    checker = StreamChecker((), risk=lambda h, t: 0.0, threshold=0.5, risk_every=3)
    assert checker.feed("a ") == "" and checker.feed("b ") == ""
    assert checker.feed("c ") == "a b c " and checker.risk_checks == 1


def test_a_failing_cost_check_leaves_the_rules_on():
    def broken(history, text):
        raise RuntimeError("no head")

    pieces, violation, checker = stream(["fine. ", "kill yourself"], PHRASE_RULES, risk=broken, threshold=0.5)
    assert violation is not None and violation.kind == "phrase" and checker.risk is None


# ---------------------------------------------------------------------------- the guard

def result(text: str, tokens: int = 5) -> GenerationResult:
    return GenerationResult(text=text, token_count=tokens, latency_ms=10.0, first_token_ms=1.0, stopped=False,
                            finish_reason="eos")


def test_guard_refuses_a_blocked_answer():
    rail = Rail(PHRASE_RULES, RailPolicy("refuse", refusal="No."))
    outcome = railed_result(rail, [], result("go kill yourself"), lambda: pytest.fail("refuse never regenerates"))
    assert outcome.result.text == "No." and outcome.refused and outcome.result.finish_reason == "rail"
    assert [(b.action, b.text, b.reason) for b in outcome.blocks] == [("refused", "go kill yourself",
                                                                       "phrase: kill yourself")]


def test_guard_regenerates_until_an_answer_is_safe():
    answers = iter(["kill yourself again", "a safe answer"])
    rail = Rail(PHRASE_RULES, RailPolicy("regenerate", attempts=2))
    outcome = railed_result(rail, [], result("kill yourself"), lambda: result(next(answers)))
    assert outcome.result.text == "a safe answer" and not outcome.refused
    assert [(b.action, b.attempt) for b in outcome.blocks] == [("regenerated", 0), ("regenerated", 1)]
    assert outcome.result.token_count == 15 and outcome.result.latency_ms == 30.0  # what all three cost


def test_guard_refuses_after_the_last_attempt():
    rail = Rail(PHRASE_RULES, RailPolicy("regenerate", attempts=2, refusal="No."))
    outcome = railed_result(rail, [], result("kill yourself"), lambda: result("kill yourself"))
    assert outcome.result.text == "No." and [b.action for b in outcome.blocks] == ["regenerated", "regenerated",
                                                                                   "refused"]


class FakeHandle:
    """A stream handle over fixed chunks (the interface of rlhf.generation.StreamHandle)."""

    def __init__(self, chunks):
        self._chunks = list(chunks)
        self.result = None
        self.closed = False
        self.chunks = self._iter()

    def _iter(self):
        said = []
        try:
            for c in self._chunks:
                said.append(c)
                yield c
        finally:
            self.result = result("".join(said).strip(), tokens=len(said))
            self.closed = True


def test_guarded_stream_never_yields_blocked_text_and_replaces_the_bubble():
    handles = [FakeHandle(["Sure. You ", "could ki", "ll your", "self and more ", "text"]),
               FakeHandle(["A ", "safe ", "one."])]
    it = iter(handles)
    guarded = RailedStream(Rail(PHRASE_RULES, RailPolicy("regenerate", attempts=1)), [], lambda: next(it))
    events = list(guarded)
    sent = "".join(d["text"] for kind, d in events if kind == "token")
    assert "kill" not in sent and "yourself" not in sent
    assert events[-4:-3] == [("rail", {"type": "rail", "action": "regenerating", "text": ""})]
    assert guarded.outcome.result.text == "A safe one."
    assert handles[0].closed and guarded.outcome.blocks[0].text.endswith("self and more ")


def test_guarded_stream_keeps_only_what_was_sent_when_stopped():
    handle = FakeHandle(["Hello there ", "you could ki", "ll yourself"])
    guarded = RailedStream(Rail(PHRASE_RULES), [], lambda: handle)
    assert next(iter(guarded)) == ("token", {"text": "Hello there "})
    guarded.close()
    assert guarded.stopped and guarded.outcome.result.text == "Hello there" and guarded.outcome.result.stopped


def test_an_append_only_stream_is_refused_once_text_went_out_and_regenerated_before():
    """can_retract=False (an OpenAI stream cannot take back what it sent): a block after released
    text is refused whatever the policy; a block before any text is regenerated as usual."""
    late = [FakeHandle(["Sure. You ", "could ki", "ll yourself"]), FakeHandle(["A safe one."])]
    it = iter(late)
    guarded = RailedStream(Rail(PHRASE_RULES, RailPolicy("regenerate", attempts=2, refusal="No.")), [],
                            lambda: next(it), can_retract=False)
    events = list(guarded)
    assert events[0] == ("token", {"text": "Sure. You "}) and events[-1][1]["action"] == "refused"
    assert [b.action for b in guarded.outcome.blocks] == ["refused"] and guarded.outcome.refused
    early = [FakeHandle(["kill yourself"]), FakeHandle(["A safe one."])]
    it = iter(early)
    guarded = RailedStream(Rail(PHRASE_RULES, RailPolicy("regenerate", attempts=2)), [], lambda: next(it),
                            can_retract=False)
    events = list(guarded)
    assert ("rail", {"type": "rail", "action": "regenerating", "text": ""}) in events
    assert guarded.outcome.result.text == "A safe one." and not guarded.outcome.refused
