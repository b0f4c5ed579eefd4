"""The gate's verdict on its held-out evidence (rlhf.gate.verdict): the held-out pairs count only
above a minimum effect, so does the judge's gain, a trusted judge that finds no gain cannot be
outvoted by the pairs, and the words say which evidence carried the verdict. Pure functions of the
evidence: no model."""
from __future__ import annotations

import random

import pytest
from scipy.stats import t as student_t

from rlhf.gate.instruments import heldout_summary, judge_trust, margin_effect, paired_gain, sign_test
from rlhf.gate.verdict import decided_by, evidence_p, evidence_reasons, judged_by, simes
from rlhf.settings import CycleSettings, GateThresholds

T = GateThresholds()  # alpha 0.05


def noisy(mean: float, sd: float, n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(mean, sd) for _ in range(n)]


def trusted_judge(p_value: float, gain: float, p_worse: float = 0.9) -> dict:
    """A trusted judge's numbers; ``p_value`` both for a gain above the minimum and for any gain."""
    return {"trained_on_pairs": 40, "accuracy": 0.9, "accuracy_pairs": 60, **judge_trust(0.9, 60, T.alpha),
            "gain": gain, "prompts": 18, "min_gain": T.min_reward_gain, "p_value": p_value, "p_any_gain": p_value,
            "p_worse": p_worse}


def test_the_effect_is_the_mean_margin_with_its_one_sided_t_bound():
    margins = [0.2, 1.4, 0.9, 2.2, -0.3, 1.1, 0.7, 1.6, 0.4, 1.0]
    n = len(margins)
    mean = sum(margins) / n
    sd = (sum((m - mean) ** 2 for m in margins) / (n - 1)) ** 0.5
    low = mean - student_t.ppf(0.95, n - 1) * sd / n ** 0.5  # the textbook bound
    out = margin_effect(margins, 0.5, 0.05)
    assert out["margin_low"] == pytest.approx(low, abs=1e-4) and out["min_margin"] == 0.5
    assert (out["effect_p"] < 0.05) == (low > 0.5)
    assert margin_effect([0.0] * 12, 0.5, 0.05) == {"min_margin": 0.5, "margin_low": 0.0, "effect_p": 1.0}  # a copy
    assert margin_effect([3.0], 0.5, 0.05)["effect_p"] == 1.0  # one pair bounds nothing
    summary = heldout_summary(margins, 0.5, 0.05)
    assert summary["wins"] == 9 and summary["mean_margin"] == pytest.approx(mean, abs=1e-4)


def test_many_pairs_with_tiny_margins_the_right_way_do_not_pass():
    """49 of 55 pairs the right way with a mean margin of 0.18 nats: the sign test's p is 2e-10 (the
    rule before the effect size passed it; benchmarks/RESULTS.md, "Small deployments"), but a
    shift that small is no improvement."""
    margins = [abs(x) for x in noisy(0.18, 0.08, 49, seed=1)] + [-0.05] * 6
    h = heldout_summary(margins, T.min_margin, T.alpha)
    assert (h["wins"], h["pairs"]) == (49, 55) and h["p_value"] < 1e-9 and h["mean_margin"] < 0.25
    assert simes([h["p_value"]]) < T.alpha  # what the sign test alone would have said
    [reason] = evidence_reasons(h, None, T)
    assert reason.startswith("no held-out evidence of an improvement of the size the gate needs")
    assert f"the gate needs more than {T.min_margin:g}" in reason
    # the same pairs, each moved by a real improvement's size, pass on the pairs alone
    assert evidence_reasons(heldout_summary([m + 2.0 for m in margins], T.min_margin, T.alpha), None, T) == []


def test_a_trusted_judge_that_finds_no_gain_cannot_be_outvoted_by_the_pairs():
    """Held-out pairs 18 of 21 with a clear effect and a trusted judge at p = 0.70: flat."""
    h = heldout_summary(noisy(1.6, 0.9, 21, seed=2), T.min_margin, T.alpha)
    assert h["effect_p"] < 0.01  # the pairs alone would pass: Simes of 0.006 and 0.70 is 0.012
    flat = trusted_judge(0.70, 0.038, p_worse=0.3)
    assert evidence_p(h, flat) < T.alpha
    [reason] = evidence_reasons(h, flat, T)
    assert reason.startswith("the judge finds no gain (judge gain 0.038 over 18 prompts, p above 0.2 = 0.7; p of any "
                             "gain = 0.7, not below 0.5)")
    assert "the held-out pairs alone cannot pass a candidate a trusted judge calls flat" in reason
    # a judge that agrees, or one that does not count, leaves the pairs their say
    assert evidence_reasons(h, trusted_judge(0.01, 0.4), T) == []
    untrusted = {**flat, "accuracy": 0.55, "accuracy_pairs": 20, **judge_trust(0.55, 20, T.alpha)}
    assert not untrusted["trusted"] and evidence_reasons(h, untrusted, T) == []
    # the veto is a setting: at 1 the judge never vetoes (the rule before it)
    assert evidence_reasons(h, flat, GateThresholds(judge_flat_p=1.0)) == []


