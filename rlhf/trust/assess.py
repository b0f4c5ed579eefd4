"""assess_raters: each rater's weight in a training cycle."""
from __future__ import annotations

from typing import Mapping

import numpy as np
from scipy import sparse, stats

from rlhf.data.datasets import DatasetBundle
from rlhf.settings import TrustSettings
from rlhf.trust.agreement import _agreement, _dispersion, _pooled, _Tally
from rlhf.trust.camps import _camp_agreement
from rlhf.trust.crowd import _is_new, RaterInfo
from rlhf.trust.guard import _head_to_head
from rlhf.trust.judgement import _State
from rlhf.trust.proxy_model import _items, _Items, _logit
from rlhf.trust.rater_weights import water_fill
from rlhf.trust.report import RaterReport, TrustResult
from rlhf.trust.row_weights import apply_trust
from rlhf.trust.vocabulary import RULES, TRUST_LEVELS


def assess_raters(bundle: DatasetBundle, raters: Mapping[int, RaterInfo] | None,
                  settings: TrustSettings = TrustSettings()) -> TrustResult:
    """Each rater's weight in ``bundle`` (see the module's docstring for the rules)."""
    raters = dict(raters or {})
    for info in raters.values():
        if info.trust not in TRUST_LEVELS:
            raise ValueError(f"rater {info.rater}: trust {info.trust!r} must be one of {', '.join(TRUST_LEVELS)}")
    items = _items(bundle) if any(bundle.pairs[s] or bundle.kto[s] for s in ("train", "eval")) else \
        _Items(raters=[], rows=sparse.csr_matrix((0, 1)), label=np.zeros(0), bias=-1, is_kto=np.zeros(0))
    mass: dict[int, float] = {}  # a row's signal is split among its raters
    events: dict[int, int] = {}
    for rs in items.raters:
        for r in rs:
            mass[r] = mass.get(r, 0.0) + 1.0 / len(rs)
            events[r] = events.get(r, 0) + 1
    total = sum(mass.values())
    notes: list[str] = []
    admin = {r: (raters[r].trust if r in raters else "auto") for r in mass}
    counted = [m for r, m in mass.items() if admin[r] != "quarantined"]
    median = float(np.median(counted)) if counted else 0.0
    volume_cap = {r: 1.0 if median <= 0 else min(1.0, settings.max_multiple_of_median * median / m)
                  for r, m in mass.items()}
    new = {r: _is_new(raters.get(r), settings) for r in mass}
    factor_new = {r: settings.new_weight if new[r] else 1.0 for r in mass}
    auto = [r for r in mass if admin[r] == "auto"]

    def weights(state: _State | None, soft: bool = False) -> dict[int, float]:
        out = {}
        for r in mass:
            if admin[r] == "quarantined" or (state is not None and r in state.quarantined):
                out[r] = 0.0
            elif admin[r] == "trusted":
                out[r] = volume_cap[r]
            elif state is None:
                out[r] = volume_cap[r] * factor_new[r]
            else:
                out[r] = volume_cap[r] * (state.soft if soft else state.reliability)[r] * \
                    (1.0 if r in state.graduated else factor_new[r])
        return out

    def votes(state: _State) -> tuple[dict[int, float], np.ndarray]:
        """One rater, one vote (up to the median volume) times its current weight; per item the
        mean of its raters' votes (a row without raters: 1)."""
        current = weights(state, soft=True)
        vote = {r: current[r] * (1.0 if median <= 0 else min(1.0, median / mass[r])) for r in mass}
        return vote, np.array([np.mean([vote[r] for r in rs]) if rs else 1.0 for rs in items.raters])

    def decide(state: _State, tally: _Tally, vote: Mapping[int, float]) -> None:
        correct, checked = tally.plain()
        pooled, _ = _pooled(correct, checked, vote)
        if pooled is None:
            return
        state.pooled = pooled
        # at or below chance the reference sits just above it: raters on the majority's side keep
        # their weight and the others lose it, so the next fit sides with one camp (which camp is
        # kept is decided by people, below)
        ref = max(pooled, 0.5 + 1e-3)
        state.quarantined, state.graduated, state.raw = {}, {}, {}
        for r in mass:
            n, c = checked[r], correct[r]
            state.checked[r] = n
            shrunk = (c + settings.prior_strength * ref) / (n + settings.prior_strength) \
                if n + settings.prior_strength > 0 else ref
            state.agreement[r] = shrunk if n else None
            if n:
                state.raw[r] = c / n
            if admin[r] != "auto":
                continue
            state.soft[r] = min(1.0, max(0.0, _logit(shrunk) / _logit(ref)))
            # benefit of the doubt: the factor applies only when the rater's own items show, at
            # the trust decisions' level, that it agrees less than the crowd (honest raters'
            # sampling noise then costs them nothing)
            below = n > 0 and float(stats.binom.cdf(c, n, ref)) < settings.quarantine_p
            state.reliability[r] = state.soft[r] if below else 1.0
            if n >= settings.min_checked:
                low = float(stats.binom.cdf(c, n, 0.5))
                if low < settings.quarantine_p:
                    state.quarantined[r] = low
                high = float(stats.binom.sf(c - 1, n, 0.5))
                if new[r] and high < settings.quarantine_p:
                    state.graduated[r] = high

    single = np.array([len(rs) == 1 for rs in items.raters])
    everything = np.ones(len(items.raters), bool)

    def run(start: Mapping[int, float], label: str) -> _State:
        """Weights -> leave-raters-out fits -> agreement -> weights, ``iterations`` times."""
        state = _State(soft=dict(start), reliability=dict(start))
        for it in range(settings.iterations):
            vote, fit_weight = votes(state)
            if not fit_weight.any():
                break
            tally = _agreement(items, fit_weight, settings.folds, everything, single)
            if it == 0:
                state.first = _pooled(*tally.balanced(), vote)
                state.dispersion_p = _dispersion(*tally.balanced())
            decide(state, tally, vote)
            state.notes.append(
                f"{label} iteration {it + 1}: agreement {state.pooled if state.pooled is not None else 0:.3f} on "
                f"{sum(state.checked.values())} rater-items; {len(state.quarantined)} below chance, "
                f"{sum(1 for r in auto if state.soft[r] < 0.5)} below half weight")
        state.valid = state.pooled is not None and state.pooled > 0.5
        return state

    applied = {"caps": True, "new": any(new.values()), "reliability": False, "quarantine": False}
    chosen: _State | None = None
    if settings.iterations == 0:
        notes.append("reliability off (iterations = 0): only the caps and the new-identity rule act")
    elif sum(1 for r in mass if admin[r] != "quarantined") < 2:
        notes.append("reliability not measured: fewer than 2 raters")
    else:
        first = run({r: 1.0 for r in mass}, "from everyone:")
        runs = [first]
        # Raters who contradict each other form camps, and Dawid-Skene has a fixed point per camp:
        # volume decides which one a run from everyone finds. So a second run starts from the
        # raters the first distrusted, and the fixed point more people agree with is kept.
        flipped = {r: (1.0 if r in first.quarantined else 1.0 - first.soft[r]) if admin[r] == "auto" else 1.0
                   for r in mass}
        if any(flipped[r] > 0.5 for r in auto):
            runs.append(run(flipped, "from the distrusted:"))
        # Both can miss the honest camp when it is content and light (three thumbs up each) and a
        # minority is dissatisfied and busy: the plain fits then sit near chance. A two-camp
        # mixture, cross-fitted over raters, finds the camps anyway (each has its own share of
        # thumbs up); its majority model's agreement with each rater, measured without that
        # rater, is a third candidate. It is not iterated: reweighting by agreement measured on
        # the same items drifted back toward the busy minority (measured: 29 -> 4 of 41 contrary
        # raters below chance in three rounds).
        counts = {r: 0.0 if admin[r] == "quarantined" else factor_new[r] for r in mass}
        # one rater, one vote, and nothing else: with the volume cap on top (as in the runs'
        # fits) a busy camp's own model was too thin to form, and the split came out muddled
        vote0 = {r: 0.0 if admin[r] == "quarantined" else 1.0 if median <= 0 else min(1.0, median / mass[r])
                 for r in mass}
        camp_tally, member = _camp_agreement(items, vote0, counts, settings.folds)
        camp = _pooled(*camp_tally.balanced(), vote0)
        camp_dispersion = _dispersion(*camp_tally.balanced())
        notes.append(f"camps: the majority camp's model (fitted without each fold) agrees with the raters' own items "
                     f"{camp[0] if camp[0] is not None else 0:.3f} (balanced, by people), spread beyond chance "
                     f"p = {camp_dispersion:.2g}; {sum(1 for r in auto if member.get(r, 1.0) < 0.5)} raters placed "
                     f"in the minority")
        start = {r: member.get(r, 1.0) if admin[r] == "auto" else 1.0 for r in mass}
        by_camp = _State(soft=dict(start), reliability=dict(start))
        # the crowd it compares a rater with is the majority camp (everyone would include the minority)
        decide(by_camp, camp_tally, {r: v * member.get(r, 1.0) for r, v in vote0.items()})
        by_camp.valid = by_camp.pooled is not None and (
            min(camp_dispersion, camp[1] if camp[0] is not None and camp[0] > 0.5 else 1.0) < settings.quarantine_p)
        by_camp.notes.append(f"from the majority camp: agreement {by_camp.pooled or 0:.3f} on "
                             f"{sum(by_camp.checked.values())} rater-items; {len(by_camp.quarantined)} below chance, "
                             f"{sum(1 for r in auto if by_camp.soft[r] < 0.5)} below half weight")
        runs.append(by_camp)
        for st in runs:
            notes += st.notes
        valid = [st for st in runs if st.valid]
        chosen = None
        if by_camp.valid:
            # selection-free (no rater's items choose the model it is judged by), so it is not
            # put head to head with the Dawid-Skene runs, whose agreement is inflated by
            # reweighting on the same items
            chosen = by_camp
        else:
            for st in valid:
                chosen = st if chosen is None else _head_to_head(chosen, st, counts)
        # The guard. Later fits are weighted by agreement measured on the same items, so even a
        # preference the features cannot express ends up looking learnable (measured on coin-flip
        # judgements: pooled agreement 0.55 -> 0.65 in three rounds). So it asks two questions
        # that selection cannot fake: does the first, unweighted fit agree with held-out raters
        # above chance; or, when camps cancel out in that fit, does some rater disagree with the
        # kept fixed point beyond chance even after a Bonferroni correction over all raters.
        balanced, balanced_p = first.first
        camps = chosen is not None and any(p * len(mass) < settings.quarantine_p for p in chosen.quarantined.values())
        dispersed = min(first.dispersion_p, camp_dispersion) < settings.quarantine_p
        majority = camp[0] is not None and camp[0] > 0.5 and camp[1] < settings.quarantine_p
        if not ((balanced is not None and balanced > 0.5 and balanced_p < settings.quarantine_p) or camps
                or dispersed or majority):
            shown = "none" if balanced is None else f"{balanced:.3f} (p = {balanced_p:.2g})"
            notes.append(f"reliability not applied: the leave-raters-out agreement is not significantly above "
                         f"chance (balanced {shown}), raters do not spread beyond chance around it (p = "
                         f"{min(first.dispersion_p, camp_dispersion):.2g}), the majority camp's model does not predict "
                         f"held-out raters either, and no rater disagrees beyond chance: the features cannot "
                         f"express what raters prefer, so agreement says nothing about a rater")
            chosen = None
        elif chosen is not None:
            applied["reliability"] = applied["quarantine"] = True
            if chosen is by_camp:
                notes.append("kept the majority camp's agreement: the camps are significant, and it is measured "
                             "without selection")
            else:
                notes.append(f"kept the run {chosen.notes[0].split(':')[0] if chosen.notes else ''}"
                             + (f": head to head, more raters side with it ({chosen.support:g}, new identities "
                                f"counting {settings.new_weight:g})" if len(valid) > 1 else ": the only valid run"))
    quarantined = chosen.quarantined if chosen else {}
    graduated = chosen.graduated if chosen else {}
    reliability = {r: chosen.reliability.get(r, 1.0) for r in mass} if chosen else {r: 1.0 for r in mass}
    agreement = {r: chosen.agreement.get(r) for r in mass} if chosen else {r: None for r in mass}
    checked = {r: chosen.checked.get(r, 0) for r in mass} if chosen else {r: 0 for r in mass}
    pooled_out = chosen.pooled if chosen else None

    base = weights(chosen)
    fill = water_fill({r: mass[r] * base[r] for r in mass}, settings.max_share)
    final = {r: base[r] * fill[r] for r in mass}
    cap = {r: volume_cap[r] * fill[r] for r in mass}
    kept = sum(mass[r] * final[r] for r in mass)

    reports: dict[int, RaterReport] = {}
    rules = {name: {"raters": 0, "rows": 0, "weight_removed": 0.0} for name in RULES}

    def rule(name: str, r: int, removed: float) -> None:
        rules[name]["raters"] += 1
        rules[name]["rows"] += events[r]
        rules[name]["weight_removed"] += removed

    for r in sorted(mass):
        reasons: list[str] = []
        m = mass[r]
        if admin[r] == "quarantined" or r in quarantined:
            status = "quarantined"
            reasons.append("quarantined by an admin" if admin[r] == "quarantined"
                           else f"quarantined: disagrees, p={quarantined[r]:.2g}")
            rule("quarantined", r, m)
        else:
            status = "trusted" if admin[r] == "trusted" else "normal"
            if admin[r] == "trusted":
                reasons.append("trusted by an admin")
            left = m
            if cap[r] < 1 - 1e-9:
                reasons.append("capped")
                rule("capped", r, left * (1 - cap[r]))
                left *= cap[r]
            if admin[r] == "auto" and reliability[r] < 1 - 1e-9:
                reasons.append(f"down-weighted: agreement {agreement[r] if agreement[r] is not None else 0:.2f}")
                rule("down_weighted", r, left * (1 - reliability[r]))
                left *= reliability[r]
            if new[r] and r in graduated:
                reasons.append(f"graduated: agrees, p={graduated[r]:.2g}")
            elif new[r]:
                status = "new"
                reasons.append("new identity")
                rule("new", r, left * (1 - settings.new_weight))
        reports[r] = RaterReport(
            rater=r, events=events[r], raw_share=round(m / total, 6) if total else 0.0,
            share=round(m * final[r] / kept, 6) if kept > 0 else 0.0,
            agreement=None if agreement[r] is None else round(float(agreement[r]), 4), checked=int(checked[r]),
            weight=round(final[r], 6), status=status, reasons=tuple(reasons))
    for name in RULES:
        rules[name]["weight_removed"] = round(rules[name]["weight_removed"], 4)
        rules[name]["share_removed"] = round(rules[name]["weight_removed"] / total, 4) if total else 0.0
    if any(fill[r] < 1 - 1e-9 for r in mass):
        live = sum(1 for r in mass if base[r] > 0)
        notes.append(f"share cap: no rater above {settings.max_share:g} of the signal" if
                     live * settings.max_share >= 1 - 1e-9 else
                     f"share cap: {live} raters are fewer than 1/max_share = {1 / settings.max_share:g}: every "
                     f"rater counts the same")
    return TrustResult(raters=reports, rules=rules, applied=applied, notes=notes,
                       pooled_agreement=None if pooled_out is None else round(float(pooled_out), 4),
                       weight_kept=round(kept / total, 4) if total else 1.0)


def trusted_bundle(bundle: DatasetBundle, raters: Mapping[int, RaterInfo] | None,
                   settings: TrustSettings) -> DatasetBundle:
    """``bundle`` weighed by its raters when ``settings.enabled`` (else unchanged)."""
    if not settings.enabled:
        return bundle
    return apply_trust(bundle, assess_raters(bundle, raters, settings))
