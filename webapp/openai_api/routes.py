"""The OpenAI-compatible API: ``GET /v1/models``, ``GET /v1/models/<id>``, ``POST /v1/chat/completions``
and ``POST /v1/feedback`` (a rating of a completion, by its id). Bearer keys only: no cookie is
read for identity or ever set, and CSRF does not apply.

Every answer names the model the client asked for (the public name, ``RLHF_API_MODEL_NAME``):
which version or A/B arm served it appears in no body and no header. Each key has its own rate
limit (``RLHF_API_RATE_LIMIT`` unless set on the key); a request that was answered is counted on
the key (``request_count``, ``last_used_at``), a refused one changes nothing.
"""
from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request, stream_with_context

from webapp.core.extensions import csrf, db
from webapp.core.identity import mark_stateless
from webapp.core.models import Conversation, Message, ModelVersion
from webapp.core.ratings.flag import FLAG, flag_fields
from webapp.core.ratings.registry import FEEDBACK_FIELDS, feedback_changes
from webapp.core.ratings.store import remove_flag, save_feedback, save_flag, stored_feedback, stored_flag
from webapp.core.security import check_limit
from webapp.openai_api import completions
from webapp.openai_api.errors import ApiError, api_error_response
from webapp.openai_api.errors import init_app as init_errors
from webapp.openai_api.frontend_tasks import is_frontend_task
from webapp.openai_api.keys import find_key, record_use
from webapp.openai_api.params import completion_request, header_text, json_object, text_value
from webapp.openai_api.users import KeyInfo, api_user, external_user
from webapp.safety.rail import rail_for
from webapp.serving.routing import generation_settings, route_for, serve

bp = Blueprint("v1_api", __name__, url_prefix="/v1")
bp.register_error_handler(ApiError, api_error_response)

CHAT_HEADER = "X-OpenWebUI-Chat-Id"
MESSAGE_HEADER = "X-OpenWebUI-Message-Id"
# Connection headers an Open WebUI admin can add (docs/integrations/open-webui.md): the question's id
# ({{USER_MESSAGE_ID}}: guided regenerations recognised exactly) and the task ({{TASK}}: set for titles, tags...)
USER_MESSAGE_HEADER = "X-OpenWebUI-User-Message-Id"
TASK_HEADER = "X-OpenWebUI-Task"
MAX_HEADER_CHARS = 200


def init_app(app: Flask) -> None:
    csrf.exempt(bp)
    init_errors(app)
    app.register_blueprint(bp)

    @app.before_request
    def no_cookies_under_v1() -> None:  # an unknown /v1 path (no blueprint) included
        if request.path.startswith("/v1/"):
            mark_stateless()


@bp.before_request
def authenticate() -> None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' (an admin "
                            "creates keys: flask --app webapp create-api-key NAME, or the dashboard's API keys page).")
    row = find_key(token)
    if row is None:
        raise ApiError(401, "Incorrect API key provided.")
    if row.revoked_at is not None:
        raise ApiError(401, "This API key has been revoked.", code="api_key_revoked")
    g.api_key = KeyInfo(row.id, row.name, row.client, row.forwards_user_headers, row.rate_limit)
    check_limit(row.rate_limit or current_app.config["RLHF_API_RATE_LIMIT"], "api-key", str(row.id),
                "Too many requests with this API key.")


@bp.after_request
def count_request(response: Response) -> Response:
    key = g.get("api_key")
    if key is not None and response.status_code < 400 and not g.get("api_use_recorded"):
        record_use(key.id)
        db.session.commit()
    return response


def _public_model() -> dict[str, Any]:
    first = db.session.scalars(db.select(ModelVersion.created_at).order_by(ModelVersion.id)).first()
    return {"id": current_app.config["RLHF_API_MODEL_NAME"], "object": "model",
            "created": int(first.timestamp()) if first else 0, "owned_by": "rlhf-chat"}


def _model_not_found(name: str) -> ApiError:
    shown = name if len(name) <= 100 else name[:97] + "..."
    return ApiError(404, f"The model `{shown}` does not exist or you do not have access to it.", "model",
                    "model_not_found")


@bp.get("/models")
def list_models():
    return jsonify(object="list", data=[_public_model()])


@bp.get("/models/<path:model_id>")
def get_model(model_id: str):
    if model_id != current_app.config["RLHF_API_MODEL_NAME"]:
        raise _model_not_found(model_id)
    return jsonify(_public_model())


def _header(name: str) -> str | None:
    value = header_text(request.headers.get(name), name)
    if value is None or not value.strip():
        return None
    if len(value) > MAX_HEADER_CHARS:
        raise ApiError(400, f"The {name} header is too long (at most {MAX_HEADER_CHARS} characters).", name)
    return text_value(value.strip(), name)


MIN_SAMPLING_TEMPERATURE = 1e-4  # a smaller `temperature` answers greedily, as 0 does


