"""Per-arm A/B metrics of an experiment, with intervals, tests and an SRM check.

Reads the database, computes with :mod:`webapp.experiments.stats` (scipy/statsmodels). The same dict
feeds the dashboard, ``GET /api/admin/metrics`` and ``flask --app webapp ab-report --json``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from flask import current_app
from scipy import stats as scipy_stats

from webapp.core.display import display_path
from webapp.core.extensions import db
from webapp.core.metric_catalog import METRICS
from webapp.core.models import (AnswerScore, Assignment, Comparison, Experiment, Feedback, Message, history,
                                iso, utcnow)
from webapp.experiments import stats as ab_stats

ARMS = ("control", "variant")

# name, label, kind, higher_is_better


def _reward_model_path(exp: Experiment) -> str | None:
    """The reward model of the variant's training run (the one that shaped it), if any."""
    for version in (exp.variant_version, exp.control_version):
        path = (version.metrics or {}).get("reward_model_path")
        if path and Path(path, "config.json").is_file():
            return path
    return None


def _reward_scores(answers: list[Message], rm_path: str | None) -> dict[int, float]:
    """Scores of ``answers`` by the reward model, computed once and cached in answer_scores."""
    if not rm_path or not answers:
        return {}
    ids = [a.id for a in answers]
    cached = {s.message_id: s.score for s in db.session.scalars(
        db.select(AnswerScore).where(AnswerScore.reward_model == rm_path, AnswerScore.message_id.in_(ids)))}
    missing = [a for a in answers if a.id not in cached]
    if missing:
        from rlhf.reward_model import load_reward_model, score_texts

        model, tok = _cached_reward_model(rm_path, load_reward_model)
        texts = [tok.apply_chat_template(history(db.session.get(Message, a.parent_id)), tokenize=False,
                                         add_generation_prompt=True) + " " + a.content + tok.eos_token
                 for a in missing]
        for a, score in zip(missing, score_texts(model, tok, texts)):
            cached[a.id] = score
            db.session.add(AnswerScore(message_id=a.id, reward_model=rm_path, score=score))
        db.session.commit()
    return cached


def _cached_reward_model(path: str, loader):
    cache = current_app.extensions.setdefault("reward_models", {})
    if path not in cache:
        cache[path] = loader(path)
    return cache[path]


def _regenerated(answers: list[Message], paired: set[int]) -> set[int]:
    """Answers the user asked to regenerate: a later sibling exists that is not a compare pair."""
    parents = {a.parent_id for a in answers}
    later: dict[int, list[int]] = defaultdict(list)
    for mid, parent in db.session.execute(db.select(Message.id, Message.parent_id).where(
            Message.parent_id.in_(parents), Message.role == "assistant")):
        if mid not in paired:
            later[parent].append(mid)
    return {a.id for a in answers if a.id not in paired and any(m > a.id for m in later[a.parent_id])}


def _estimate(kind: str, data: Any) -> ab_stats.Estimate:
    if kind == "proportion":
        return ab_stats.wilson(*data)
    return ab_stats.t_mean(data)


