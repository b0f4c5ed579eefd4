"""The admin feedback browser: rated answers with their question, filtered and paged."""
from __future__ import annotations

from werkzeug.exceptions import BadRequest

from webapp.core.extensions import db
from webapp.core.models import Conversation, Feedback, Message, ModelVersion, iso
from webapp.core.validation import clip

FEEDBACK_FILTERS = {"thumb", "rating", "version", "arm", "has_correction", "q", "page"}


def feedback_page(args) -> dict:
    """Feedback rows with their answer and question, filtered; 50 per page, newest first."""
    unknown = set(args) - FEEDBACK_FILTERS
    if unknown:
        raise BadRequest(f"Unknown filter(s): {', '.join(clip(k) for k in sorted(unknown)[:10])}.")
    q = (db.select(Feedback, Message).join(Message, Feedback.message_id == Message.id)
         .join(Conversation, Message.conversation_id == Conversation.id).where(Conversation.deleted_at.is_(None)))
    if args.get("thumb"):
        if args["thumb"] not in ("up", "down"):
            raise BadRequest("thumb must be up or down.")
        q = q.where(Feedback.thumb == args["thumb"])
    if args.get("rating"):
        if args["rating"] not in {"1", "2", "3", "4", "5"}:
            raise BadRequest("rating must be 1-5.")
        q = q.where(Feedback.rating == int(args["rating"]))
    if args.get("arm"):
        if args["arm"] not in ("control", "variant"):
            raise BadRequest("arm must be control or variant.")
        q = q.where(Message.arm == args["arm"])
    if args.get("version"):
        q = q.join(ModelVersion, Message.model_version_id == ModelVersion.id).where(ModelVersion.name == args["version"])
    if args.get("has_correction") in ("1", "true", "yes"):
        q = q.where(Feedback.correction.is_not(None))
    if args.get("q"):
        like = f"%{args['q'][:200]}%"
        q = q.where(db.or_(Message.content.ilike(like), Feedback.comment.ilike(like), Feedback.correction.ilike(like)))
    page = args.get("page", "1")
    # ASCII digits only ("²".isdigit() is true), and few enough that the offset fits the database
    if not (page.isascii() and page.isdigit() and len(page) <= 9) or int(page) < 1:
        raise BadRequest("page must be a positive integer (at most 999999999).")
    page_n = int(page)
    total = db.session.scalar(db.select(db.func.count()).select_from(q.subquery()))
    rows = db.session.execute(q.order_by(Feedback.updated_at.desc()).limit(50).offset((page_n - 1) * 50)).all()
    versions = {v.id: v.name for v in db.session.scalars(db.select(ModelVersion))}
    items = []
    for fb, msg in rows:
        question = db.session.get(Message, msg.parent_id) if msg.parent_id else None
        items.append({"id": fb.id, "message_id": msg.id, "question": question.content if question else None,
                      "answer": msg.content, "thumb": fb.thumb, "rating": fb.rating, "correction": fb.correction,
                      "comment": fb.comment, "reasons": fb.reasons or [], "arm": msg.arm,
                      "model_version": versions.get(msg.model_version_id), "updated_at": iso(fb.updated_at)})
    return {"items": items, "total": total, "page": page_n, "pages": max(1, -(-total // 50))}