def test_either_instrument_may_carry_and_a_decline_on_either_blocks():
    flat_pairs = heldout_summary(noisy(0.0, 1.0, 30, seed=3), T.min_margin, T.alpha)
    strong_judge = trusted_judge(0.0004, 0.55, p_worse=0.99)
    assert evidence_reasons(flat_pairs, strong_judge, T) == []  # a trusted judge alone (p < alpha / 2)
    worse = heldout_summary([-0.8] * 10 + [0.9], T.min_margin, T.alpha)
    [reason] = evidence_reasons(worse, strong_judge, T)
    assert reason.startswith("held-out preferences say worse: ")  # a judge's gain never outweighs a decline
    good = heldout_summary(noisy(1.5, 1.0, 30, seed=4), T.min_margin, T.alpha)
    [reason] = evidence_reasons(good, trusted_judge(0.2, -0.5, p_worse=0.01), T)
    assert reason.startswith("the judge says worse: ")
    assert evidence_reasons(heldout_summary([2.0] * 5, T.min_margin, T.alpha), None, T)[0].startswith(
        "not enough evidence: 5 held-out preference pairs, the gate needs at least 8")
    gains = paired_gain([0.0] * 34, [1.0 + 0.1 * (i % 3) for i in range(34)], 2, 0.0)
    assert gains["prompts"] == 17 and gains["p_value"] < 0.001
    assert simes([0.0461, 0.0333]) == 0.0461 and simes([0.3]) == 0.3


def test_the_judge_counts_only_above_its_minimum_gain():
    """A judge that prefers the candidate's answers by a hair on every prompt (+0.05 to +0.08 reward, a 51-52 %
    preference) has a tiny p-value for "any gain" (the rule before passed on it alone) but is no
    evidence of an improvement; the same judge at +0.9 carries the verdict. Neither says flat."""
    pairs = heldout_summary(noisy(0.0, 1.0, 30, seed=5), T.min_margin, T.alpha)
    base = {"trained_on_pairs": 40, "accuracy": 0.9, "accuracy_pairs": 60, **judge_trust(0.9, 60, T.alpha)}
    hair = {**base, **paired_gain([0.0] * 18, [0.05 + 0.01 * (i % 4) for i in range(18)], 1, T.min_reward_gain)}
    assert hair["p_any_gain"] < 1e-4 and hair["p_value"] > 0.99 and hair["min_gain"] == T.min_reward_gain
    [reason] = evidence_reasons(pairs, hair, T)
    assert reason.startswith("no held-out evidence of an improvement of the size the gate needs")
    assert "judge gain 0.064 over 18 prompts, p above 0.2 = 1;" in reason
    clear = {**base, **paired_gain([0.0] * 18, [0.9 + 0.01 * (i % 4) for i in range(18)], 1, T.min_reward_gain)}
    assert evidence_reasons(pairs, clear, T) == [] and decided_by(pairs, clear, T)["by"] == ["judge"]


def test_the_words_say_which_evidence_carried_the_verdict_with_the_effect_and_its_bound():
    h = heldout_summary([1.2, 0.9, 1.8, 0.7, 1.1, 1.5, 0.6, 1.3, 1.0, 1.4, 0.8, 1.6], T.min_margin, T.alpha)
    out = decided_by(h, None, T)
    assert out["better"] is True and out["by"] == ["held-out pairs"]
    assert out["words"].startswith("Better, carried by the held-out pairs: on 12 held-out pairs the candidate moved "
                                   f"towards the answer people preferred by {h['mean_margin']:.2f} nats on average "
                                   f"(12 of 12 pairs the right way); with 95% confidence at least "
                                   f"{h['margin_low']:.2f}, above the 0.75 the gate needs")
    both = decided_by(h, trusted_judge(0.003, 0.41), T)
    assert both["by"] == ["held-out pairs", "judge"] and "the judge scored the candidate's own answers +0.410" in \
        both["words"] and "a gain above 0.2 (p = 0.003)" in both["words"]
    tiny = heldout_summary([0.2] * 18 + [-0.1] * 3, T.min_margin, T.alpha)
    out = decided_by(tiny, trusted_judge(0.70, 0.038, p_worse=0.3), T)
    assert out["better"] is False and out["by"] == []
    assert out["words"].startswith("Not shown better: the trusted judge found no gain, and the pairs alone cannot "
                                   "outvote it: on 21 held-out pairs the candidate moved towards the answer people "
                                   "preferred by 0.16 nats on average (18 of 21 pairs the right way)")
    assert "not above the 0.75 the gate needs" in out["words"]
    assert judged_by(h, None, T)[0] == ("held-out preferences: implicit reward margin vs the parent on 12 pairs "
                                        "(mean margin above 0.75 nats with 95% confidence; sign test for a decline)")
    reported = GateThresholds(evidence="reported")
    assert decided_by(h, None, reported)["better"] is None


def test_the_thresholds_are_named_settings_and_checked():
    gate = CycleSettings().gate
    assert (gate.min_margin, gate.judge_flat_p, gate.min_reward_gain) == (0.75, 0.5, 0.2)  # docs/training.md
    with pytest.raises(ValueError, match="min_margin"):
        CycleSettings(gate=GateThresholds(min_margin=-1.0)).validate()
    with pytest.raises(ValueError, match="judge_flat_p"):
        CycleSettings(gate=GateThresholds(judge_flat_p=0.0)).validate()
    assert sign_test([0.5] * 7 + [-0.2] + [0.0] * 3)["p_value"] == pytest.approx(9 / 256, rel=1e-3)
