"""Are the A/B verdicts trustworthy? Simulated experiments through the real decision path.

Each simulated experiment is a stream of users (randomized 50/50, as the app does) who rate
answers over time: heterogeneous raters (each user's thumbs-up propensity drawn from a wide
Beta, 1-15 rated answers, a fifth of users rating nothing, some unrated answers, star ratings,
corrections and regenerations after bad answers, side-by-side compare votes by a per-user
preference). The monitor "looks" after every k new ratings; each look builds the per-user rows
and runs exactly what the scheduler's monitor runs on them:
``webapp.experiments.table.metrics_table`` (the pure core of ``experiment_metrics``) and
``webapp.experiments.promotion.decide``, with the hours running proportional to the ratings so
far and the maximum duration reached at the last look (3,000 ratings by default).

Scenarios (true effects measured on 87,000 simulated users): ``aa`` (identical arms),
``ab5``/``ab10`` (+5/+10 points of thumbs-up rate for the variant, its ratings +0.18/+0.36 stars and
compare win rate 55/60% with it), ``guardrail`` (+10 points of thumbs-up rate but ratings 0.41 stars
worse, compare votes even: a loss as detectable as the gain). Reported, with Wilson 95% intervals:
promotions, retirements on a significant result and at the maximum duration, per look frequency;
median users at a decision; and a fixed-horizon test (the table's fixed-horizon intervals, one look
at the maximum size) for comparison. ``--old`` also runs, on the same data, the per-answer policy
the sequential one replaced (answers as independent trials, fixed-horizon p-values at every look),
copied below as the baseline.

    .venv/bin/python benchmarks/ab_validity.py [--quick] [--old] [--sims N] [--json FILE]

One module because the simulation, the decision paths it compares (today's and the copied previous
policy) and the summary are one experiment read top to bottom.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from webapp.experiments import sample_stats  # noqa: E402
from webapp.experiments import sequential_tests as ab_stats  # noqa: E402
from webapp.experiments.promotion import PromotionPolicy, decide  # noqa: E402
from webapp.experiments.table import FIELDS, metrics_table  # noqa: E402

MIN_SAMPLE = 30  # RLHF_AB_MIN_SAMPLE's default: users with data per arm
SCHEDULES = (10, 50, 250)  # look after every k new ratings; plus one look at the end
ACTIONS = ("promote", "retire_significant", "retire_at_max", "undecided")


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    thumbs_effect: float = 0.0  # added to the variant's mean thumbs-up propensity
    compare_effect: float = 0.0  # added to the mean chance that the variant wins a compare vote
    rating_harm: float = 0.0  # stars taken off the variant's ratings (which then ignore its thumbs gain)


SCENARIOS = {s.name: s for s in (
    Scenario("aa", "A/A: identical arms"),
    Scenario("ab5", "A/B: +5 points thumbs-up rate (ratings +0.18 stars, compare win rate 55%)", 0.05, 0.05),
    Scenario("ab10", "A/B: +10 points thumbs-up rate (ratings +0.36 stars, compare win rate 60%)", 0.10, 0.10),
    Scenario("guardrail", "+10 points thumbs-up rate, ratings truly worse (-0.41 stars), votes even", 0.10, 0.0, 0.5),
)}


@dataclass(frozen=True)
class Population:
    mean_p: float = 0.6  # mean thumbs-up propensity
    concentration: float = 2.0  # Beta(mean * c, (1 - mean) * c): wide
    silent: float = 0.2  # share of users who rate nothing
    most_rated: int = 15  # rated answers per rating user: uniform 1..most_rated
    unrated: float = 1.0  # Poisson mean of unrated answers per user
    star_prob: float = 0.6  # share of rated answers that also get stars
    compare_prob: float = 0.1  # share of answers with a side-by-side vote
    tie_prob: float = 0.15
    preference_concentration: float = 4.0  # per-user chance to prefer the variant: Beta around its mean
    gap: float = 3.0  # mean time between a user's answers (users arrive once per time unit)
    max_ratings: int = 3000


# ---------------------------------------------------------------------------- simulation

def simulate(rng: np.random.Generator, sc: Scenario, pop: Population) -> dict[str, Any]:
    """One experiment: per-user arrival times and arm, and its events in time order."""
    users = int(pop.max_ratings / ((1 - pop.silent) * (1 + pop.most_rated) / 2) * 2.2) + 50
    arm = (rng.random(users) < 0.5).astype(np.int8)
    a, b = pop.mean_p * pop.concentration, (1 - pop.mean_p) * pop.concentration
    p = rng.beta(a, b, users)
    p_arm = np.where(arm == 1, p + sc.thumbs_effect * (1 - p) / (1 - pop.mean_p), p)
    rated_n = np.where(rng.random(users) < pop.silent, 0, rng.integers(1, pop.most_rated + 1, users))
    answers_n = rated_n + rng.poisson(pop.unrated, users)
    arrival = np.cumsum(rng.exponential(1.0, users))
    bias = rng.normal(0, 0.5, users)
    q_mean = 0.5 + sc.compare_effect
    q = rng.beta(q_mean * pop.preference_concentration, (1 - q_mean) * pop.preference_concentration, users)

    owner = np.repeat(np.arange(users), answers_n)
    total = owner.size
    first = np.concatenate(([0], np.cumsum(answers_n)[:-1]))
    gaps = rng.exponential(pop.gap, total)
    cum = np.cumsum(gaps)
    t = arrival[owner] + cum - (cum[first[owner]] - gaps[first[owner]])
    # which of a user's answers are rated: a random subset of rated_n of them
    order = np.lexsort((rng.random(total), owner))
    rank = np.empty(total, dtype=np.int64)
    rank[order] = np.arange(total) - first[owner[order]]
    rated = rank < rated_n[owner]
    up = rated & (rng.random(total) < p_arm[owner])
    starred = rated & (rng.random(total) < pop.star_prob)
    satisfaction = np.where(sc.rating_harm > 0, p[owner], p_arm[owner])  # harm: stars ignore the thumbs gain
    stars = np.clip(np.rint(1 + 4 * satisfaction + bias[owner] + rng.normal(0, 0.8, total)
                            - sc.rating_harm * (arm[owner] == 1)), 1, 5)
    stars = np.where(starred, stars, 0.0)
    down = rated & ~up
    corrected = down & (rng.random(total) < 0.3)
    regenerated = (rng.random(total) < 0.03) | (down & (rng.random(total) < 0.25))
    voted = rng.random(total) < pop.compare_prob
    tie = voted & (rng.random(total) < pop.tie_prob)
    decisive = voted & ~tie
    win = decisive & (rng.random(total) < q[owner])

    # one event per answer (its feedback and vote with it), in time order, cut at max_ratings
    order = np.argsort(t, kind="stable")
    ratings_so_far = np.cumsum(rated[order])
    if ratings_so_far[-1] < pop.max_ratings:
        raise RuntimeError("too few users simulated for max_ratings")
    end = int(np.searchsorted(ratings_so_far, pop.max_ratings)) + 1
    order = order[:end]
    deltas = {"answers": np.ones(end), "thumbs": rated[order] * 1.0, "ups": up[order] * 1.0,
              "ratings": starred[order] * 1.0, "rating_sum": stars[order], "rating_sq": stars[order] ** 2,
              "corrections": corrected[order] * 1.0, "regenerations": regenerated[order] * 1.0,
              "wins": win[order] * 1.0, "losses": (decisive & ~win)[order] * 1.0, "ties": tie[order] * 1.0}
    return {"arm": arm, "arrival": arrival, "owner": owner[order], "time": t[order], "rated": rated[order],
            "deltas": deltas}


# ---------------------------------------------------------------------------- the decision path

def sequential_decision(table: dict[str, np.ndarray], policy: PromotionPolicy, hours: float) -> str:
    """What the monitor does at this look: the real metrics table and policy."""
    metrics = metrics_table(table, 0.5, MIN_SAMPLE, policy)
    return _action(decide(metrics, policy, hours))


def fixed_horizon_decision(table: dict[str, np.ndarray], policy: PromotionPolicy, hours: float) -> str:
    """The same policy on the table's fixed-horizon intervals (valid for this one look only)."""
    metrics = metrics_table(table, 0.5, MIN_SAMPLE, policy)
    for row in metrics["metrics"]:
        c = row["comparison"]
        row["sequential"] = {**row["sequential"], "low": c["low"], "high": c["high"], "p_value": c["p_value"]}
    return _action(decide(metrics, policy, hours))


