"""The feedback a training cycle learns from: what counts as a feedback event (in all and per
user), the records read from the database (redacted), what the runner needs to know of each rater
(``rater_infos``), and the export formats (with each row's rater columns)."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, union, union_all

from rlhf.data.datasets import build_datasets
from rlhf.data.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord
from rlhf.data.redaction import redact_records, redact_text
from webapp.core.extensions import db
from webapp.core.models import (
    Comparison,
    Conversation,
    Feedback,
    Flag,
    Message,
    ModelVersion,
    RaterAssessment,
    RaterTrust,
    User,
    utcnow,
)
from webapp.core.raters import trust_settings
from webapp.core.ratings.registry import event_kinds, record_fields


def _live_conversations():
    return db.select(Conversation.id).where(Conversation.deleted_at.is_(None))


# what makes a feedback row an event: any of the kinds that say so (see feedback_events); a flag on the answer too
_EVENT_PARTS = {event: getattr(Feedback, name).is_not(None) for event, name in event_kinds().items()}


def _rated_answers(fb_time=None, flag_time=None):
    """(user_id, message_id) of every answer with a feedback event in a live conversation, as a
    UNION (so an answer rated and flagged is one): a feedback row carrying any of
    :data:`_EVENT_PARTS`, or a flag. ``fb_time``/``flag_time``: a condition on each row's time."""
    live = _live_conversations()
    rated = (db.select(Feedback.user_id.label("uid"), Feedback.message_id.label("mid"))
             .join(Message, Feedback.message_id == Message.id)
             .where(Message.conversation_id.in_(live)).where(or_(*_EVENT_PARTS.values())))
    flagged = (db.select(Flag.user_id.label("uid"), Flag.message_id.label("mid"))
               .join(Message, Flag.message_id == Message.id).where(Message.conversation_id.in_(live)))
    if fb_time is not None:
        rated, flagged = rated.where(fb_time), flagged.where(flag_time)
    return union(rated, flagged).subquery()


def feedback_events(since: datetime | None = None) -> dict[str, int]:
    """The one definition of a *feedback event*, used by training, the scheduler and the
    dashboard alike: a rated answer -- one the user gave a thumb, a rating or a correction, or
    flagged as harmful (one event per answer, however many of these it carries) -- plus each
    voted side-by-side comparison, in conversations that were not deleted. ``since``: only those
    written after it (a feedback row's or flag's ``updated_at``, a vote's ``voted_at``).

    Returns the breakdown (``thumbs``/``ratings``/``corrections``/``flags`` count answers carrying
    each, so they can overlap), ``rated_answers`` (answers carrying any), ``votes`` and ``total``."""
    live = _live_conversations()
    has = _EVENT_PARTS
    cols = [db.func.count(db.case((cond, 1))) for cond in has.values()]
    fb = (db.select(*cols).join(Message, Feedback.message_id == Message.id)
          .where(Message.conversation_id.in_(live)).where(or_(*has.values())))
    flags = (db.select(db.func.count(Flag.id)).join(Message, Flag.message_id == Message.id)
             .where(Message.conversation_id.in_(live)))
    votes = (db.select(db.func.count(Comparison.id)).join(Message, Comparison.prompt_message_id == Message.id)
             .where(Message.conversation_id.in_(live)).where(Comparison.winner.is_not(None)))
    answers = _rated_answers()
    if since is not None:
        fb = fb.where(Feedback.updated_at > since)
        flags = flags.where(Flag.updated_at > since)
        votes = votes.where(Comparison.voted_at > since)
        answers = _rated_answers(Feedback.updated_at > since, Flag.updated_at > since)
    parts = db.session.execute(fb).one()
    rated = int(db.session.scalar(db.select(db.func.count()).select_from(answers)) or 0)
    n_flags = int(db.session.scalar(flags) or 0)
    n_votes = int(db.session.scalar(votes) or 0)
    return {"rated_answers": rated, **{k: int(v or 0) for k, v in zip(has, parts)}, "flags": n_flags,
            "votes": n_votes, "total": rated + n_votes}


