"""Schema creation, SQLite settings and a round trip through every table.

Every data-layer test runs on SQLite and on a real PostgreSQL server (tests/support/postgres.py;
skipped where PostgreSQL is not installed, required in CI), which proves the DATABASE_URL path."""
from __future__ import annotations

from datetime import datetime

import pytest
from click.testing import CliRunner
from flask.cli import FlaskGroup
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from tests.support.app import DATABASES, ApiClient, database_url_for
from webapp import create_app
from webapp.core.extensions import db
from webapp.core.models import (
    Assignment,
    Comparison,
    Conversation,
    Experiment,
    Feedback,
    Message,
    ModelVersion,
    TrainingRun,
    User,
)

TABLES = {"users", "conversations", "messages", "feedback", "comparisons", "model_versions", "experiments",
          "assignments", "training_runs", "answer_scores", "audit_events",
          "rater_trust", "rater_assessments", "identity_origins",  # feedback integrity
          "flags", "rail_rules", "rail_interventions",  # safety
          "api_keys",  # the /v1 API
          "signin_failures"}  # admin sign-in attempts


@pytest.fixture(params=DATABASES)
def database_url(request):
    """Overrides conftest's: each test of this module runs on SQLite and on PostgreSQL."""
    return database_url_for(request, request.param)


only_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
only_postgres = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


def _cli(tmp_path, monkeypatch, database_url=None):
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(tmp_path))
    if database_url:  # the deployment path: the URL comes from the environment
        monkeypatch.setenv("DATABASE_URL", database_url)
    return lambda *args: CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), list(args))


def test_init_db_is_idempotent(tmp_path, monkeypatch, database_url):
    run = _cli(tmp_path, monkeypatch, database_url)
    first = run("init-db")
    assert first.exit_code == 0, first.output
    app = create_app({"INSTANCE_DIR": str(tmp_path)})
    with app.app_context():
        assert db.engine.dialect.name == ("postgresql" if database_url else "sqlite")
        assert TABLES <= set(inspect(db.engine).get_table_names())
        db.session.add(User(anon_id="keep-me"))
        db.session.commit()
    for _ in range(2):
        again = run("init-db")
        assert again.exit_code == 0 and "up to date" in again.output
    with app.app_context():
        assert db.session.scalars(db.select(User).filter_by(anon_id="keep-me")).one()


