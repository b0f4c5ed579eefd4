"""Per-arm A/B metrics of an experiment: the database read into one row per user, then the
pure metrics table (:func:`webapp.experiments.table.metrics_table`) with intervals, tests,
power and the SRM check, plus the charts' series.

The same dict feeds the dashboard, ``GET /api/admin/metrics``, ``flask --app webapp ab-report
--json`` and the scheduler's promotion policy. The user of an answer is its conversation's user;
a user's arm is their assignment (else the arm of their answers). Compare-pair answers count only
in the compare win rate (each user votes on pairs of both arms), not in their arm's other metrics.

Excluded raters (:func:`webapp.core.raters.excluded_raters`: admins, who can see the arms, and
quarantined raters) are counted out entirely: their answers, feedback, votes and assignments are
left out of every number here (``excluded_users`` says how many); their chats were answered as
anyone's, and their rows stay in the database.
"""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from flask import current_app

from webapp.core.display import display_path
from webapp.core.extensions import db
from webapp.core.instance_paths import resolve
from webapp.core.models import (
    AnswerScore,
    Assignment,
    Comparison,
    Conversation,
    Experiment,
    Feedback,
    Flag,
    Message,
    history,
    iso,
    utcnow,
)
from webapp.core.raters import excluded_raters
from webapp.core.ratings.thumb import THUMBS
from webapp.experiments import sample_stats
from webapp.experiments.promotion import PromotionPolicy, policy_from_config
from webapp.experiments.table import ARMS, metrics_table, user_table

log = logging.getLogger(__name__)


def _reward_model_path(exp: Experiment) -> str | None:
    """The reward model of the variant's training run (the one that shaped it), if any, as its
    version row stores it (webapp.core.instance_paths): also the key of its cached scores."""
    for version in (exp.variant_version, exp.control_version):
        path = (version.metrics or {}).get("reward_model_path")
        if path and (resolve(path) / "config.json").is_file():
            return path
    return None


def _reward_scores(answers: list[Message], rm_path: str | None) -> tuple[dict[int, float], str | None]:
    """Scores of ``answers`` by the reward model, computed once and cached in answer_scores, and
    why some are missing: a reward model that cannot be loaded leaves its answers unscored (the
    mean-reward metric then lacks them) instead of failing the pages that show the metrics."""
    if not rm_path or not answers:
        return {}, None
    ids = [a.id for a in answers]
    cached = {s.message_id: s.score for s in db.session.scalars(
        db.select(AnswerScore).where(AnswerScore.reward_model == rm_path, AnswerScore.message_id.in_(ids)))}
    missing = [a for a in answers if a.id not in cached]
    if missing:
        from rlhf.reward.scoring import load_reward_model, reward_texts, score_texts

        try:
            model, tok = _cached_reward_model(str(resolve(rm_path)), load_reward_model)
        except Exception as exc:  # whatever from_pretrained raises for a damaged directory
            log.warning("reward model %s cannot be loaded: %s", rm_path, exc)
            return cached, f"the reward model cannot be loaded ({type(exc).__name__}); {len(missing)} answers unscored"
        texts = reward_texts(tok, [history(db.session.get(Message, a.parent_id)) for a in missing],
                             [a.content for a in missing])
        for a, score in zip(missing, score_texts(model, tok, texts)):
            cached[a.id] = score
            db.session.add(AnswerScore(message_id=a.id, reward_model=rm_path, score=score))
        db.session.commit()
    return cached, None