def _action(decision) -> str:
    if decision.action == "retire":
        return "retire_at_max" if decision.reason.startswith(("no significant", "maximum duration")) \
            else "retire_significant"
    return decision.action


# ---------------------------------------------------------------------------- the old policy (per answer)
# Its metrics treated every answer as an independent trial (pooled z-test on thumbs, Welch t on
# star values, binomial test on votes; "enough data" = 30 answers per arm) and its policy acted on
# those fixed-horizon p-values at every look. Only what its decide() read is computed.

def old_rows(cum: dict[str, np.ndarray], arm: np.ndarray) -> list[dict[str, Any]]:
    v, c = arm == 1, arm == 0
    rows = []
    ups, thumbs = (cum["ups"][c].sum(), cum["thumbs"][c].sum()), (cum["ups"][v].sum(), cum["thumbs"][v].sum())
    diff = p = None
    if thumbs[0] > 0 and thumbs[1] > 0:
        p = sample_stats._ztest_p((int(ups[0]), int(thumbs[0])), (int(ups[1]), int(thumbs[1])))
        diff = ups[1] / thumbs[1] - ups[0] / thumbs[0]
    rows.append({"name": "thumbs_up_rate", "kind": "proportion", "higher_is_better": True,
                 "enough_data": min(thumbs) >= MIN_SAMPLE, "control": {}, "variant": {},
                 "comparison": {"diff": diff, "p_value": p}})
    n = (cum["ratings"][c].sum(), cum["ratings"][v].sum())
    diff = p = None
    if min(n) >= 2:
        s = (cum["rating_sum"][c].sum(), cum["rating_sum"][v].sum())
        sq = (cum["rating_sq"][c].sum(), cum["rating_sq"][v].sum())
        means = [s[i] / n[i] for i in (0, 1)]
        sds = [math.sqrt(max(0.0, (sq[i] - n[i] * means[i] ** 2) / (n[i] - 1))) for i in (0, 1)]
        diff = means[1] - means[0]
        if sds[0] + sds[1] > 0:
            p = float(scipy_stats.ttest_ind_from_stats(means[1], sds[1], n[1], means[0], sds[0], n[0],
                                                       equal_var=False).pvalue)
        else:
            p = 1.0 if diff == 0 else 0.0
    rows.append({"name": "mean_rating", "kind": "mean", "higher_is_better": True, "enough_data": min(n) >= MIN_SAMPLE,
                 "control": {}, "variant": {}, "comparison": {"diff": diff, "p_value": p}})
    wins, losses = int(cum["wins"].sum()), int(cum["losses"].sum())
    diff = p = None
    if wins + losses:
        p = float(scipy_stats.binomtest(wins, wins + losses, 0.5).pvalue)
        diff = wins / (wins + losses) - 0.5
    rows.append({"name": "compare_win_rate", "kind": "win_rate", "higher_is_better": True,
                 "enough_data": wins + losses >= MIN_SAMPLE, "control": {}, "variant": {},
                 "comparison": {"diff": diff, "p_value": p}})
    return rows


