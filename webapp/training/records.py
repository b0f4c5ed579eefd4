"""The feedback a training cycle learns from: what counts as a feedback event, the records read
from the database (redacted), and the export formats."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import or_

from rlhf.preference_data import build_datasets
from rlhf.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord
from rlhf.redaction import redact_records

from webapp.core.extensions import db
from webapp.core.models import Comparison, Conversation, Feedback, Message, ModelVersion


def feedback_events(since: datetime | None = None) -> dict[str, int]:
    """The one definition of a *feedback event*, used by training, the scheduler and the
    dashboard alike: a feedback row carrying a thumb, a rating or a correction (one event per
    rated answer, however many of the three it carries), plus each voted side-by-side
    comparison, in conversations that were not deleted. ``since``: only those written after it.

    Returns the breakdown (``thumbs``/``ratings``/``corrections`` count rows carrying each, so
    they can overlap), ``rated_answers`` (rows carrying any), ``votes`` and ``total``."""
    live = db.select(Conversation.id).where(Conversation.deleted_at.is_(None))
    has = {"thumbs": Feedback.thumb.is_not(None), "ratings": Feedback.rating.is_not(None),
           "corrections": Feedback.correction.is_not(None)}
    cols = [db.func.count(Feedback.id)] + [db.func.count(db.case((cond, 1))) for cond in has.values()]
    fb = (db.select(*cols).join(Message, Feedback.message_id == Message.id)
          .where(Message.conversation_id.in_(live)).where(or_(*has.values())))
    votes = (db.select(db.func.count(Comparison.id)).join(Message, Comparison.prompt_message_id == Message.id)
             .where(Message.conversation_id.in_(live)).where(Comparison.winner.is_not(None)))
    if since is not None:
        fb = fb.where(Feedback.updated_at > since)
        votes = votes.where(Comparison.voted_at > since)
    rated, *parts = db.session.execute(fb).one()
    n_votes = int(db.session.scalar(votes) or 0)
    return {"rated_answers": int(rated or 0), **{k: int(v or 0) for k, v in zip(has, parts)},
            "votes": n_votes, "total": int(rated or 0) + n_votes}


def feedback_event_count(since: datetime | None = None) -> int:
    """Feedback events available for training (see :func:`feedback_events`)."""
    return feedback_events(since)["total"]


def feedback_records(redact: bool = True) -> list[ConversationRecord]:
    """Every live conversation as plain records, with the owner's feedback and votes.
    Deleted conversations are left out, so deleting one removes it from future training.
    ``redact``: e-mail addresses and phone numbers in message texts, corrections and comments
    are replaced by ``[EMAIL]``/``[PHONE]`` (rlhf.redaction), for training and exports alike."""
    convs = db.session.execute(db.select(Conversation.id, Conversation.user_id)
                               .where(Conversation.deleted_at.is_(None)).order_by(Conversation.id)).all()
    owner = {cid: uid for cid, uid in convs}
    messages: dict[int, list[Message]] = {cid: [] for cid in owner}
    for m in db.session.scalars(db.select(Message).where(Message.conversation_id.in_(list(owner)))
                                .order_by(Message.id)):
        messages[m.conversation_id].append(m)
    msg_conv = {m.id: cid for cid, ms in messages.items() for m in ms}
    feedback: dict[int, FeedbackRecord] = {}
    for f in db.session.scalars(db.select(Feedback).where(Feedback.message_id.in_(list(msg_conv)))):
        if owner.get(msg_conv.get(f.message_id)) == f.user_id:
            feedback[f.message_id] = FeedbackRecord(f.thumb, f.rating, f.correction, f.comment,
                                                    tuple(f.reasons or ()))
    comparisons: dict[int, list[ComparisonRecord]] = {cid: [] for cid in owner}
    for c in db.session.scalars(db.select(Comparison).where(Comparison.prompt_message_id.in_(list(msg_conv)))):
        comparisons[msg_conv[c.prompt_message_id]].append(
            ComparisonRecord(c.id, c.prompt_message_id, c.message_a_id, c.message_b_id, c.winner))
    versions = {v.id: v.name for v in db.session.scalars(db.select(ModelVersion))}
    records = [ConversationRecord(
        id=cid, user_id=owner[cid], comparisons=tuple(comparisons[cid]),
        messages=tuple(MessageRecord(m.id, m.role, m.content, m.parent_id, feedback.get(m.id),
                                     versions.get(m.model_version_id)) for m in messages[cid]))
        for cid in owner if messages[cid]]
    return redact_records(records) if redact else records


EXPORT_FORMATS = ("pairs", "kto", "sft", "raw")


def export_rows(fmt: str, redact: bool = True) -> list[dict[str, Any]]:
    """Rows for ``export-feedback`` / the admin export: TRL columns plus ``split``; or raw
    conversations. Deleted conversations are never included. ``redact`` (the default): e-mail
    addresses and phone numbers in every text are replaced (see feedback_records)."""
    from dataclasses import asdict

    records = feedback_records(redact=redact)
    if fmt == "raw":
        return [asdict(r) for r in records]
    data = getattr(build_datasets(records), fmt)
    return [{**row, "split": split} for split in ("train", "eval") for row in data[split]]
