"""The gate's verdict on its held-out evidence, and the words that explain it.

Two instruments, neither optimized against (rlhf.gate.instruments):

* the **held-out pairs** count only above a minimum effect: the mean implicit reward margin's
  one-sided lower confidence bound must exceed ``min_margin`` nats (``effect_p`` below ``alpha``).
  Their sign test (how many pairs went each way) is reported and tests a decline, but no longer
  vouches for an improvement: it counts the direction of every margin however small, and passed
  candidates no better than their parent (benchmarks/gate_false_pass.py);
* a **trusted judge** (a reward model trained on the held-out pairs alone, shown to rank pairs it
  never saw better than a coin) counts only above a minimum effect too: its per-prompt gain must
  exceed ``min_reward_gain`` (signed-rank test).

The candidate's evidence says "better" when the counted instruments' one-sided p-values, combined
by Simes' test, fall below ``alpha``, neither shows a decline at ``alpha``, and a trusted judge does
not say "flat or worse" (its p-value for any gain at least ``judge_flat_p``): the pairs alone cannot
outvote a judge that looked at the candidate's own answers and found nothing. The thresholds were
chosen on flat candidates (benchmarks/gate_false_pass.py, docs/training.md).
"""
from __future__ import annotations

from typing import Any

from rlhf.gate.instruments import four_digits
from rlhf.settings import GateThresholds

PAIRS, JUDGE = "held-out pairs", "judge"


def simes(p_values: list[float]) -> float:
    """Simes' combination of one-sided p-values, ``min_i k * p_(i) / i`` (sorted ascending): below
    ``alpha`` when the smallest is below ``alpha / k``, or the two smallest below ``2 alpha / k``, ...
    A valid test of "no instrument shows an improvement" when the tests are independent or
    positively dependent (Simes 1986; Sarkar 1998)."""
    ordered = sorted(p_values)
    return min(len(ordered) * p / rank for rank, p in enumerate(ordered, start=1))


def counted(judge: dict[str, Any] | None) -> bool:
    """Whether the judge counts: trusted (decided on training pairs, before the candidate)."""
    return bool(judge is not None and judge.get("trusted"))


def _pairs_p(heldout: dict[str, Any]) -> float:
    """The pairs' p-value for an improvement: of their effect (mean margin above the minimum), never
    the sign test's (``rlhf.gate.instruments.heldout_summary`` computes both)."""
    return heldout["effect_p"]


def evidence_p(heldout: dict[str, Any], judge: dict[str, Any] | None) -> float:
    """The combined (Simes) p-value of the instruments that count: the held-out pairs' effect (mean
    margin above the minimum), and the judge's gain above its minimum when the judge is trusted."""
    return four_digits(simes([_pairs_p(heldout)] + ([judge["p_value"]] if counted(judge) else [])))


def judge_says_flat(judge: dict[str, Any] | None, t: GateThresholds) -> bool:
    """A trusted judge whose one-sided p-value for any gain (above 0) is at least ``judge_flat_p``:
    its evidence leans to no gain or a loss."""
    return counted(judge) and judge.get("p_any_gain", judge["p_value"]) >= t.judge_flat_p


def _confidence(t: GateThresholds) -> str:
    return f"{1 - t.alpha:.0%}"


def _heldout_words(h: dict[str, Any]) -> str:
    shown = "no pair separates them" if h["share"] is None else \
        f"share {h['share']:.0%} [{h['ci95'][0]:.0%}, {h['ci95'][1]:.0%}]"
    return (f"held-out preferences: the candidate favours the chosen answer more than the parent on {h['wins']} "
            f"of {h['pairs']} pairs ({h['losses']} less, {h['ties']} tied; {shown}), sign test p = {h['p_value']:.3g}")


def _effect_words(h: dict[str, Any], t: GateThresholds) -> str:
    if h.get("margin_low") is None:
        return "mean margin: too few pairs for a bound"
    return (f"mean margin {h['mean_margin']:.3g} nats, at least {h['margin_low']:.3g} with {_confidence(t)} "
            f"confidence (the gate needs more than {h['min_margin']:g}), p = {h['effect_p']:.3g}")


def _judge_words(j: dict[str, Any] | None) -> str:
    if j is None:
        return "judge: none"
    above = f" above {j['min_gain']:g}" if j.get("min_gain") else ""
    words = f"judge gain {j['gain']:.3f} over {j['prompts']} prompts, p{above} = {j['p_value']:.3g}"
    if not j.get("trusted"):
        accuracy = "unknown" if j.get("accuracy") is None else \
            f"{j['accuracy']:.0%} on {j['accuracy_pairs']} pairs it never saw, p = {j['trust_p']:.3g}"
        words += f", not counted: its accuracy ({accuracy}) is not shown to beat chance"
    return words