def test_create_schema_reports_created_tables(tmp_path, database_url):
    from webapp.core.database import create_schema

    app = create_app({"INSTANCE_DIR": str(tmp_path),
                      **({"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {})})
    with app.app_context():
        db.drop_all()
        db.session.execute(text("DROP TABLE alembic_version"))  # an empty database
        db.session.commit()
        assert set(create_schema()) == TABLES
        assert create_schema() == []


@only_sqlite
def test_sqlite_runs_in_wal_mode_with_busy_timeout(app):
    with app.app_context():
        with db.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 15000
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1


def test_every_table_round_trips(app):
    with app.app_context():
        base = db.session.scalars(db.select(ModelVersion)).one()
        user = User(anon_id="anon-1")
        admin = User(username="root", password_hash="x", is_admin=True)
        db.session.add_all([user, admin])
        db.session.flush()
        run = TrainingRun(trigger="cli", algorithm="ppo", status="running", progress=0.25,
                          feedback_counts={"pairs": 3}, metrics={"reward_accuracy": 0.9}, log="line\n", pid=1)
        db.session.add(run)
        db.session.flush()
        variant = ModelVersion(name="v2-ppo", path="/x", parent_id=base.id, kind="ppo", status="candidate",
                               training_run_id=run.id, metrics={"mean_reward": 1.5}, config={"lr": 1e-5})
        db.session.add(variant)
        db.session.flush()
        run.version_id = variant.id
        exp = Experiment(key="exp-1", control_version_id=base.id, variant_version_id=variant.id,
                         traffic_split=0.3, status="running", started_at=datetime(2026, 1, 1))
        conv = Conversation(user_id=user.id, title="Rice <b>")
        db.session.add_all([exp, conv])
        db.session.flush()
        q = Message(conversation_id=conv.id, role="user", content="How do I cook rice?")
        db.session.add(q)
        db.session.flush()
        a1 = Message(conversation_id=conv.id, role="assistant", content="Rinse it.", parent_id=q.id,
                     model_version_id=base.id, experiment_id=exp.id, arm="control", latency_ms=12.5,
                     token_count=4)
        a2 = Message(conversation_id=conv.id, role="assistant", content="Ugh, fine.", parent_id=q.id,
                     model_version_id=variant.id, experiment_id=exp.id, arm="variant", latency_ms=20.0,
                     token_count=5)
        db.session.add_all([a1, a2])
        db.session.flush()
        db.session.add_all([
            Feedback(user_id=user.id, message_id=a1.id, thumb="up", rating=5, correction="Rinse it well.",
                     comment="nice", reasons=["helpful", "clear"]),
            Comparison(user_id=user.id, prompt_message_id=q.id, message_a_id=a1.id, message_b_id=a2.id,
                       winner="a"),
            Assignment(experiment_id=exp.id, user_id=user.id, arm="control"),
        ])
        db.session.commit()
        ids = dict(user=user.id, conv=conv.id, q=q.id, a1=a1.id, a2=a2.id, exp=exp.id, run=run.id,
                   variant=variant.id, base=base.id)

    with app.app_context():  # fresh session: everything comes back from the database
        conv = db.session.get(Conversation, ids["conv"])
        assert conv.title == "Rice <b>" and conv.user.anon_id == "anon-1" and conv.deleted_at is None
        assert [m.role for m in conv.messages] == ["user", "assistant", "assistant"]
        siblings = db.session.scalars(db.select(Message).filter_by(parent_id=ids["q"])).all()
        assert {m.arm for m in siblings} == {"control", "variant"}
        a1 = db.session.get(Message, ids["a1"])
        assert a1.model_version.name == db.session.get(ModelVersion, ids["base"]).name
        assert (a1.latency_ms, a1.token_count) == (12.5, 4)
        fb = db.session.scalars(db.select(Feedback)).one()
        assert (fb.thumb, fb.rating, fb.correction, fb.comment, fb.reasons) == \
            ("up", 5, "Rinse it well.", "nice", ["helpful", "clear"])
        assert fb.created_at is not None and fb.updated_at is not None
        cmp_ = db.session.scalars(db.select(Comparison)).one()
        assert (cmp_.message_a.content, cmp_.message_b.content, cmp_.winner) == ("Rinse it.", "Ugh, fine.", "a")
        variant = db.session.get(ModelVersion, ids["variant"])
        assert variant.parent.kind == "base" and variant.metrics == {"mean_reward": 1.5}
        exp = db.session.get(Experiment, ids["exp"])
        assert (exp.control_version.kind, exp.variant_version.name, exp.traffic_split) == ("base", "v2-ppo", 0.3)
        assert db.session.scalars(db.select(Assignment)).one().arm == "control"
        run = db.session.get(TrainingRun, ids["run"])
        assert (run.status, run.progress, run.feedback_counts, run.version_id) == \
            ("running", 0.25, {"pairs": 3}, ids["variant"])
        assert db.session.scalars(db.select(User).filter_by(username="root")).one().is_admin


def _message(app):
    with app.app_context():
        user = User(anon_id="u")
        db.session.add(user)
        db.session.flush()
        conv = Conversation(user_id=user.id)
        db.session.add(conv)
        db.session.flush()
        msg = Message(conversation_id=conv.id, role="assistant", content="hi")
        db.session.add(msg)
        db.session.commit()
        return user.id, msg.id


def test_one_feedback_row_per_user_and_message(app):
    user_id, msg_id = _message(app)
    with app.app_context():
        db.session.add(Feedback(user_id=user_id, message_id=msg_id, thumb="up"))
        db.session.commit()
        db.session.add(Feedback(user_id=user_id, message_id=msg_id, thumb="down"))
        with pytest.raises(IntegrityError):
            db.session.commit()
        db.session.rollback()
        assert db.session.scalars(db.select(Feedback)).one().thumb == "up"


@pytest.mark.parametrize("field,value", [("rating", 6), ("rating", 0), ("thumb", "sideways")])
def test_database_rejects_invalid_feedback_values(app, field, value):
    user_id, msg_id = _message(app)
    with app.app_context():
        db.session.add(Feedback(user_id=user_id, message_id=msg_id, **{field: value}))
        with pytest.raises(IntegrityError):
            db.session.commit()
        db.session.rollback()
        assert db.session.scalars(db.select(Feedback)).all() == []


def test_invalid_traffic_split_and_status_rejected(app):
    with app.app_context():
        base = db.session.scalars(db.select(ModelVersion)).one()
        db.session.add(Experiment(key="bad", control_version_id=base.id, variant_version_id=base.id,
                                  traffic_split=1.5))
        with pytest.raises(IntegrityError):
            db.session.commit()
        db.session.rollback()
        base.status = "weird"
        with pytest.raises(IntegrityError):
            db.session.commit()
        db.session.rollback()
        assert db.session.get(ModelVersion, base.id).status == "active"


def test_foreign_keys_enforced(app):
    with app.app_context():
        db.session.add(Message(conversation_id=999, role="user", content="orphan"))
        with pytest.raises(IntegrityError):
            db.session.commit()


def test_ids_are_64_bit(app):
    """SQLite ids are 64-bit; on PostgreSQL they are BIGINT too, so an id past 2**31 (stored or
    merely asked for) works instead of failing inside the driver with "integer out of range"."""
    big = 2**40
    with app.app_context():
        db.session.add(User(id=big, anon_id="big"))
        db.session.add(Conversation(id=big + 1, user_id=big))
        db.session.add(Message(id=2**62, conversation_id=big + 1, role="assistant", content="hi"))
        db.session.flush()
        db.session.add(Feedback(user_id=big, message_id=2**62, thumb="up"))
        db.session.commit()
    with app.app_context():
        msg = db.session.get(Message, 2**62)
        assert msg.conversation.user.anon_id == "big"
        assert db.session.scalars(db.select(Feedback).filter_by(message_id=2**62)).one().user_id == big
    api = ApiClient(app.test_client())
    assert api.get(f"/api/conversations/{2**40 + 7}").status_code == 404
    assert api.post(f"/api/messages/{2**63 - 1}/feedback", json={"thumb": "up"}).status_code == 404


def test_values_the_database_refuses_are_a_client_error(app):
    """PostgreSQL refuses NUL characters in text that SQLite stores: a 4xx, never a 500."""
    client = app.test_client()
    csrf = client.get("/api/session").get_json()["csrf_token"]
    resp = client.post("/admin/login", data={"username": "root\x00", "password": "x", "csrf_token": csrf})
    assert resp.status_code < 500 and b"Internal error" not in resp.data
    with app.app_context():  # the failed statement left the connection usable
        assert db.session.scalars(db.select(ModelVersion)).one().status == "active"


@only_postgres
def test_postgres_gets_no_sqlite_settings_and_checks_pooled_connections(app):
    with app.app_context():
        assert db.engine.dialect.name == "postgresql"
        assert db.engine.pool._pre_ping  # a connection is tested before use (server restarts)
        with db.engine.connect() as conn:
            assert conn.execute(text("SHOW server_version")).scalar()


@only_postgres
def test_app_survives_a_postgres_restart(app, postgres_server):
    """The pooled connections die with the server; the next requests must not fail."""
    api = ApiClient(app.test_client())
    before = api.post("/api/conversations", json={"title": "before"})
    assert before.status_code == 201
    assert api.get("/api/conversations").status_code == 200  # the pool now holds live connections

    postgres_server.restart()

    listed = api.get("/api/conversations")
    assert listed.status_code == 200, listed.get_data(as_text=True)
    assert [c["title"] for c in listed.get_json()["conversations"]] == ["before"]
    after = api.post("/api/conversations", json={"title": "after"})
    assert after.status_code == 201, after.get_data(as_text=True)
    assert api.get("/api/session").get_json()["user_id"] == api.user_id
    with app.app_context():
        assert sorted(db.session.scalars(db.select(Conversation.title))) == ["after", "before"]