def _criteria_scores(answers: list[Message], rm_path: str | None) -> dict[str, dict[int, float]]:
    """Each criterion head's score of ``answers`` (rlhf.reward.criteria_heads) by the same reward model, computed
    once per answer and cached in answer_scores under ``<path>#<criterion>``; empty when that reward
    model has no criterion heads."""
    from rlhf.reward.criteria_heads import read_heads

    heads = read_heads(resolve(rm_path)) if rm_path else None
    if heads is None or not answers:
        return {}
    names = heads[0]
    ids = [a.id for a in answers]
    out: dict[str, dict[int, float]] = {name: {} for name in names}
    for s in db.session.scalars(db.select(AnswerScore).where(
            AnswerScore.reward_model.in_([f"{rm_path}#{n}" for n in names]), AnswerScore.message_id.in_(ids))):
        out[s.reward_model.rsplit("#", 1)[1]][s.message_id] = s.score
    missing = [a for a in answers if any(a.id not in out[n] for n in names)]
    if missing:
        from rlhf.reward.criteria_heads import CriteriaScorer

        location = str(resolve(rm_path))
        try:
            scorer = _cached_reward_model(f"{location}#criteria", lambda _: CriteriaScorer.load(location))
        except Exception as exc:  # as for the reward score: the pages stay up, the heads' rows stay empty
            log.warning("criterion heads of %s cannot be loaded: %s", rm_path, exc)
            return out
        scores = scorer.score_answers([history(db.session.get(Message, a.parent_id)) for a in missing],
                                      [a.content for a in missing])
        for name in names:
            for a, value in zip(missing, scores[name]):
                if a.id not in out[name]:
                    out[name][a.id] = value
                    db.session.add(AnswerScore(message_id=a.id, reward_model=f"{rm_path}#{name}", score=value))
        db.session.commit()
    return out


def _criteria_means(by_arm: dict[str, list[Message]], scores: dict[str, dict[int, float]]) -> dict[str, Any]:
    """Per criterion, each arm's mean score over its answers (informational: answer-level means; the
    safety cost's user-level comparison is the ``mean_cost`` row)."""
    out: dict[str, Any] = {}
    for name, by_id in scores.items():
        row = {}
        for arm in ARMS:
            values = [by_id[a.id] for a in by_arm[arm] if a.id in by_id and math.isfinite(by_id[a.id])]
            row[arm] = {"mean": round(sum(values) / len(values), 4) if values else None, "n": len(values)}
        out[name] = row
    return out


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


