"""Open WebUI's ratings as this app's feedback: the export's records (read by
webapp.training.openwebui_export) matched to stored answers and stored.

Each record is matched to the stored answer it rates -- never guessed:

1. by ids: the answer whose ``external_message_id`` is ``meta.message_id`` (the
   ``X-OpenWebUI-Message-Id`` header at completion time), in the conversations whose
   ``external_chat_id`` is ``meta.chat_id`` (``X-OpenWebUI-Chat-Id``) when that chat is stored;
2. else by text: the rated answer's text and its question's text from the snapshot (surrounding
   whitespace aside), among the answers given over the /v1 API -- in that chat's conversations when
   the chat is stored, otherwise in all of them.

Either way only answers served to the record's own user count (``user_id``: the Open WebUI user the
/v1 API was told of, by header or ``user`` field, when it answered): ``meta`` and ``snapshot`` come
from that user's browser and may name anybody's chat, message or text, so an answer served to
someone else is reported ("not the rater's answer"), never rated in their name. Anything but exactly
one candidate is reported. A record dated more than a few minutes into the future is malformed: it
would outrank every later rating of the owner's, on every import.

A matched rating is stored through the chat page's upsert (webapp.core.ratings.store.save_feedback) as
the user who owns the answer's conversation -- the rater. A record whose rated answer and a sibling (another
answer to the same question in the snapshot, ``data.sibling_model_ids``) are both matched also
becomes a side-by-side vote (a Comparison).

Idempotent: a rating whose values the stored row already has is not written (its ``updated_at``
stays, so the scheduler's retrain threshold does not count it again), nor one older than the
stored row (the app's own feedback, or an earlier import, is newer); of several records for one
answer only the newest counts. Comparisons follow the same rules.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from webapp.core.audit import audit
from webapp.core.extensions import db
from webapp.core.identity import api_anon_id
from webapp.core.models import ApiKey, Comparison, Conversation, Feedback, Message, User, utcnow
from webapp.core.ratings.registry import unchanged
from webapp.core.ratings.store import save_feedback
from webapp.core.validation import clip
from webapp.training.openwebui_export import Rating, Snap, Unmatched, parse_rating, record_time

UNMATCHED_REASONS = ("no such chat", "message not found", "text ambiguous", "not the rater's answer", "not a rating",
                     "malformed")

api_user_anon_id = api_anon_id  # the /v1 API's end user (webapp.core.identity)


# ---------------------------------------------------------------------------- matching

class _Matcher:
    """Stored answers for export records: by the forwarded ids, else by text (never guessed)."""

    def __init__(self) -> None:
        self._chats: dict[str, list[int]] = {}

    def chat(self, chat_id: str | None) -> list[int]:
        """Live conversations that hold the front end's chat ``chat_id``."""
        if not chat_id:
            return []
        if chat_id not in self._chats:
            self._chats[chat_id] = list(db.session.scalars(
                db.select(Conversation.id).where(Conversation.external_chat_id == chat_id,
                                                 Conversation.deleted_at.is_(None))))
        return self._chats[chat_id]

    def _answers(self, conversations: list[int] | None):
        query = (db.select(Message).join(Conversation, Message.conversation_id == Conversation.id)
                 .where(Message.role == "assistant", Conversation.deleted_at.is_(None)))
        if conversations is not None:
            return query.where(Message.conversation_id.in_(conversations))
        return query.where(Message.completion_id.is_not(None))  # answers given over the /v1 API

    def by_id(self, message_id: str, conversations: list[int] | None) -> list[Message]:
        return list(db.session.scalars(self._answers(conversations).where(Message.external_message_id == message_id)))

    def by_text(self, question: str, answer: str, conversations: list[int] | None) -> list[Message]:
        asked = db.aliased(Message)
        query = (self._answers(conversations).join(asked, Message.parent_id == asked.id)
                 .where(asked.role == "user", Message.content.in_(sorted({answer, answer.strip()})),
                        asked.content.in_(sorted({question, question.strip()}))))
        return list(db.session.scalars(query.order_by(Message.id)))

    def served_to(self, candidates: list[Message], external_user_id: str | None) -> list[Message]:
        """The candidates served to this front-end user: answered over the /v1 API in a conversation of
        the app user that the answering key's client makes of ``external_user_id`` (webapp.openai_api.users).
        A rating binds to its rater: nobody's record becomes someone else's feedback."""
        if not external_user_id or not candidates:
            return []
        rows = db.session.execute(
            db.select(Message.id, ApiKey.client, User.anon_id)
            .join(Conversation, Message.conversation_id == Conversation.id)
            .join(User, Conversation.user_id == User.id).join(ApiKey, Message.api_key_id == ApiKey.id)
            .where(Message.id.in_(sorted({m.id for m in candidates}))))
        served = {mid for mid, client, anon_id in rows if anon_id == api_user_anon_id(client, external_user_id)}
        return [m for m in candidates if m.id in served]

    def match(self, r: Rating) -> tuple[Message, str]:
        """The stored answer ``r`` rates, served to ``r``'s user, and how it was found ("message id" or
        "text"); Unmatched with the reason otherwise."""
        scope = self.chat(r.chat_id) or None
        by_id = self.by_id(r.message_id, scope)
        mine = self.served_to(by_id, r.user_id)
        if len(mine) == 1:
            return mine[0], "message id"
        if len(mine) > 1:
            raise Unmatched("text ambiguous", f"{len(mine)} stored answers carry message id {clip(r.message_id)}")
        no_chat = (f"chat {clip(r.chat_id)} is not stored" if r.chat_id else "the record names no chat")
        by_text: list[Message] = []
        if r.answer is not None and r.answer.content is not None and r.question is not None \
                and r.question.content is not None:
            by_text = self.by_text(r.question.content, r.answer.content, scope)
            mine = self.served_to(by_text, r.user_id)
            if len(mine) == 1:
                return mine[0], "text"
            if mine:
                where = f"in chat {clip(r.chat_id)}" if scope else "among the /v1 answers"
                raise Unmatched("text ambiguous", f"{len(mine)} stored answers {where} served to this user have this "
                                 "text under this question")
        if by_id or by_text:
            rater = f"Open WebUI user {clip(r.user_id)}" if r.user_id else "the record's user (it names none)"
            raise Unmatched("not the rater's answer", f"the answer it names was served to someone else, not to "
                             f"{rater}: a rating counts only as the feedback of the person who got the answer")
        if r.answer is None or r.answer.content is None or r.question is None or r.question.content is None:
            if scope:
                raise Unmatched("message not found", f"no stored answer in chat {clip(r.chat_id)} has message id "
                                 f"{clip(r.message_id)}, and the snapshot has no text to match it by")
            raise Unmatched("no such chat", f"{no_chat}, and the snapshot has no text to match the answer by")
        if scope:
            raise Unmatched("message not found", f"chat {clip(r.chat_id)} is stored, but no answer in it has message "
                             f"id {clip(r.message_id)} or this text under this question")
        raise Unmatched("no such chat", f"{no_chat}, and no /v1 answer has this text under this question")

    def sibling(self, s: Snap, question: str, rated: Message) -> Message | None:
        """``s`` (another answer to the rated one's question) in the rated answer's conversation."""
        scope = [rated.conversation_id]
        found = self.by_id(s.id, scope)
        if not found and s.content is not None:
            found = self.by_text(question, s.content, scope)
        found = [m for m in found if m.id != rated.id]
        return found[0] if len(found) == 1 else None


