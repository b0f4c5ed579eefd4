"""The data model (tables and columns as docs/ describes them). Plain SQLAlchemy 2 declarative classes, so
any SQLAlchemy database works; SQLite is the default. Every change here needs a revision in
webapp/migrations/versions/ (`flask --app webapp db migrate -m "..."`); tests/webapp/core/test_migrations.py
fails while the two disagree.

One module because the whole schema in one place is what a migration author reads and what each
revision is compared against: split, the tables that reference each other would change together
across files."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from flask_login import UserMixin
from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from rlhf.data.criteria import FLAG_VALUES
from rlhf.trust.vocabulary import TRUST_LEVELS
from webapp.core.extensions import db
from webapp.core.instance_paths import resolve
from webapp.core.ratings.stars import STARS
from webapp.core.ratings.thumb import THUMBS


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def iso(dt: Optional[datetime]) -> Optional[str]:
    return dt.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z") if dt else None


ROLES = ("user", "assistant", "system")
WINNERS = ("a", "b", "tie", "both_bad")
VERSION_STATUSES = ("candidate", "active", "retired", "failed")
EXPERIMENT_STATUSES = ("draft", "running", "stopped", "concluded")
RUN_STATUSES = ("queued", "running", "succeeded", "failed")
ARMS = ("control", "variant")


class User(UserMixin, db.Model):
    """An anonymous visitor (``anon_id`` from the signed cookie), an end user with an account, or an
    admin (``username`` and ``password_hash``). ``session_generation`` is written into a signed-in
    session; bumping it ends every session of the user (webapp/core/signin.py)."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    anon_id: Mapped[Optional[str]] = mapped_column(String(64), unique=True)
    username: Mapped[Optional[str]] = mapped_column(String(80), unique=True)
    password_hash: Mapped[Optional[str]] = mapped_column(String(255))
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    session_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    conversations = relationship("Conversation", back_populates="user", passive_deletes=True)


# A username is unique regardless of case (webapp.core.signin.username_key; names are ASCII).
Index("uq_users_username_lower", db.func.lower(User.username), unique=True)


class Conversation(db.Model):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_user_created", "user_id", "created_at"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    title: Mapped[str] = mapped_column(String(200), default="New chat")
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)
    # Soft delete: hidden from the user at once, excluded from training data and exports.
    deleted_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    # A conversation held by a front end over the /v1 API: its own chat id (X-OpenWebUI-Chat-Id),
    # which threads its completions into this conversation.
    external_chat_id: Mapped[Optional[str]] = mapped_column(String(200), index=True)

    user = relationship("User", back_populates="conversations")
    messages = relationship("Message", back_populates="conversation", order_by="Message.id",
                            passive_deletes=True)


class Message(db.Model):
    """One turn. Regenerated answers are siblings: same ``parent_id`` (the user message)."""

    __tablename__ = "messages"
    __table_args__ = (CheckConstraint(f"role IN {ROLES}", name="ck_messages_role"),
                      CheckConstraint("arm IS NULL OR arm IN ('control', 'variant')", name="ck_messages_arm"),
                      UniqueConstraint("completion_id", name="uq_messages_completion_id"))
    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    parent_id: Mapped[Optional[int]] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    model_version_id: Mapped[Optional[int]] = mapped_column(ForeignKey("model_versions.id"), index=True)
    experiment_id: Mapped[Optional[int]] = mapped_column(ForeignKey("experiments.id"), index=True)
    arm: Mapped[Optional[str]] = mapped_column(String(16))
    latency_ms: Mapped[Optional[float]] = mapped_column(Float)
    token_count: Mapped[Optional[int]] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    # Answers given over the /v1 API: the key that asked, the completion id the client got (feedback
    # by completion id names it), and the front end's own message id (X-OpenWebUI-Message-Id).
    api_key_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("api_keys.id", ondelete="SET NULL", name="fk_messages_api_key_id"), index=True)
    completion_id: Mapped[Optional[str]] = mapped_column(String(64))
    external_message_id: Mapped[Optional[str]] = mapped_column(String(200), index=True)
    # A guided regeneration's instruction (Open WebUI's "More Concise", "Add Details" or a typed change):
    # the answer is a sibling of the one it replaces, asked for with this change in mind (webapp.openai_api.threads).
    guidance: Mapped[Optional[str]] = mapped_column(Text)
    # Why generation ended (rlhf.generation: eos, stop_string, length, cancelled, rail); "length" is an
    # answer cut at the generation limit, shown as cut and never taken as a complete good answer.
    finish_reason: Mapped[Optional[str]] = mapped_column(String(16))

    conversation = relationship("Conversation", back_populates="messages")
    model_version = relationship("ModelVersion")