def experiment_metrics(exp: Experiment) -> dict[str, Any]:
    cfg = current_app.config
    min_sample = int(cfg["RLHF_AB_MIN_SAMPLE"])
    answers = list(db.session.scalars(db.select(Message).where(Message.experiment_id == exp.id,
                                                               Message.role == "assistant")))
    by_arm = {arm: [a for a in answers if a.arm == arm] for arm in ARMS}
    feedback = {f.message_id: f for f in db.session.scalars(
        db.select(Feedback).where(Feedback.message_id.in_([a.id for a in answers])))} if answers else {}
    pairs = list(db.session.scalars(db.select(Comparison).where(Comparison.message_a_id.in_([a.id for a in answers]))))
    arm_of = {a.id: a.arm for a in answers}
    paired = {p.message_a_id for p in pairs} | {p.message_b_id for p in pairs}
    regenerated = _regenerated(answers, paired)
    scores = _reward_scores(answers, _reward_model_path(exp))

    users = dict(db.session.execute(db.select(Assignment.arm, db.func.count(Assignment.id))
                                    .where(Assignment.experiment_id == exp.id).group_by(Assignment.arm)).all())
    raw: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        mine = by_arm[arm]
        fbs = [feedback[a.id] for a in mine if a.id in feedback]
        thumbs = [f.thumb for f in fbs if f.thumb]
        raw[arm] = {
            "thumbs_up_rate": (sum(t == "up" for t in thumbs), len(thumbs)),
            "mean_rating": [float(f.rating) for f in fbs if f.rating is not None],
            "correction_rate": (sum(1 for f in fbs if f.correction), len(mine)),
            "regenerate_rate": (sum(1 for a in mine if a.id in regenerated), len(mine)),
            "mean_reward": [scores[a.id] for a in mine if a.id in scores],
            "latency_ms": [a.latency_ms for a in mine if a.latency_ms is not None],
        }
    # side-by-side votes between the two arms: decisive votes only
    wins = losses = ties = 0
    for p in pairs:
        arms = (arm_of.get(p.message_a_id), arm_of.get(p.message_b_id))
        if p.winner is None or set(arms) != set(ARMS):
            continue
        if p.winner in ("tie", "both_bad"):
            ties += 1
            continue
        winner_arm = arms[0] if p.winner == "a" else arms[1]
        wins += winner_arm == "variant"
        losses += winner_arm == "control"

    metrics = []
    for name, label, kind, higher in METRICS:
        row: dict[str, Any] = {"name": name, "label": label, "kind": kind, "higher_is_better": higher}
        if kind == "win_rate":
            n = wins + losses
            variant = ab_stats.wilson(wins, n)
            control = ab_stats.wilson(losses, n)
            if n:
                test = scipy_stats.binomtest(wins, n, 0.5)
                chance = float(scipy_stats.beta.sf(0.5, 1 + wins, 1 + losses))
                comparison = ab_stats.Comparison(variant.value - 0.5, variant.low - 0.5, variant.high - 0.5,
                                                 float(test.pvalue), chance)
            else:
                comparison = ab_stats.Comparison(None, None, None, None, None)
            row.update(control=asdict(control), variant=asdict(variant), comparison=asdict(comparison),
                       enough_data=n >= min_sample, votes={"variant_wins": wins, "control_wins": losses, "ties": ties})
        else:
            control = _estimate(kind, raw["control"][name])
            variant = _estimate(kind, raw["variant"][name])
            if kind == "proportion":
                comparison = ab_stats.compare_proportions(raw["control"][name], raw["variant"][name], higher)
            else:
                comparison = ab_stats.compare_means(raw["control"][name], raw["variant"][name], higher)
            row.update(control=asdict(control), variant=asdict(variant), comparison=asdict(comparison),
                       enough_data=ab_stats.enough_data(control.n, variant.n, min_sample))
            if name == "latency_ms":
                for arm in ARMS:
                    row[arm].update(p50=ab_stats.percentile(raw[arm][name], 50),
                                    p95=ab_stats.percentile(raw[arm][name], 95))
        metrics.append(row)

    expected = {"control": 1 - exp.traffic_split, "variant": exp.traffic_split}
    observed = {arm: int(users.get(arm, 0)) for arm in ARMS}
    return {
        "experiment": experiment_dict(exp),
        "min_sample": min_sample,
        "arms": {arm: {"users": observed[arm], "answers": len(by_arm[arm]),
                       "conversations": len({a.conversation_id for a in by_arm[arm]}),
                       "feedback": sum(1 for a in by_arm[arm] if a.id in feedback)} for arm in ARMS},
        "srm": ab_stats.srm_check(observed, expected),
        "metrics": metrics,
        "daily": _daily(by_arm, feedback),
        "timeline": _timeline(exp, by_arm, feedback),
        "reward_model": display_path(_reward_model_path(exp)),
        "generated_at": iso(utcnow()),
    }


def _daily(by_arm: dict[str, list[Message]], feedback: dict[int, Feedback]) -> dict[str, Any]:
    days = sorted({a.created_at.date().isoformat() for arm in ARMS for a in by_arm[arm]})
    series: dict[str, dict[str, list]] = {"answers": {}, "thumbs_up_rate": {}, "mean_rating": {}}
    for arm in ARMS:
        per_day: dict[str, list[Message]] = defaultdict(list)
        for a in by_arm[arm]:
            per_day[a.created_at.date().isoformat()].append(a)
        series["answers"][arm] = [len(per_day[d]) for d in days]
        ups, ratings = [], []
        for d in days:
            fbs = [feedback[a.id] for a in per_day[d] if a.id in feedback]
            thumbs = [f.thumb for f in fbs if f.thumb]
            ups.append(round(sum(t == "up" for t in thumbs) / len(thumbs), 4) if thumbs else None)
            rs = [f.rating for f in fbs if f.rating is not None]
            ratings.append(round(sum(rs) / len(rs), 3) if rs else None)
        series["thumbs_up_rate"][arm] = ups
        series["mean_rating"][arm] = ratings
    return {"dates": days, "series": series}