def events_per_user(before: datetime | None = None):
    """Feedback events per user as a subquery with columns ``uid`` and ``events``, by the definition
    of :func:`feedback_events` (rated or flagged answers, and votes, in live conversations);
    ``before``: only those first written before it (a rating's or flag's ``created_at``, a vote's
    ``voted_at``)."""
    live = _live_conversations()
    answers = _rated_answers() if before is None else _rated_answers(Feedback.created_at < before,
                                                                     Flag.created_at < before)
    rated = db.select(answers.c.uid)
    votes = (db.select(Comparison.user_id.label("uid")).join(Message, Comparison.prompt_message_id == Message.id)
             .where(Message.conversation_id.in_(live)).where(Comparison.winner.is_not(None)))
    if before is not None:
        votes = votes.where(Comparison.voted_at < before)
    both = union_all(rated, votes).subquery()
    return db.select(both.c.uid, db.func.count().label("events")).group_by(both.c.uid).subquery()


# a rater's "prior events" are those older than this: history they had before the current burst
PRIOR_EVENTS_AGE = timedelta(hours=24)


def rater_infos() -> dict[int, dict[str, Any]]:
    """What rlhf.trust needs to know of every user with feedback events, by user id:
    ``trust`` (the admin's setting: auto/trusted/quarantined), ``account_age_hours`` (since the
    user row was created), ``prior_events`` (their feedback events first written more than 24 h
    ago: a rating's ``created_at``, a vote's ``voted_at``) and ``signed_in`` (they registered an
    account, or are an admin). One query, however many raters there are."""
    now = utcnow()
    events = events_per_user()
    prior = events_per_user(before=now - PRIOR_EVENTS_AGE)
    rows = db.session.execute(
        db.select(User.id, User.created_at, User.password_hash, User.is_admin, prior.c.events, RaterTrust.trust)
        .join(events, events.c.uid == User.id)
        .outerjoin(prior, prior.c.uid == User.id)
        .outerjoin(RaterTrust, RaterTrust.user_id == User.id))
    return {uid: {"trust": trust or "auto",
                  "account_age_hours": max(0.0, (now - (created or now)).total_seconds() / 3600),
                  "prior_events": int(n_prior or 0),
                  "signed_in": bool(password_hash) or bool(is_admin)}
            for uid, created, password_hash, is_admin, n_prior, trust in rows}


def feedback_event_count(since: datetime | None = None) -> int:
    """Feedback events available for training (see :func:`feedback_events`)."""
    return feedback_events(since)["total"]


def feedback_records(redact: bool = True) -> list[ConversationRecord]:
    """Every live conversation as plain records, with the owner's feedback (``flag``: their flag's
    category, a record of its own for an answer flagged without other feedback) and votes.
    Deleted conversations are left out, so deleting one removes it from future training.
    ``redact``: e-mail addresses and phone numbers in message texts, corrections and comments
    are replaced by ``[EMAIL]``/``[PHONE]`` (rlhf.data.redaction), for training and exports alike."""
    convs = db.session.execute(db.select(Conversation.id, Conversation.user_id)
                               .where(Conversation.deleted_at.is_(None)).order_by(Conversation.id)).all()
    owner = {cid: uid for cid, uid in convs}
    messages: dict[int, list[Message]] = {cid: [] for cid in owner}
    for m in db.session.scalars(db.select(Message).where(Message.conversation_id.in_(list(owner)))
                                .order_by(Message.id)):
        messages[m.conversation_id].append(m)
    msg_conv = {m.id: cid for cid, ms in messages.items() for m in ms}
    # the owner's flag on each answer (a flag alone, without other feedback, still makes a record)
    flags = {f.message_id: f.category
             for f in db.session.scalars(db.select(Flag).where(Flag.message_id.in_(list(msg_conv))))
             if owner.get(msg_conv.get(f.message_id)) == f.user_id}
    feedback: dict[int, FeedbackRecord] = {}
    for f in db.session.scalars(db.select(Feedback).where(Feedback.message_id.in_(list(msg_conv)))):
        if owner.get(msg_conv.get(f.message_id)) == f.user_id:
            feedback[f.message_id] = FeedbackRecord(**record_fields(f), flag=flags.get(f.message_id))
    for mid, category in flags.items():
        feedback.setdefault(mid, FeedbackRecord(flag=category))
    comparisons: dict[int, list[ComparisonRecord]] = {cid: [] for cid in owner}
    for c in db.session.scalars(db.select(Comparison).where(Comparison.prompt_message_id.in_(list(msg_conv)))):
        comparisons[msg_conv[c.prompt_message_id]].append(
            ComparisonRecord(c.id, c.prompt_message_id, c.message_a_id, c.message_b_id, c.winner))
    versions = {v.id: v.name for v in db.session.scalars(db.select(ModelVersion))}
    records = [ConversationRecord(
        id=cid, user_id=owner[cid], comparisons=tuple(comparisons[cid]),
        messages=tuple(MessageRecord(m.id, m.role, m.content, m.parent_id, feedback.get(m.id),
                                     versions.get(m.model_version_id), m.guidance, m.finish_reason == "length")
                      for m in messages[cid]))
        for cid in owner if messages[cid]]
    return redact_records(records) if redact else records