def _user_rows(exp: Experiment, answers: list[Message], user_of: dict[int, int], feedback: dict[int, Feedback],
               pairs: list[Comparison], paired: set[int], regenerated: set[int],
               scores: dict[int, float], excluded: frozenset[int] = frozenset(),
               flagged: frozenset[int] = frozenset(), costs: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """One row of sums per user and arm: their own answers' feedback and flags (``flagged``: the
    answers their user flagged), and their compare votes.
    ``excluded`` users get no row (their answers are expected to be left out of ``answers``)."""
    rows: dict[tuple[int, str | None], dict[str, Any]] = {}
    home: dict[int, tuple[int, str | None]] = {}  # the row a user's votes go to: their first one

    def row(uid: int, arm: str | None) -> dict[str, Any]:
        if (uid, arm) not in rows:
            rows[(uid, arm)] = defaultdict(float, arm=arm)
            home.setdefault(uid, (uid, arm))
        return rows[(uid, arm)]

    for uid, arm in db.session.execute(db.select(Assignment.user_id, Assignment.arm)
                                       .where(Assignment.experiment_id == exp.id)):
        if uid not in excluded:
            row(uid, arm if arm in ARMS else None)
    for a in answers:
        if a.id in paired or a.arm not in ARMS:
            continue
        r = row(user_of[a.id], a.arm)
        r["answers"] += 1
        f = feedback.get(a.id)
        if f is not None:
            if f.thumb in THUMBS:
                r["thumbs"] += 1
                r["ups"] += f.thumb == "up"
            if f.rating is not None:
                r["ratings"] += 1
                r["rating_sum"] += f.rating
            r["corrections"] += bool(f.correction)
        r["regenerations"] += a.id in regenerated
        r["flags"] += a.id in flagged
        if a.id in scores and math.isfinite(scores[a.id]):
            r["scored"] += 1
            r["reward_sum"] += scores[a.id]
        if costs and a.id in costs and math.isfinite(costs[a.id]):
            r["cost_scored"] += 1
            r["cost_sum"] += costs[a.id]
        if a.latency_ms is not None and math.isfinite(a.latency_ms):
            r["timed"] += 1
            r["latency_sum"] += a.latency_ms
    arm_of = {a.id: a.arm for a in answers}
    for p in pairs:  # side-by-side votes between the two arms, by the user who voted
        arms = (arm_of.get(p.message_a_id), arm_of.get(p.message_b_id))
        if p.winner is None or set(arms) != set(ARMS) or p.message_a_id not in user_of:
            continue
        uid = user_of[p.message_a_id]
        r = rows[home[uid]] if uid in home else row(uid, None)
        if p.winner in ("tie", "both_bad"):
            r["ties"] += 1
        else:
            won = arms[0] if p.winner == "a" else arms[1]
            r["wins" if won == "variant" else "losses"] += 1
    return list(rows.values())


def users_per_day(exp: Experiment, users: int, now: datetime | None = None) -> float | None:
    """New users per day so far (None before the experiment has run a minute or has users)."""
    if exp.started_at is None or users == 0:
        return None
    days = ((exp.ended_at or now or utcnow()) - exp.started_at).total_seconds() / 86400
    return users / days if days * 1440 >= 1 else None


def experiment_metrics(exp: Experiment, policy: PromotionPolicy | None = None) -> dict[str, Any]:
    """The experiment's metrics table (see the module docstring), under ``policy`` (default:
    the app's settings)."""
    cfg = current_app.config
    policy = policy or policy_from_config(cfg)
    min_sample = int(cfg["RLHF_AB_MIN_SAMPLE"])
    excluded = frozenset(excluded_raters())
    answers, user_of, left_out = [], {}, set()
    for a, uid in db.session.execute(db.select(Message, Conversation.user_id)
                                     .join(Conversation, Message.conversation_id == Conversation.id)
                                     .where(Message.experiment_id == exp.id, Message.role == "assistant")):
        if uid in excluded:  # admins and quarantined raters: answered, but counted out of the verdict
            left_out.add(uid)
            continue
        answers.append(a)
        user_of[a.id] = uid
    left_out |= excluded & set(db.session.scalars(db.select(Assignment.user_id)
                                                  .where(Assignment.experiment_id == exp.id)))
    by_arm = {arm: [a for a in answers if a.arm == arm] for arm in ARMS}
    ids = [a.id for a in answers]
    feedback = {f.message_id: f for f in db.session.scalars(
        db.select(Feedback).where(Feedback.message_id.in_(ids)))} if answers else {}
    # answers their own user flagged as harmful (the flagged rate: a guardrail, lower is better)
    flagged = frozenset(mid for mid, uid in db.session.execute(
        db.select(Flag.message_id, Flag.user_id).where(Flag.message_id.in_(ids))) if user_of.get(mid) == uid) \
        if answers else frozenset()
    pairs = list(db.session.scalars(db.select(Comparison).where(Comparison.message_a_id.in_(ids)))) if answers else []
    paired = {p.message_a_id for p in pairs} | {p.message_b_id for p in pairs}
    scores, reward_model_problem = _reward_scores(answers, _reward_model_path(exp))
    criteria = _criteria_scores(answers, _reward_model_path(exp))
    users = user_table(_user_rows(exp, answers, user_of, feedback, pairs, paired, _regenerated(answers, paired),
                                  scores, excluded, flagged, criteria.get("safety")))
    n_users = int((users["arm"] >= 0).sum())
    table = metrics_table(users, exp.traffic_split, min_sample, policy, users_per_day(exp, n_users))
    for arm in ARMS:
        table["arms"][arm].update(answers=len(by_arm[arm]),
                                  conversations=len({a.conversation_id for a in by_arm[arm]}),
                                  feedback=sum(1 for a in by_arm[arm] if a.id in feedback))
    latency = next(row for row in table["metrics"] if row["name"] == "latency_ms")
    for arm in ARMS:  # per answer: what a user waits, not a verdict
        values = [a.latency_ms for a in by_arm[arm] if a.latency_ms is not None]
        latency[arm].update(p50=sample_stats.percentile(values, 50), p95=sample_stats.percentile(values, 95))
    return {
        "experiment": experiment_dict(exp),
        **table,
        "daily": _daily(by_arm, feedback),
        "timeline": _timeline(exp, by_arm, feedback),
        "reward_model": display_path(_reward_model_path(exp)),
        "reward_model_problem": reward_model_problem,
        # the same reward model's criterion heads (rlhf.reward.criteria_heads), when it has them
        "criteria": _criteria_means(by_arm, criteria),
        "excluded_users": len(left_out),
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