class Feedback(db.Model):
    """One row per (user, message), updated in place when the user changes their mind."""

    __tablename__ = "feedback"
    __table_args__ = (UniqueConstraint("user_id", "message_id", name="uq_feedback_user_message"),
                      CheckConstraint(f"thumb IS NULL OR thumb IN {THUMBS}", name="ck_feedback_thumb"),
                      CheckConstraint(f"rating IS NULL OR (rating BETWEEN {STARS[0]} AND {STARS[-1]})",
                                      name="ck_feedback_rating"))
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    thumb: Mapped[Optional[str]] = mapped_column(String(8))
    rating: Mapped[Optional[int]] = mapped_column(Integer)
    correction: Mapped[Optional[str]] = mapped_column(Text)
    comment: Mapped[Optional[str]] = mapped_column(Text)
    reasons: Mapped[list] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow, index=True)

    message = relationship("Message")


class Comparison(db.Model):
    """Two assistant answers to one user message shown side by side, and the user's pick."""

    __tablename__ = "comparisons"
    __table_args__ = (CheckConstraint("winner IS NULL OR winner IN ('a', 'b', 'tie', 'both_bad')",
                                      name="ck_comparisons_winner"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    prompt_message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    message_a_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))
    message_b_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))
    winner: Mapped[Optional[str]] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    voted_at: Mapped[Optional[datetime]] = mapped_column(DateTime)

    message_a = relationship("Message", foreign_keys=[message_a_id])
    message_b = relationship("Message", foreign_keys=[message_b_id])


class ModelVersion(db.Model):
    __tablename__ = "model_versions"
    __table_args__ = (CheckConstraint(f"status IN {VERSION_STATUSES}", name="ck_model_versions_status"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(120), unique=True)
    # relative to the instance folder when inside it (webapp.core.instance_paths); read it as .location
    path: Mapped[str] = mapped_column(String(1000))
    parent_id: Mapped[Optional[int]] = mapped_column(ForeignKey("model_versions.id"))
    kind: Mapped[str] = mapped_column(String(32))  # base / ppo / dpo / kto / rloo / iterative_dpo / reward
    status: Mapped[str] = mapped_column(String(16), default="candidate", index=True)
    # A cycle with training_runs.version_id, so created by ALTER TABLE; the name (PostgreSQL's default
    # for it) lets drop_all drop it first.
    training_run_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("training_runs.id", use_alter=True, name="model_versions_training_run_id_fkey"))
    metrics: Mapped[dict] = mapped_column(JSON, default=dict)
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    parent = relationship("ModelVersion", remote_side=[id])

    @property
    def location(self) -> str:
        """Where the version's files are on this host: ``path`` as stored (relative to the instance
        folder, webapp.core.instance_paths) resolved."""
        return str(resolve(self.path))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "status": self.status,
                "parent_id": self.parent_id, "training_run_id": self.training_run_id,
                "metrics": self.metrics or {}, "created_at": iso(self.created_at)}