@bp.post("/chat/completions")
def chat_completions():
    body = json_object()
    asked = completion_request(body)
    if asked.model != current_app.config["RLHF_API_MODEL_NAME"]:
        raise _model_not_found(asked.model)
    key: KeyInfo = g.api_key
    chat_id, message_id, question_id = _header(CHAT_HEADER), _header(MESSAGE_HEADER), _header(USER_MESSAGE_HEADER)
    user = api_user(key, external_user(key, body))
    route, loaded = serve(route_for(user))  # 503 when no version can answer, before anything is written
    settings = generation_settings()
    # below MIN_SAMPLING_TEMPERATURE sampling is greedy in effect, and logits / 1e-308 overflow to inf
    greedy = (asked.temperature is not None and asked.temperature < MIN_SAMPLING_TEMPERATURE) or asked.top_p == 0
    settings = replace(settings, max_new_tokens=min(asked.max_tokens or settings.max_new_tokens,
                                                    settings.max_new_tokens),
                       temperature=settings.temperature if greedy or asked.temperature is None else asked.temperature,
                       top_p=settings.top_p if greedy or asked.top_p is None else asked.top_p,
                       do_sample=not greedy, seed=asked.seed)
    job = completions.new_job(completion_id="chatcmpl-" + secrets.token_urlsafe(18), model=asked.model,
                              messages=asked.messages, settings=settings, stops=asked.stop, user_id=user.id,
                              key_id=key.id, chat_id=chat_id, external_message_id=message_id,
                              include_usage=asked.include_usage, user_message_id=question_id,
                              frontend_task=bool(_header(TASK_HEADER)) or is_frontend_task(asked.messages))
    rail = rail_for(route)
    g.api_use_recorded = True  # counted with the stored answer
    if not asked.stream:
        return jsonify(completions.answer(job, route, loaded, rail))
    return Response(stream_with_context(completions.stream(job, route, loaded, rail)), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# ---------------------------------------------------------------------------- feedback by completion id

_COMPLETION = (db.select(Message).join(Conversation, Message.conversation_id == Conversation.id)
               .where(Message.completion_id == db.bindparam("completion_id"), Message.role == "assistant",
                      Message.api_key_id == db.bindparam("key_id"), Conversation.deleted_at.is_(None)))


def _own_completion(key: KeyInfo, completion_id: str, named: str | None) -> tuple[int, int]:
    """(message id, its end user) of a completion ``key`` produced, for the named end user if any;
    404 otherwise, as for a completion that does not exist."""
    answer = db.session.scalars(_COMPLETION, {"completion_id": completion_id[:64], "key_id": key.id}).first()
    owner = answer.conversation.user_id if answer is not None else None
    if answer is None or (named is not None and getattr(api_user(key, named, create=False), "id", None) != owner):
        raise ApiError(404, f"No completion with id {completion_id[:80]!r} was produced with this API key"
                            + (" for this user." if answer is not None else "."), "completion_id")
    return answer.id, owner


@bp.post("/feedback")
def post_feedback():
    """Feedback on a completion this key produced, as the chat page gives it on an answer (the
    same validation and one upserted row per rater and answer), and optionally a flag (an object
    sets it, null removes it). The rater is the completion's end user: naming anyone else is a 404."""
    body = json_object()
    unknown = sorted(set(body) - {"completion_id", FLAG, "user", *FEEDBACK_FIELDS})
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise ApiError(400, f"Unknown field(s): {shown}. Allowed: completion_id, {', '.join(FEEDBACK_FIELDS)}, "
                            f"{FLAG}, user.", unknown[0][:40])
    completion_id = body.get("completion_id")
    if not isinstance(completion_id, str) or not completion_id:
        raise ApiError(400, "'completion_id' is required: the id of a chat completion (\"chatcmpl-...\").",
                       "completion_id")
    completion_id = text_value(completion_id, "completion_id")
    key: KeyInfo = g.api_key
    named = external_user(key, body, ("user",))
    given = {f: body[f] for f in FEEDBACK_FIELDS if f in body}
    if not given and FLAG not in body:
        raise ApiError(400, f"Send at least one of: {', '.join(FEEDBACK_FIELDS)}, {FLAG}.")
    changes = feedback_changes(given) if given else None
    flag = body.get(FLAG)
    if flag is not None and not isinstance(flag, dict):
        raise ApiError(400, "'flag' must be null (remove the flag) or an object {category, note}.", FLAG)
    category, note = flag_fields(flag) if flag is not None else (None, None)
    message_id, owner = _own_completion(key, completion_id, named)
    feedback = save_feedback(owner, message_id, changes) if changes is not None else stored_feedback(owner, message_id)
    if FLAG in body:
        if flag is None:
            remove_flag(owner, message_id)
        else:
            save_flag(owner, message_id, category, note)
    return jsonify(completion_id=completion_id, feedback=feedback, flag=stored_flag(owner, message_id))
