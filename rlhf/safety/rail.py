"""The rail around generation: whole answers (``railed_result``) and streamed ones (``RailedStream``).

A :class:`Rail` is the rules, the optional cost check and the :class:`RailPolicy` (what to do with a
blocked answer): ``refuse`` replaces it with the refusal text; ``regenerate`` samples a new answer
up to ``attempts`` times and refuses when every one is blocked. Each blocked answer becomes a
:class:`Block` (reason, the text the model wrote, what was done), which the caller stores.

``RailedStream`` yields ``("token", {"text": ...})`` for text the checker released and
``("rail", {"type": "rail", "action": "regenerating" | "refused", "text": ...})`` when a blocked answer's
bubble must be replaced (emptied for the next attempt, or the refusal). The blocked text itself is
never yielded. Without a rail it passes the chunks straight through.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

from rlhf.generation.pool import GenerationResult
from rlhf.safety.checker import RiskFn, StreamChecker, Violation, check_text
from rlhf.safety.rules import Rule

ACTIONS = ("refuse", "regenerate")
DEFAULT_REFUSAL = "Sorry, I can't share that answer."


@dataclass(frozen=True)
class RailPolicy:
    action: str = "refuse"
    attempts: int = 2  # new answers sampled before refusing (action "regenerate")
    refusal: str = DEFAULT_REFUSAL


@dataclass(frozen=True)
class Rail:
    rules: tuple[Rule, ...]
    policy: RailPolicy = field(default_factory=RailPolicy)
    risk: RiskFn | None = None
    threshold: float = 0.9
    risk_every: int = 24  # chunks between cost checks when no sentence ends

    def checker(self, history: Sequence[dict[str, str]]) -> StreamChecker:
        return StreamChecker(self.rules, self.risk, self.threshold, history, self.risk_every)

    def check(self, history: Sequence[dict[str, str]], text: str) -> Violation | None:
        return check_text(self.rules, text, self.risk, self.threshold, history)


@dataclass(frozen=True)
class Block:
    """One intervention: the rule (or cost check) that blocked an answer and what was done."""

    reason: str
    kind: str
    matched: str
    text: str  # what the model had written when it was blocked (admins only)
    action: str  # "regenerated" (another answer was sampled) or "refused"
    attempt: int  # 0: the first answer


@dataclass
class Outcome:
    result: GenerationResult  # its text is what the user saw: the answer, or the refusal
    blocks: list[Block]

    @property
    def refused(self) -> bool:
        return bool(self.blocks) and self.blocks[-1].action == "refused"


def _next_action(rail: Rail, attempt: int) -> str:
    return "regenerated" if rail.policy.action == "regenerate" and attempt < rail.policy.attempts else "refused"


def _refusal(rail: Rail, tokens: int, latency_ms: float, first_token_ms: float | None) -> GenerationResult:
    return GenerationResult(text=rail.policy.refusal, token_count=tokens, latency_ms=latency_ms,
                            first_token_ms=first_token_ms, stopped=False, finish_reason="rail")


def railed_result(rail: Rail | None, history: Sequence[dict[str, str]], first: GenerationResult,
                 again: Callable[[], GenerationResult]) -> Outcome:
    """A whole answer through the rail: ``first`` if it is safe, else (regenerate) the first safe
    one of up to ``attempts`` new answers from ``again``, else the refusal. Token counts and
    latencies of blocked answers are added to the result (what the answer cost)."""
    if rail is None:
        return Outcome(first, [])
    blocks: list[Block] = []
    result, tokens, latency = first, 0, 0.0
    attempt = 0
    while True:
        tokens += result.token_count
        latency += result.latency_ms
        violation = rail.check(history, result.text)
        if violation is None:
            return Outcome(replace(result, token_count=tokens, latency_ms=latency), blocks)
        action = _next_action(rail, attempt)
        blocks.append(Block(violation.reason, violation.kind, violation.matched, result.text, action, attempt))
        if action == "refused":
            return Outcome(_refusal(rail, tokens, latency, None), blocks)
        attempt += 1
        result = again()


class RailedStream:
    """A streamed answer through the rail (see the module doc). ``start()`` begins one answer and
    returns a stream handle (``chunks``, ``result``: rlhf.generation.StreamHandle). After the
    iteration (or ``close``), ``outcome`` holds the result whose text is what the client was sent.
    ``can_retract=False``: the client cannot take back text it was sent (an append-only stream),
    so an answer blocked after some of it was released is refused, never regenerated."""

    def __init__(self, rail: Rail | None, history: Sequence[dict[str, str]], start: Callable[[], Any],
                 can_retract: bool = True) -> None:
        self.rail = rail
        self.can_retract = can_retract
        self.history = list(history)
        self._start = start
        self.outcome: Outcome | None = None
        self.first_release_ms: float | None = None
        self.stopped = False  # closed by the reader before the answer ended
        self._gen = self._events()

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        return self._gen

    def close(self) -> None:
        """Stop the answer (the client went away or pressed stop): ``outcome`` keeps what was sent."""
        self._gen.close()

    def _events(self) -> Iterator[tuple[str, dict]]:
        started = time.perf_counter()
        blocks: list[Block] = []
        tokens = 0
        attempt = 0
        sent = ""
        handle = None

        def ms() -> float:
            return (time.perf_counter() - started) * 1000

        try:
            while True:
                handle = self._start()
                checker = self.rail.checker(self.history) if self.rail is not None else None
                sent = ""
                for chunk in handle.chunks:
                    out = checker.feed(chunk) if checker is not None else chunk
                    if out:
                        sent += out
                        if self.first_release_ms is None:
                            self.first_release_ms = ms()
                        yield "token", {"text": out}
                    if checker is not None and checker.violation is not None:
                        break
                else:
                    out = checker.finish() if checker is not None else ""
                    if out:
                        sent += out
                        if self.first_release_ms is None:
                            self.first_release_ms = ms()
                        yield "token", {"text": out}
                if checker is None or checker.violation is None:
                    result = handle.result
                    self.outcome = Outcome(replace(result, token_count=tokens + result.token_count, latency_ms=ms(),
                                                   first_token_ms=self.first_release_ms), blocks)
                    return
                handle.chunks.close()  # stops the generation; sets the partial result
                tokens += handle.result.token_count if handle.result is not None else 0
                handle = None
                violation = checker.violation
                action = (_next_action(self.rail, attempt)  # type: ignore[arg-type]
                          if self.can_retract or not sent else "refused")
                blocks.append(Block(violation.reason, violation.kind, violation.matched, checker.text, action, attempt))
                sent = ""
                if action == "regenerated":
                    attempt += 1
                    yield "rail", {"type": "rail", "action": "regenerating", "text": ""}
                    continue
                refusal = self.rail.policy.refusal  # type: ignore[union-attr]
                sent = refusal
                yield "rail", {"type": "rail", "action": "refused", "text": refusal}
                self.outcome = Outcome(_refusal(self.rail, tokens, ms(), self.first_release_ms), blocks)  # type: ignore[arg-type]
                return
        except GeneratorExit:  # stopped: keep exactly what the client was sent
            self.stopped = True
            if handle is not None:
                handle.chunks.close()
                result = handle.result
                if result is not None:
                    self.outcome = Outcome(replace(result, text=sent.strip(), token_count=tokens + result.token_count,
                                                   latency_ms=ms(), first_token_ms=self.first_release_ms,
                                                   stopped=True, finish_reason="cancelled"), blocks)
            elif self.outcome is None and sent:  # stopped right after the refusal was sent
                self.outcome = Outcome(_refusal(self.rail, tokens, ms(), self.first_release_ms), blocks)  # type: ignore[arg-type]
            raise
