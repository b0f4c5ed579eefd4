"""The admin feedback browser: rated or flagged answers with their question, filtered and paged."""
from __future__ import annotations

from werkzeug.exceptions import BadRequest

from rlhf.data.criteria import FLAG_VALUES
from webapp.core.extensions import db
from webapp.core.models import Conversation, Feedback, Flag, Message, ModelVersion, iso
from webapp.core.ratings.flag import FLAG_LABELS
from webapp.core.ratings.registry import row_values, shown
from webapp.core.ratings.stars import STARS
from webapp.core.ratings.thumb import THUMBS
from webapp.core.validation import clip

FEEDBACK_FILTERS = {"thumb", "rating", "version", "arm", "has_correction", "flag", "q", "page"}
# the flag filter: "any" (flagged in any category) or one category
FLAG_FILTERS = ("any", *FLAG_VALUES)


def feedback_page(args) -> dict:
    """One row per answer with the owner's feedback or flag (or both), with its question,
    filtered; 50 per page, most recently changed first. ``flag``: only flagged answers (``any``)
    or those flagged in one category."""
    unknown = set(args) - FEEDBACK_FILTERS
    if unknown:
        raise BadRequest(f"Unknown filter(s): {', '.join(clip(k) for k in sorted(unknown)[:10])}.")
    changed = db.case((Flag.updated_at > Feedback.updated_at, Flag.updated_at),
                      else_=db.func.coalesce(Feedback.updated_at, Flag.updated_at))
    q = (db.select(Message, Feedback, Flag, changed.label("changed"))
         .join(Conversation, Message.conversation_id == Conversation.id)
         .outerjoin(Feedback, db.and_(Feedback.message_id == Message.id, Feedback.user_id == Conversation.user_id))
         .outerjoin(Flag, db.and_(Flag.message_id == Message.id, Flag.user_id == Conversation.user_id))
         .where(Conversation.deleted_at.is_(None), db.or_(Feedback.id.is_not(None), Flag.id.is_not(None))))
    if args.get("thumb"):
        if args["thumb"] not in THUMBS:
            raise BadRequest(f"thumb must be {' or '.join(THUMBS)}.")
        q = q.where(Feedback.thumb == args["thumb"])
    if args.get("rating"):
        if args["rating"] not in {str(n) for n in STARS}:
            raise BadRequest(f"rating must be {STARS[0]}-{STARS[-1]}.")
        q = q.where(Feedback.rating == int(args["rating"]))
    if args.get("arm"):
        if args["arm"] not in ("control", "variant"):
            raise BadRequest("arm must be control or variant.")
        q = q.where(Message.arm == args["arm"])
    if args.get("version"):
        q = (q.join(ModelVersion, Message.model_version_id == ModelVersion.id)
             .where(ModelVersion.name == args["version"]))
    if args.get("has_correction") in ("1", "true", "yes"):
        q = q.where(Feedback.correction.is_not(None))
    if args.get("flag"):
        if args["flag"] not in FLAG_FILTERS:
            raise BadRequest(f"flag must be one of: {', '.join(FLAG_FILTERS)}.")
        q = q.where(Flag.id.is_not(None) if args["flag"] == "any" else Flag.category == args["flag"])
    if args.get("q"):
        like = f"%{args['q'][:200]}%"
        q = q.where(db.or_(Message.content.ilike(like), Feedback.comment.ilike(like), Feedback.correction.ilike(like),
                           Flag.note.ilike(like)))
    page = args.get("page", "1")
    # ASCII digits only ("²".isdigit() is true), and few enough that the offset fits the database
    if not (page.isascii() and page.isdigit() and len(page) <= 9) or int(page) < 1:
        raise BadRequest("page must be a positive integer (at most 999999999).")
    page_n = int(page)
    total = db.session.scalar(db.select(db.func.count()).select_from(q.subquery()))
    rows = db.session.execute(q.order_by(changed.desc(), Message.id.desc()).limit(50).offset((page_n - 1) * 50)).all()
    versions = {v.id: v.name for v in db.session.scalars(db.select(ModelVersion))}
    items = []
    for msg, fb, flag, at in rows:
        question = db.session.get(Message, msg.parent_id) if msg.parent_id else None
        items.append({"id": fb.id if fb else None, "message_id": msg.id,
                      "question": question.content if question else None, "answer": msg.content,
                      **shown(row_values(fb) if fb else None),
                      "flag": {"category": flag.category, "label": FLAG_LABELS.get(flag.category, flag.category),
                               "note": flag.note, "updated_at": iso(flag.updated_at)} if flag else None,
                      "arm": msg.arm, "model_version": versions.get(msg.model_version_id), "updated_at": iso(at)})
    return {"items": items, "total": total, "page": page_n, "pages": max(1, -(-total // 50))}