def old_decide(metrics: dict[str, Any], primary: str, alpha: float, max_hours: float, hours_running: float) -> str:
    """The old policy's decide(), returning the action kind."""
    guardrails = ("thumbs_up_rate", "mean_rating", "compare_win_rate")
    rows = {m["name"]: m for m in metrics["metrics"]}
    row = rows[primary]
    c = row["comparison"]
    timed_out = hours_running >= max_hours
    if metrics["srm"]["mismatch"]:
        return "retire_at_max" if timed_out else "wait"

    def better(r):
        d = r["comparison"]["diff"]
        return d > 0 if r["kind"] == "win_rate" else (d > 0) == r["higher_is_better"]

    significant = row["enough_data"] and c.get("p_value") is not None and c["p_value"] < alpha
    if significant and c.get("diff") is not None and c["diff"] != 0:
        worse_guard = [g for g in rows.values() if g["name"] in guardrails and g is not row and g["enough_data"]
                       and (g["comparison"].get("p_value") or 1) < alpha and g["comparison"].get("diff")
                       and not better(g)]
        if better(row) and not worse_guard:
            return "promote"
        return "retire_significant"
    return "retire_at_max" if timed_out else "wait"


def old_decision(cum: dict[str, np.ndarray], arm: np.ndarray, hours: float, max_hours: float) -> str:
    observed = {"control": int((arm == 0).sum()), "variant": int((arm == 1).sum())}
    with np.errstate(invalid="ignore", divide="ignore"):  # statsmodels on a rate of 0 or 1, as before
        rows = old_rows(cum, arm)
    metrics = {"srm": ab_stats.srm_check(observed, {"control": 0.5, "variant": 0.5}), "metrics": rows}
    return old_decide(metrics, "thumbs_up_rate", 0.05, max_hours, hours)