class Experiment(db.Model):
    __tablename__ = "experiments"
    __table_args__ = (CheckConstraint(f"status IN {EXPERIMENT_STATUSES}", name="ck_experiments_status"),
                      CheckConstraint("traffic_split > 0 AND traffic_split < 1", name="ck_experiments_split"))
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(120), unique=True)  # also the hash seed
    control_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    variant_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    traffic_split: Mapped[float] = mapped_column(Float, default=0.5)  # share of users in the variant
    status: Mapped[str] = mapped_column(String(16), default="draft", index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    ended_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    decision: Mapped[Optional[str]] = mapped_column(String(32))  # promote / keep_control
    decision_detail: Mapped[dict] = mapped_column(JSON, default=dict)

    control_version = relationship("ModelVersion", foreign_keys=[control_version_id])
    variant_version = relationship("ModelVersion", foreign_keys=[variant_version_id])


class Assignment(db.Model):
    """A user's first exposure to an experiment; sticky thereafter."""

    __tablename__ = "assignments"
    __table_args__ = (UniqueConstraint("experiment_id", "user_id", name="uq_assignments_experiment_user"),
                      CheckConstraint("arm IN ('control', 'variant')", name="ck_assignments_arm"))
    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    arm: Mapped[str] = mapped_column(String(16))
    first_seen: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class TrainingRun(db.Model):
    __tablename__ = "training_runs"
    __table_args__ = (CheckConstraint(f"status IN {RUN_STATUSES}", name="ck_training_runs_status"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    trigger: Mapped[str] = mapped_column(String(16), default="manual")  # schedule / manual / cli
    algorithm: Mapped[str] = mapped_column(String(16), default="ppo")
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    stage: Mapped[Optional[str]] = mapped_column(String(32))
    progress: Mapped[float] = mapped_column(Float, default=0.0)  # 0..1 over the whole cycle
    # The running stage's clock and steps (webapp.training.eta: how long is left).
    stage_started_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    stage_done: Mapped[Optional[int]] = mapped_column(Integer)
    stage_total: Mapped[Optional[int]] = mapped_column(Integer)
    feedback_counts: Mapped[dict] = mapped_column(JSON, default=dict)
    metrics: Mapped[dict] = mapped_column(JSON, default=dict)
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    log: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[Optional[str]] = mapped_column(Text)
    # Liveness of the process doing the work: lets a later run recover a stale lock.
    pid: Mapped[Optional[int]] = mapped_column(Integer)
    hostname: Mapped[Optional[str]] = mapped_column(String(255))
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    finished_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    version_id: Mapped[Optional[int]] = mapped_column(ForeignKey("model_versions.id"))


class AnswerScore(db.Model):
    """Reward-model score of a served answer, cached per reward model (A/B metric)."""

    __tablename__ = "answer_scores"
    __table_args__ = (UniqueConstraint("message_id", "reward_model", name="uq_answer_scores_message_model"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    reward_model: Mapped[str] = mapped_column(String(1000))
    score: Mapped[float] = mapped_column(Float)


class AuditEvent(db.Model):
    """What admins and the scheduler decided, with the numbers behind it."""

    __tablename__ = "audit_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(80))  # admin username, "scheduler" or "cli"
    action: Mapped[str] = mapped_column(String(40))  # promote / rollback / experiment_start / ...
    subject: Mapped[str] = mapped_column(String(200), default="")
    detail: Mapped[dict] = mapped_column(JSON, default=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "at": iso(self.created_at), "actor": self.actor, "action": self.action,
                "subject": self.subject, "detail": self.detail or {}}


def active_version() -> ModelVersion | None:
    return db.session.scalars(db.select(ModelVersion).filter_by(status="active")
                              .order_by(ModelVersion.id.desc())).first()


def history(message: Message) -> list[dict[str, str]]:
    """The conversation up to and including ``message``, following parent links."""
    chain: list[Message] = []
    node: Message | None = message
    while node is not None:
        chain.append(node)
        node = db.session.get(Message, node.parent_id) if node.parent_id else None
    return [{"role": m.role, "content": m.content} for m in reversed(chain)]


# ---------------------------------------------------------------------------- feedback integrity

class RaterTrust(db.Model):
    """An admin's setting for one rater: ``auto`` (the training run's assessment decides),
    ``trusted`` (never quarantined automatically) or ``quarantined`` (their feedback is left out)."""

    __tablename__ = "rater_trust"
    __table_args__ = (CheckConstraint(f"trust IN {TRUST_LEVELS}", name="ck_rater_trust_trust"),)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    trust: Mapped[str] = mapped_column(String(16), default="auto")
    note: Mapped[Optional[str]] = mapped_column(Text)
    set_by: Mapped[Optional[int]] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    set_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RaterAssessment(db.Model):
    """The latest training run's assessment of one rater (rlhf.trust): their volume, share of
    the cycle's signal, agreement with the other raters, training weight and status."""

    __tablename__ = "rater_assessments"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    training_run_id: Mapped[Optional[int]] = mapped_column(ForeignKey("training_runs.id", ondelete="SET NULL"),
                                                           index=True)
    events: Mapped[int] = mapped_column(Integer, default=0)
    raw_share: Mapped[float] = mapped_column(Float, default=0.0)
    share: Mapped[float] = mapped_column(Float, default=0.0)
    agreement: Mapped[Optional[float]] = mapped_column(Float)
    checked: Mapped[int] = mapped_column(Integer, default=0)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    status: Mapped[str] = mapped_column(String(16), default="normal", index=True)  # one of rlhf.trust.RATER_STATUSES
    reasons: Mapped[list] = mapped_column(JSON, default=list)
    assessed_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class IdentityOrigin(db.Model):
    """Where an anonymous identity was created: a hash of the client address salted with the
    secret key (never the address itself), for the per-address limit on new identities."""

    __tablename__ = "identity_origins"
    __table_args__ = (Index("ix_identity_origins_address_created", "address_hash", "created_at"),)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    address_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class SigninFailure(db.Model):
    """Failed admin sign-ins, one row per (name tried, client address): how many and when, for the
    dashboard's overview (webapp/admin/auth.py). The address is stored as it is -- the one place
    besides the logs -- and rows are dropped a week after their last failure."""

    __tablename__ = "signin_failures"
    __table_args__ = (UniqueConstraint("username", "address", name="uq_signin_failures_username_address"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(80))  # as compared (webapp.core.signin.username_key), cut to 80
    address: Mapped[str] = mapped_column(String(64))
    failures: Mapped[int] = mapped_column(Integer, default=1)
    first_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    last_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)


# ---------------------------------------------------------------------------- flags

_FLAG_CATEGORIES_SQL = "(" + ", ".join(f"'{v}'" for v in FLAG_VALUES) + ")"


class Flag(db.Model):
    """A user's flag on an assistant answer as harmful, in one category of
    ``rlhf.data.criteria.FLAG_CATEGORIES``, with an optional note. One row per (user, message):
    flagging again changes the category and note in place; removing the flag deletes the row."""

    __tablename__ = "flags"
    __table_args__ = (UniqueConstraint("user_id", "message_id", name="uq_flags_user_message"),
                      CheckConstraint(f"category IN {_FLAG_CATEGORIES_SQL}", name="ck_flags_category"))
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    category: Mapped[str] = mapped_column(String(32))
    note: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow, index=True)

    message = relationship("Message")


# ---------------------------------------------------------------------------- safety rail

RAIL_RULE_KINDS = ("phrase", "pattern", "preset")
RAIL_ACTIONS = ("refused", "regenerated")


class RailRule(db.Model):
    """A rule of the output rail (rlhf.safety.rules): an admin's blocked phrase or pattern, or the
    on/off state of a built-in personal-data preset (a preset without a row is on)."""

    __tablename__ = "rail_rules"
    __table_args__ = (UniqueConstraint("kind", "value", name="uq_rail_rules_kind_value"),
                      CheckConstraint("kind IN ('phrase', 'pattern', 'preset')", name="ck_rail_rules_kind"))
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    value: Mapped[str] = mapped_column(String(400))
    enabled: Mapped[bool] = mapped_column(default=True)
    created_by: Mapped[Optional[int]] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RailIntervention(db.Model):
    """One answer the rail blocked: the reason (the rule, or "cost head p=0.93"), what was done
    (refused, or regenerated: another answer was sampled), the text the model wrote (admins only),
    the version that wrote it, and the message the user saw instead (null when none was stored)."""

    __tablename__ = "rail_interventions"
    __table_args__ = (CheckConstraint("action IN ('refused', 'regenerated')", name="ck_rail_interventions_action"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    message_id: Mapped[Optional[int]] = mapped_column(ForeignKey("messages.id", ondelete="SET NULL"), index=True)
    user_id: Mapped[Optional[int]] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)
    conversation_id: Mapped[Optional[int]] = mapped_column(ForeignKey("conversations.id", ondelete="SET NULL"))
    reason: Mapped[str] = mapped_column(String(500))
    kind: Mapped[str] = mapped_column(String(16))  # phrase / pattern / preset / cost / timeout
    action: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    blocked_text: Mapped[str] = mapped_column(Text)
    model_version_id: Mapped[Optional[int]] = mapped_column(ForeignKey("model_versions.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)

    model_version = relationship("ModelVersion")


# ---------------------------------------------------------------------------- the /v1 API

class ApiKey(db.Model):
    """A key for the OpenAI-compatible /v1 API, created by an admin and shown once. Only its
    SHA-256 is stored (keys are long random strings, so a fast hash is enough); ``prefix`` is
    the first characters, for recognising it in lists. ``client`` names the front end the key
    belongs to: end users (the ``user`` field, ``safety_identifier``, a forwarded header) are the
    same app users across all keys of one client. ``forwards_user_headers`` trusts the
    ``X-OpenWebUI-User-Id`` header, for a front end that sets it itself."""

    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(80), unique=True)
    client: Mapped[str] = mapped_column(String(80))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    forwards_user_headers: Mapped[bool] = mapped_column(default=False)
    rate_limit: Mapped[Optional[str]] = mapped_column(String(100))  # None: RLHF_API_RATE_LIMIT
    created_by: Mapped[Optional[int]] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    last_used_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
    request_count: Mapped[int] = mapped_column(Integer, default=0)
    revoked_at: Mapped[Optional[datetime]] = mapped_column(DateTime)