def evidence_reasons(heldout: dict[str, Any], judge: dict[str, Any] | None, t: GateThresholds) -> list[str]:
    """Why the held-out evidence does not (yet) vouch for the candidate; empty when it does."""
    n = heldout["pairs"]
    if n < t.min_heldout_pairs:
        return [f"not enough evidence: {n} held-out preference pairs, the gate needs at least "
                f"{t.min_heldout_pairs} (training.gate.min_heldout_pairs)"]
    worse = []
    if heldout["p_worse"] < t.alpha:
        worse.append(f"held-out preferences say worse: {_heldout_words(heldout)}, p(worse) = "
                     f"{heldout['p_worse']:.3g} < {t.alpha}")
    if counted(judge) and judge["p_worse"] < t.alpha:
        worse.append(f"the judge says worse: gain {judge['gain']:.3f}, p(worse) = {judge['p_worse']:.3g} < {t.alpha}")
    if worse:
        return worse
    combined = evidence_p(heldout, judge)
    if judge_says_flat(judge, t):
        return [f"the judge finds no gain ({_judge_words(judge)}; p of any gain = "
                f"{judge.get('p_any_gain', judge['p_value']):.3g}, not below {t.judge_flat_p}): the held-out pairs "
                f"alone cannot pass a candidate a trusted judge calls flat ({_heldout_words(heldout)}; "
                f"{_effect_words(heldout, t)})"]
    if combined < t.alpha:
        return []
    return [f"no held-out evidence of an improvement of the size the gate needs: {_heldout_words(heldout)}; "
            f"{_effect_words(heldout, t)}; {_judge_words(judge)}; combined (Simes) p = {combined:.3g}, not below "
            f"{t.alpha}"]


def judged_by(heldout: dict[str, Any], judge: dict[str, Any] | None, t: GateThresholds) -> list[str]:
    """The evidence the verdict rests on, in words (the run page and ``rl-train --json`` show it)."""
    if t.evidence == "reported":
        return ["KL from the parent and degeneration checks only: the held-out evidence is reported, not "
                "required (training.gate.evidence = reported)"]
    n = heldout["pairs"]
    if n < t.min_heldout_pairs:
        return [f"nothing: {n} held-out preference pairs, fewer than the {t.min_heldout_pairs} the gate needs"]
    out = [f"held-out preferences: implicit reward margin vs the parent on {n} pairs (mean margin above "
           f"{t.min_margin:g} nats with {_confidence(t)} confidence; sign test for a decline)"]
    if judge is not None:
        trained = f" trained on {judge['trained_on_pairs']} held-out pairs" if judge.get("trained_on_pairs") else ""
        out.append(f"judge reward model{trained} (signed-rank test of its gain above {t.min_reward_gain:g} over "
                   f"{judge['prompts']} prompts; when it finds no gain, p >= {t.judge_flat_p:g}, the pairs alone "
                   f"cannot pass)"
                   if judge.get("trusted") else
                   f"judge reward model{trained}: reported, not counted (its accuracy is not shown to beat chance)")
    combined = "both combined by Simes' test" if counted(judge) else "alone"
    return out + [f"{combined} at alpha {t.alpha}; KL from the parent and degeneration checks"]


def _pairs_sentence(h: dict[str, Any], t: GateThresholds) -> str:
    decided = h["wins"] + h["losses"]
    if h.get("margin_low") is None:
        return f"the held-out pairs are too few to bound their effect ({h['pairs']} pairs)"
    above = "above" if h["margin_low"] > h["min_margin"] else "not above"
    return (f"on {h['pairs']} held-out pairs the candidate moved towards the answer people preferred by "
            f"{h['mean_margin']:.2f} nats on average ({h['wins']} of {decided} pairs the right way); with "
            f"{_confidence(t)} confidence at least {h['margin_low']:.2f}, {above} the {h['min_margin']:g} the "
            f"gate needs")


def _judge_sentence(j: dict[str, Any] | None, t: GateThresholds) -> str:
    if j is None:
        return "no judge was trained"
    if not j.get("trusted"):
        return "the judge was not counted (its accuracy on pairs it never saw is not shown to beat chance)"
    found = f"a gain above {t.min_reward_gain:g}" if j["p_value"] < t.alpha else \
        f"no significant gain above {t.min_reward_gain:g}"
    return (f"the judge scored the candidate's own answers {j['gain']:+.3f} against the parent's over "
            f"{j['prompts']} prompts: {found} (p = {j['p_value']:.2g})")


def decided_by(heldout: dict[str, Any], judge: dict[str, Any] | None, t: GateThresholds) -> dict[str, Any]:
    """Which evidence carried the verdict, with the effect and its bound, in words an operator reads
    (the run page shows it): ``by`` is the instruments that showed the improvement (``[]`` when
    the evidence did not), ``better`` whether the evidence says better, ``words`` one sentence."""
    if t.evidence == "reported":
        return {"by": [], "better": None, "words": "The held-out evidence was reported, not required: only the KL "
                                                   "and degeneration checks decided."}
    if heldout["pairs"] < t.min_heldout_pairs:
        return {"by": [], "better": False,
                "words": f"Not judged: {heldout['pairs']} held-out pairs, the gate needs {t.min_heldout_pairs}."}
    reasons = evidence_reasons(heldout, judge, t)
    pairs, judge_ = _pairs_sentence(heldout, t), _judge_sentence(judge, t)
    if reasons:
        if heldout["p_worse"] < t.alpha or (counted(judge) and judge["p_worse"] < t.alpha):
            lead = "Worse"
        elif judge_says_flat(judge, t):
            lead = "Not shown better: the trusted judge found no gain, and the pairs alone cannot outvote it"
        else:
            lead = "Not shown better"
        return {"by": [], "better": False, "words": f"{lead}: {pairs}; {judge_}."}
    by = [name for name, p in ((PAIRS, _pairs_p(heldout)), (JUDGE, judge["p_value"] if counted(judge) else 1.0))
          if p < t.alpha]
    return {"by": by, "better": True, "words": f"Better, carried by the {' and the '.join(by)}: {pairs}; {judge_}."}