# ---------------------------------------------------------------------------- one experiment, every look

def run_experiment(rng: np.random.Generator, sc: Scenario, pop: Population, policy: PromotionPolicy,
                   with_old: bool) -> dict[str, Any]:
    """First decision (action, users, ratings) per look schedule, new policy and (optionally) old."""
    exp = simulate(rng, sc, pop)
    users = exp["arm"].size
    cum = {f: np.zeros(users) for f in (*FIELDS, "rating_sq")}
    rated_cum = np.cumsum(exp["rated"])
    looks = np.searchsorted(rated_cum, np.arange(10, pop.max_ratings + 1, 10)) + 1  # events up to each look
    step_of = {k: k // 10 for k in SCHEDULES}
    new: dict[str, Any] = {}
    old: dict[str, Any] = {}
    start = 0
    for i, stop in enumerate(looks):
        owner = exp["owner"][start:stop]
        for f, d in exp["deltas"].items():
            np.add.at(cum[f], owner, d[start:stop])
        start = stop
        final = i == len(looks) - 1
        ratings = (i + 1) * 10
        hours = policy.max_hours * ratings / pop.max_ratings
        present = int(np.searchsorted(exp["arrival"], exp["time"][stop - 1], side="right"))
        due = [k for k in SCHEDULES if (i + 1) % step_of[k] == 0 and f"every_{k}" not in new]
        if final:
            due.append("final")
        if due:
            table = {f: cum[f][:present] for f in FIELDS}
            table["arm"] = exp["arm"][:present]
            action = sequential_decision(table, policy, hours)
            for k in due:
                key = k if k == "final" else f"every_{k}"
                if action != "wait" and key not in new:
                    new[key] = (action, present, ratings)
            if final:
                new["fixed_horizon"] = (fixed_horizon_decision(table, policy, hours), present, ratings)
        if with_old:
            due_old = [k for k in SCHEDULES if (i + 1) % step_of[k] == 0 and f"every_{k}" not in old]
            if final:
                due_old.append("final")
            if due_old:
                arm = exp["arm"][:present]
                action = old_decision({f: v[:present] for f, v in cum.items()}, arm, hours, policy.max_hours)
                for k in due_old:
                    key = k if k == "final" else f"every_{k}"
                    if action != "wait" and key not in old:
                        old[key] = (action, present, ratings)
        if all(f"every_{k}" in new for k in SCHEDULES) and (not with_old or all(f"every_{k}" in old
                                                                                for k in SCHEDULES)):
            break  # every schedule decided; the single final look still needs the last look
    if "final" not in new or (with_old and "final" not in old):
        _final_look(exp, cum, start, pop, policy, new, old, with_old)
    return {"new": new, "old": old if with_old else None}


def _final_look(exp, cum, start, pop, policy, new, old, with_old) -> None:
    """Apply the remaining events and take the one look at the maximum size."""
    owner = exp["owner"][start:]
    for f, d in exp["deltas"].items():
        np.add.at(cum[f], owner, d[start:])
    present = int(np.searchsorted(exp["arrival"], exp["time"][-1], side="right"))
    table = {f: cum[f][:present] for f in FIELDS}
    table["arm"] = exp["arm"][:present]
    new["final"] = (sequential_decision(table, policy, policy.max_hours), present, pop.max_ratings)
    new["fixed_horizon"] = (fixed_horizon_decision(table, policy, policy.max_hours), present, pop.max_ratings)
    if with_old:
        old["final"] = (old_decision({f: v[:present] for f, v in cum.items()}, table["arm"], policy.max_hours,
                                     policy.max_hours), present, pop.max_ratings)


# ---------------------------------------------------------------------------- summary

def wilson(k: int, n: int) -> list[float]:
    est = sample_stats.wilson(k, n)
    return [round(est.value, 4), round(est.low, 4), round(est.high, 4)]


def summarize(outcomes: list[dict[str, tuple]]) -> dict[str, Any]:
    keys = [*(f"every_{k}" for k in SCHEDULES), "final", "fixed_horizon"]
    out = {}
    n = len(outcomes)
    for key in keys:
        got = [o.get(key) for o in outcomes]
        counts = {a: sum(1 for g in got if (g[0] if g else "undecided") == a) for a in ACTIONS}
        decided = [g[1] for g in got if g and g[0] in ("promote", "retire_significant")]
        out[key] = {"n": n, **{a: {"count": c, "rate": wilson(c, n)} for a, c in counts.items()},
                    "median_users_to_significant": float(np.median(decided)) if decided else None,
                    "median_users_to_promote": float(np.median([g[1] for g in got if g and g[0] == "promote"]))
                    if counts["promote"] else None,
                    "median_users_at_end": float(np.median([g[1] for g in got if g])) if any(got) else None}
    return out


def run_scenario(sc: Scenario, sims: int, seed: int, pop: Population, policy: PromotionPolicy,
                 with_old: bool) -> dict[str, Any]:
    rng = np.random.default_rng([seed, sorted(SCENARIOS).index(sc.name)])
    t0 = time.perf_counter()
    results = [run_experiment(rng, sc, pop, policy, with_old) for _ in range(sims)]
    out = {"scenario": sc.name, "what": sc.what, "sims": sims, "new": summarize([r["new"] for r in results]),
           "wall_s": round(time.perf_counter() - t0, 1)}
    if with_old:
        out["old"] = summarize([r["old"] for r in results])
    return out


def markdown(result: dict[str, Any]) -> str:
    """The tables for RESULTS.md."""
    def pct(cell):
        v, lo, hi = cell["rate"]
        return f"{100 * v:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"

    lines = ["| scenario | policy | looks | promoted | retired (significant) | retired at max duration | "
             "median users to a verdict |", "|---|---|---|---|---|---|---|"]
    looks = {"every_10": "every 10 ratings", "every_50": "every 50 ratings", "every_250": "every 250 ratings",
             "final": "one, at the end", "fixed_horizon": "one, at the end (fixed-horizon test)"}
    for sc in result["scenarios"]:
        for policy in ("old", "new"):
            if policy not in sc:
                continue
            for key, label in looks.items():
                if key not in sc[policy] or (policy == "old" and key == "fixed_horizon"):
                    continue
                s = sc[policy][key]
                med = s["median_users_to_significant"]
                name = {"old": "before (answers, fixed horizon)", "new": "after (users, sequential)"}[policy]
                if key == "fixed_horizon":
                    name = "users, fixed horizon"
                lines.append(f"| {sc['scenario']} | {name} | {label} | {pct(s['promote'])} | "
                             f"{pct(s['retire_significant'])} | {pct(s['retire_at_max'])} | "
                             f"{'–' if med is None else f'{med:.0f}'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 experiments per scenario (smoke run)")
    ap.add_argument("--sims", type=int, default=None, help="experiments per scenario (default 2000)")
    ap.add_argument("--old", action="store_true", help="also run the previous policy on the same data")
    ap.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--max-ratings", type=int, default=Population.max_ratings)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--tuning", type=float, default=PromotionPolicy.sequential_tuning,
                    help="the sequential tuning parameter (users at which the sequence is tightest)")
    ap.add_argument("--json", type=Path, help="write the result object to this file")
    args = ap.parse_args()
    sims = args.sims or (200 if args.quick else 2000)
    pop = Population(max_ratings=args.max_ratings)
    policy = PromotionPolicy(sequential_tuning=args.tuning)
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    scenarios = []
    for name in args.scenarios:
        res = run_scenario(SCENARIOS[name], sims, args.seed, pop, policy, args.old)
        print(f"{name}: {res['wall_s']} s", file=sys.stderr, flush=True)
        scenarios.append(res)
    result = {"sims": sims, "seed": args.seed, "population": pop.__dict__, "policy": policy.__dict__,
              "min_sample": MIN_SAMPLE, "schedules": list(SCHEDULES), "scenarios": scenarios,
              "wall_s": round(time.perf_counter() - t0, 1),
              "loadavg_before": [round(x, 2) for x in load_before],
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    result["markdown"] = markdown(result)
    print(result["markdown"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