# ---------------------------------------------------------------------------- storing

def _store_rating(owner: int, message_id: int, r: Rating) -> str:
    """created / updated / unchanged / kept (the stored row is newer than the rating)."""
    row = db.session.scalars(db.select(Feedback).filter_by(user_id=owner, message_id=message_id)).first()
    state = None if row is None else ("unchanged" if unchanged(row, r.changes)
                                      else "kept" if row.updated_at and row.updated_at >= r.at else None)
    db.session.commit()  # end the read transaction: the upsert may write on another connection (SQLite)
    if state:
        return state
    save_feedback(owner, message_id, r.changes)
    return "created" if row is None else "updated"


def _winner(thumbs: dict[int, tuple[str, datetime]], a: int, b: int) -> str:
    """The vote two sibling answers' ratings make: one liked over one disliked (or over the unrated
    other), two liked a tie, two disliked both bad."""
    ta, tb = (thumbs[m][0] if m in thumbs else None for m in (a, b))
    if ta and tb and ta == tb:
        return "tie" if ta == "up" else "both_bad"
    if ta:
        return "a" if ta == "up" else "b"
    return "b" if tb == "up" else "a"


def _store_votes(pairs: dict[tuple[int, int, int], dict[int, tuple[str, datetime]]],
                 prompts: dict[tuple[int, int, int], int]) -> dict[str, int]:
    counts = {"created": 0, "updated": 0, "unchanged": 0, "kept": 0}
    now = utcnow()
    for (owner, a, b), thumbs in sorted(pairs.items()):
        winner, at = _winner(thumbs, a, b), max(t for _, t in thumbs.values())
        row = db.session.scalars(db.select(Comparison).where(
            Comparison.user_id == owner,
            db.or_(db.and_(Comparison.message_a_id == a, Comparison.message_b_id == b),
                   db.and_(Comparison.message_a_id == b, Comparison.message_b_id == a)))
            .order_by(Comparison.id)).first()
        if row is None:
            db.session.add(Comparison(user_id=owner, prompt_message_id=prompts[(owner, a, b)], message_a_id=a,
                                      message_b_id=b, winner=winner, voted_at=now))
            counts["created"] += 1
            continue
        if row.message_a_id != a:  # the stored pair's sides the other way round
            winner = {"a": "b", "b": "a"}.get(winner, winner)
        if row.winner == winner:
            counts["unchanged"] += 1
        elif row.voted_at is not None and row.voted_at >= at:
            counts["kept"] += 1
        else:
            row.winner, row.voted_at = winner, now
            counts["updated"] += 1
    db.session.commit()
    return counts