EXPORT_FORMATS = ("pairs", "kto", "sft", "raw")


def export_rows(fmt: str, redact: bool = True) -> list[dict[str, Any]]:
    """Rows for ``export-feedback`` / the admin export: TRL columns plus ``split``; or raw
    conversations (each answer's ``feedback`` with ``flag``, the flag's category, and
    ``flag_note``; both null when not flagged). Deleted conversations are never included.
    ``redact`` (the default): e-mail addresses and phone numbers in every text (flag notes too)
    are replaced (see feedback_records)."""
    from dataclasses import asdict

    records = feedback_records(redact=redact)
    columns = _rater_columns()
    if fmt == "raw":
        notes = _flag_notes(redact)
        rows = [{**asdict(r), **columns([r.user_id])} for r in records]
        for row in rows:  # each flagged answer's note beside its category (the note is not training data)
            for m in row["messages"]:
                if m["feedback"] is not None:
                    m["feedback"]["flag_note"] = notes.get(m["id"]) if m["feedback"].get("flag") else None
        return rows
    data = getattr(build_datasets(records), fmt)
    return [{**row, "split": split, **columns(row.get("raters"))} for split in ("train", "eval") for row in data[split]]


def _flag_notes(redact: bool) -> dict[int, str]:
    """The note of each flag its answer's conversation owner wrote, by message id (redacted)."""
    rows = db.session.execute(db.select(Flag.message_id, Flag.note).join(Message, Flag.message_id == Message.id)
                              .join(Conversation, Message.conversation_id == Conversation.id)
                              .where(Conversation.user_id == Flag.user_id, Flag.note.is_not(None)))
    return {mid: redact_text(note) if redact else note for mid, note in rows}


def _rater_columns():
    """``raters`` (user ids, as a row names them) -> ``rater_trust`` (the admin's setting: auto,
    trusted, quarantined), ``rater_status`` and ``rater_weight`` (the latest training run's
    assessment). One rater: plain values; several (a pair built from two conversations): lists in
    the order of the row's ``raters``; none known: null. A value not known is null."""
    trust = trust_settings()
    users = set(db.session.scalars(db.select(User.id)))
    assessed = {a.user_id: (a.status, a.weight) for a in db.session.scalars(db.select(RaterAssessment))}

    def one(uid: Any) -> tuple[str | None, str | None, float | None]:
        if not isinstance(uid, int) or uid not in users:
            return None, None, None
        status, weight = assessed.get(uid, (None, None))
        return trust.get(uid, "auto"), status, weight

    def columns(raters: Any) -> dict[str, Any]:
        ids = list(raters) if isinstance(raters, (list, tuple)) else []
        values = [one(uid) for uid in ids]
        if len(values) == 1:
            trust_v, status_v, weight_v = values[0]
            return {"rater_trust": trust_v, "rater_status": status_v, "rater_weight": weight_v}
        if not values:
            return {"rater_trust": None, "rater_status": None, "rater_weight": None}
        return {"rater_trust": [v[0] for v in values], "rater_status": [v[1] for v in values],
                "rater_weight": [v[2] for v in values]}
    return columns