# Chart buckets by the experiment's duration: (longest duration, bucket size, unit name).
BUCKETS: tuple[tuple[timedelta | None, timedelta, str], ...] = (
    (timedelta(hours=3), timedelta(minutes=10), "10 min"),
    (timedelta(days=3), timedelta(hours=1), "hour"),
    (None, timedelta(days=1), "day"),
)


def bucket_size(duration: timedelta) -> tuple[timedelta, str]:
    """The chart bucket for an experiment that ran for ``duration``: 10 minutes up to 3 hours,
    hours up to 3 days, days beyond."""
    for longest, size, unit in BUCKETS:
        if longest is None or duration <= longest:
            return size, unit
    raise AssertionError("unreachable")


def _floor(dt: datetime, size: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1)
    return epoch + size * ((dt - epoch) // size)


def _timeline(exp: Experiment, by_arm: dict[str, list[Message]], feedback: dict[int, Feedback],
              now: datetime | None = None) -> dict[str, Any]:
    """Per-arm series over the experiment's life in buckets sized by its duration (see
    :func:`bucket_size`): answers per bucket, and the thumbs-up rate and mean rating
    cumulative up to the end of each bucket (None until the arm has any). ``starts``: each
    bucket's start (ISO, UTC). An experiment of a few hours gets several points, not one."""
    answers = [a for arm in ARMS for a in by_arm[arm]]
    series: dict[str, dict[str, list]] = {"answers": {}, "thumbs_up_rate": {}, "mean_rating": {}}
    if not answers:
        return {"unit": None, "bucket_seconds": None, "starts": [],
                "series": {name: {arm: [] for arm in ARMS} for name in series}}
    first = min(a.created_at for a in answers)
    last = max(a.created_at for a in answers)
    start = min(first, exp.started_at) if exp.started_at else first
    end = exp.ended_at or (max(last, now or utcnow()) if exp.status == "running" else last)
    end = max(end, last)
    size, unit = bucket_size(end - start)
    origin = _floor(start, size)
    n = (end - origin) // size + 1
    starts = [origin + size * i for i in range(n)]
    for arm in ARMS:
        per_bucket: list[list[Message]] = [[] for _ in range(n)]
        for a in by_arm[arm]:
            per_bucket[(a.created_at - origin) // size].append(a)
        series["answers"][arm] = [len(b) for b in per_bucket]
        ups = thumbs = rating_sum = ratings = 0
        rates, means = [], []
        for bucket in per_bucket:
            for a in bucket:
                f = feedback.get(a.id)
                if f is None:
                    continue
                if f.thumb:
                    thumbs += 1
                    ups += f.thumb == "up"
                if f.rating is not None:
                    ratings += 1
                    rating_sum += f.rating
            rates.append(round(ups / thumbs, 4) if thumbs else None)
            means.append(round(rating_sum / ratings, 3) if ratings else None)
        series["thumbs_up_rate"][arm] = rates
        series["mean_rating"][arm] = means
    return {"unit": unit, "bucket_seconds": int(size.total_seconds()), "starts": [iso(s) for s in starts],
            "series": series}


def experiment_dict(exp: Experiment) -> dict[str, Any]:
    return {"key": exp.key, "status": exp.status, "traffic_split": exp.traffic_split,
            "control": exp.control_version.name, "variant": exp.variant_version.name,
            "control_version_id": exp.control_version_id, "variant_version_id": exp.variant_version_id,
            "created_at": iso(exp.created_at), "started_at": iso(exp.started_at), "ended_at": iso(exp.ended_at),
            "decision": exp.decision, "decision_detail": exp.decision_detail or {}}


def default_experiment() -> Experiment | None:
    """The running experiment, else the most recent one."""
    return db.session.scalars(db.select(Experiment).order_by((Experiment.status == "running").desc(),
                                                            Experiment.id.desc())).first()