def import_ratings(records: list, source: str = "", actor: str = "cli") -> dict[str, Any]:
    """Match and store an export's records (see the module's docstring). Returns the summary:
    counts and one result per record (``status`` matched / duplicate / unmatched, with ``reason``
    and ``detail`` when unmatched)."""
    results: list[dict[str, Any]] = [{"record": i + 1, "id": raw.get("id") if isinstance(raw, dict) else None}
                                     for i, raw in enumerate(records)]

    def unmatched(i: int, reason: str, detail: str) -> None:
        results[i].update(status="unmatched", reason=reason, detail=detail)

    now = utcnow()
    # one record per Open WebUI feedback id: the newest
    newest: dict[str, int] = {}
    for i, raw in enumerate(records):
        fid = raw.get("id") if isinstance(raw, dict) else None
        if not isinstance(fid, str) or not fid:
            continue
        if fid in newest:
            old = newest[fid]
            keep, drop = (i, old) if (record_time(raw, now) or datetime.min) > \
                (record_time(records[old], now) or datetime.min) else (old, i)
            newest[fid] = keep
            results[drop].update(status="duplicate", detail=f"record {keep + 1} has the same feedback id")
            results[keep].pop("status", None)
            results[keep].pop("detail", None)
        else:
            newest[fid] = i
    matcher = _Matcher()
    matched: dict[int, tuple[Rating, Message]] = {}  # stored answer id -> its newest rating
    for i, raw in enumerate(records):
        if results[i].get("status") == "duplicate":
            continue
        try:
            try:
                r = parse_rating(i, raw, now)
            except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
                # a shape no check above foresaw: this record is reported, the others still import
                raise Unmatched("malformed", f"could not be read ({type(exc).__name__})") from None
            answer, how = matcher.match(r)
        except Unmatched as exc:
            unmatched(i, exc.reason, exc.detail)
            continue
        results[i].update(status="matched", matched_by=how, message_id=answer.id)
        if answer.id in matched:  # two records rate the same answer: the newer one counts
            other = matched[answer.id][0]
            older, newer = (other, r) if (r.at, r.index) > (other.at, other.index) else (r, other)
            results[older.index].update(status="duplicate", detail=f"record {newer.index + 1} rates the same answer "
                                        "and is newer")
            if newer is other:
                continue
        matched[answer.id] = (r, answer)

    owners = {cid: uid for cid, uid in db.session.execute(db.select(Conversation.id, Conversation.user_id).where(
        Conversation.id.in_(sorted({m.conversation_id for _, m in matched.values()}))))}
    feedback_counts = {"created": 0, "updated": 0, "unchanged": 0, "kept": 0}
    pairs: dict[tuple[int, int, int], dict[int, tuple[str, datetime]]] = {}
    prompts: dict[tuple[int, int, int], int] = {}
    for answer_id, (r, answer) in sorted(matched.items(), key=lambda kv: kv[1][0].index):
        owner = owners[answer.conversation_id]
        siblings = [matcher.sibling(s, r.question.content, answer) for s in r.siblings] \
            if r.sibling_models and r.question and r.question.content is not None and answer.parent_id else []
        kept = sorted({s.id for s in siblings if s is not None})
        state = _store_rating(owner, answer_id, r)
        feedback_counts[state] += 1
        results[r.index].update(feedback=state, siblings_matched=len(kept),
                                siblings_unmatched=len(siblings) - len(kept))
        for sibling_id in kept:
            key = (owner, min(answer_id, sibling_id), max(answer_id, sibling_id))
            pairs.setdefault(key, {})[answer_id] = (r.thumb, r.at)
            prompts.setdefault(key, answer.parent_id)
    votes = _store_votes(pairs, prompts) if pairs else {"created": 0, "updated": 0, "unchanged": 0, "kept": 0}

    statuses = [res.get("status") for res in results]
    by_reason = {reason: n for reason in UNMATCHED_REASONS
                 if (n := sum(1 for res in results if res.get("reason") == reason))}
    summary = {"source": source, "records": len(records), "matched": statuses.count("matched"),
               "duplicate": statuses.count("duplicate"), "unmatched": statuses.count("unmatched"),
               "unmatched_by_reason": by_reason,
               "matched_by": {how: sum(1 for res in results if res.get("status") == "matched"
                                       and res.get("matched_by") == how) for how in ("message id", "text")},
               "feedback": feedback_counts, "comparisons": votes, "results": results}
    if feedback_counts["created"] + feedback_counts["updated"] + votes["created"] + votes["updated"]:
        audit("openwebui_import", clip(source, 200), actor=actor, records=len(records), feedback=feedback_counts,
              comparisons=votes, unmatched=summary["unmatched"], duplicate=summary["duplicate"])
        db.session.commit()
    return summary


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The import's outcome as text: counts, then each unmatched record with its reason."""
    fb, votes = summary["feedback"], summary["comparisons"]
    lines = [f"{summary['records']} records: {summary['matched']} matched, {summary['duplicate']} duplicate, "
             f"{summary['unmatched']} unmatched",
             f"  feedback: {fb['created']} created, {fb['updated']} updated, {fb['unchanged']} unchanged, "
             f"{fb['kept']} kept (the stored feedback is newer); matched by message id "
             f"{summary['matched_by']['message id']}, by text {summary['matched_by']['text']}",
             f"  side-by-side votes from sibling ratings: {votes['created']} created, {votes['updated']} updated, "
             f"{votes['unchanged']} unchanged, {votes['kept']} kept"]
    if summary["unmatched_by_reason"]:
        lines.append("  unmatched: " + ", ".join(f"{reason} {n}"
                                                 for reason, n in summary["unmatched_by_reason"].items()))
    for res in summary["results"]:
        if res.get("status") == "unmatched":
            name = f" (id {clip(str(res['id']))})" if res.get("id") else ""
            lines.append(f"    record {res['record']}{name}: {res['reason']}: {res['detail']}")
    return lines
