"""Schema migrations: the models and the migration head agree, a database written before
migrations is upgraded with every row kept and then serves and trains, a revision's upgrade and
downgrade keep the rows, and a database the code cannot use is refused with the reason.

Run on SQLite and on a real PostgreSQL server (tests/support/postgres.py) where the test says so."""
from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from tests.support.app import DATABASES, database_url_for, flask_cli, login_admin, make_app, register_model
from tests.support.feedback_factory import seed_feedback
from tests.support.paths import FIXTURES
from webapp.core.extensions import db
from webapp.core.schema_revision import MIGRATIONS_DIR, alembic_config, head_revision, schema_problem

FIXTURE = FIXTURES / "legacy_create_all.sql"


@pytest.fixture(params=DATABASES)
def database_url(request):
    return database_url_for(request, request.param)


def _new_database(tmp_path, database_url, request, name="other"):
    """The URL of another empty database of the same kind."""
    if database_url:
        return request.getfixturevalue("postgres_server").create_database()
    return f"sqlite:///{tmp_path / f'{name}.db'}"


def _table_rows(connection, like: dict | None = None) -> dict[str, list[tuple]]:
    """Every row of every table, in primary-key order (the data a migration must keep); with
    ``like``, only the tables and columns it has (columns by name, as ``_table_rows`` read them)."""
    out = {}
    for table in sorted(inspect(connection).get_table_names()):
        if table in ("alembic_version", "apscheduler_jobs") or (like is not None and table not in like):
            continue
        pk = inspect(connection).get_pk_constraint(table)["constrained_columns"] or ["rowid"]
        cols = [c["name"] for c in inspect(connection).get_columns(table)]
        if like is not None:
            cols = [c for c in cols if c in like["__columns__"][table]]
        rows = connection.execute(text(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {', '.join(pk)}")).all()
        out[table] = [tuple(str(v) for v in row) for row in rows]
        out.setdefault("__columns__", {})[table] = cols
    return out


def _typed_rows(connection) -> dict[str, list[tuple]]:
    """Every row of every model table as Python values (JSON parsed, booleans), by primary key:
    comparable across SQLite and PostgreSQL."""
    from sqlalchemy import select

    return {t.name: [tuple(row) for row in connection.execute(select(t).order_by(*t.primary_key.columns))]
            for t in db.metadata.sorted_tables}


def test_models_and_migration_head_agree(tmp_path, database_url, request):
    """The migrations alone build exactly the models' schema: a model changed without a revision
    (a column added, or a table or column deleted) fails here."""
    app = make_app(tmp_path / "instance", **({"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {}))
    engine = create_engine(_new_database(tmp_path, database_url, request))
    try:
        with app.app_context(), engine.connect() as connection:
            command.upgrade(alembic_config(connection), "head")
            connection.commit()
            include = app.extensions["migrate"].configure_args.get("include_object")
            context = MigrationContext.configure(connection, opts={"compare_type": True,
                                                                    "include_object": include})
            assert compare_metadata(context, db.metadata) == []
            assert context.get_current_revision() == head_revision()
            # expression indexes are not compared by autogenerate: by name
            names = connection.execute(text(
                "SELECT name FROM sqlite_master WHERE type = 'index'" if connection.dialect.name == "sqlite"
                else "SELECT indexname FROM pg_indexes")).scalars().all()
            assert "uq_users_username_lower" in names
    finally:
        engine.dispose()


def test_a_model_change_without_a_revision_is_found(tmp_path):
    """The agreement check can fail: a column the migrations do not make is reported."""
    from sqlalchemy import Column, Integer, MetaData, Table

    app = make_app(tmp_path / "instance")
    with app.app_context(), db.engine.connect() as connection:
        extra = MetaData()
        for table in db.metadata.sorted_tables:
            table.to_metadata(extra)
        Table("feedback", extra, Column("helpfulness", Integer), extend_existing=True)
        diff = compare_metadata(MigrationContext.configure(connection), extra)
    assert [(d[0], d[2], d[3].name) for d in diff if d[0] == "add_column"] \
        == [("add_column", "feedback", "helpfulness")], diff


def _legacy_database(instance: Path, micro_model_dir: Path) -> Path:
    """The fixture written by the create_all code, in ``instance``, with its model folders."""
    instance.mkdir(parents=True)
    path = instance / "rlhf.db"
    conn = sqlite3.connect(path)
    conn.executescript(FIXTURE.read_text().replace("@INSTANCE@", str(instance)))
    conn.close()
    for name in ("v1-base", "v2-ppo"):
        shutil.copytree(micro_model_dir, instance / "models" / name)
        (instance / "models" / name / "version.json").write_text(f'{{"name": "{name}", "kind": "base"}}')
    return path


def test_database_from_before_migrations_upgrades_keeping_every_row_then_serves_and_trains(
        tmp_path, micro_model_dir, monkeypatch):
    inst = tmp_path / "instance"
    path = _legacy_database(inst, micro_model_dir)
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as connection:
        before = _table_rows(connection)
        assert "alembic_version" not in inspect(connection).get_table_names()
    engine.dispose()
    assert all(before[t] for t in ("users", "conversations", "messages", "feedback", "comparisons", "flags",
                                   "experiments", "assignments", "training_runs", "model_versions", "answer_scores",
                                   "rater_trust", "rater_assessments", "rail_rules", "rail_interventions",
                                   "audit_events"))

    app = make_app(inst, RLHF_MAX_NEW_TOKENS=4)  # start-up upgrades it (RLHF_AUTO_UPGRADE is on)
    assert schema_problem(app) is None
    with app.app_context(), db.engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == head_revision()
        assert _table_rows(connection, like=before) == before  # every row, every value (new columns aside)

    # it serves: the chat answers with the active version, the stored feedback shows, the dashboard opens
    client = app.test_client()
    session = client.get("/api/session").get_json()
    csrf = {"X-CSRFToken": session["csrf_token"]}
    conv = client.post("/api/conversations", json={}, headers=csrf).get_json()["id"]
    answer = client.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?",
                                                                       "stream": False}, headers=csrf)
    assert answer.status_code == 201, answer.get_json()
    admin = app.test_client()
    login_admin(admin, "admin", "correct horse")
    page = admin.get("/admin/").get_data(as_text=True)
    assert "v2-ppo" in page
    assert "exp-1" in admin.get("/admin/experiments").get_data(as_text=True)
    feedback = admin.get("/api/admin/feedback").get_json()
    assert feedback["total"] == len(before["feedback"])

    # it trains: a full cycle on the upgraded database, after users go on rating
    seed_feedback(app, 30, seed=11)
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    for key, value in {"RLHF_DEVICE": "cpu", "RLHF_PPO_EPISODES": "32", "RLHF_EMBEDDED_PRESET": "micro"}.items():
        monkeypatch.setenv(key, value)
    result = flask_cli("rl-train", "--min-feedback", "10", "--max-steps", "2")
    assert result.exit_code in (0, 3), result.output
    assert re.search(r"Run #2 succeeded: v3-ppo registered as (candidate|failed)", result.output), result.output


def test_auto_upgrade_off_refuses_with_the_command_that_fixes_it(tmp_path, micro_model_dir, monkeypatch):
    inst = tmp_path / "instance"
    _legacy_database(inst, micro_model_dir)
    app = make_app(inst, RLHF_AUTO_UPGRADE=False)
    problem = schema_problem(app)
    assert problem and "flask --app webapp db upgrade" in problem
    resp = app.test_client().get("/api/session")
    assert resp.status_code == 503 and "db upgrade" in resp.get_json()["error"]
    assert resp.headers["Retry-After"]
    page = app.test_client().get("/")
    assert page.status_code == 503 and "db upgrade" in page.get_data(as_text=True)
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    monkeypatch.setenv("RLHF_AUTO_UPGRADE", "0")
    refused = flask_cli("export-feedback", "--format", "raw", "--output", "-")
    assert refused.exit_code == 1 and "db upgrade" in refused.output
    upgraded = flask_cli("db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output
    again = make_app(inst, RLHF_AUTO_UPGRADE=False)
    assert schema_problem(again) is None
    assert again.test_client().get("/api/session").status_code == 200


def test_database_from_newer_code_is_refused(tmp_path, micro_model_dir, monkeypatch):
    inst = tmp_path / "instance"
    app = make_app(inst)
    with app.app_context():
        db.session.execute(text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
        db.session.commit()
    newer = make_app(inst)  # auto-upgrade on: still never touches a schema it does not know
    assert "this code does not know" in schema_problem(newer)
    assert newer.test_client().get("/api/session").status_code == 503
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    for args in (["init-db"], ["ab-report"]):
        result = flask_cli(*args)
        assert result.exit_code == 1 and "this code does not know" in result.output, result.output
    with newer.app_context():
        assert db.session.execute(text("SELECT version_num FROM alembic_version")).scalar() == "ffffffffffff"


THROWAWAY = '''"""throwaway: feedback.helpfulness"""
from alembic import op
import sqlalchemy as sa

revision = "9999_throwaway"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(sa.Column("helpfulness", sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("helpfulness")
'''


def test_a_revision_adding_a_column_upgrades_and_downgrades_keeping_rows(tmp_path, micro_model_dir, database_url):
    app = make_app(tmp_path / "instance", **({"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {}))
    register_model(app, micro_model_dir)
    seed_feedback(app, 12)
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, directory, ignore=shutil.ignore_patterns("__pycache__"))
    head = head_revision()
    (directory / "versions" / "9999_throwaway.py").write_text(THROWAWAY.format(head=head))
    with app.app_context():
        with db.engine.connect() as connection:
            before = _table_rows(connection)
        with db.engine.connect() as connection:
            command.upgrade(alembic_config(connection, directory), "9999_throwaway")
            connection.commit()
            assert "helpfulness" in {c["name"] for c in inspect(connection).get_columns("feedback")}
            connection.execute(text("UPDATE feedback SET helpfulness = 3"))
            connection.commit()
            after = _table_rows(connection)
            # SQLite's batch mode copies the table: every row and value is still there, plus the column
            assert {t: r for t, r in after.items() if t not in ("feedback", "__columns__")} == \
                {t: r for t, r in before.items() if t not in ("feedback", "__columns__")}
            assert [row[:-1] for row in after["feedback"]] == before["feedback"]
            assert {row[-1] for row in after["feedback"]} == {"3"}
        with db.engine.connect() as connection:
            command.downgrade(alembic_config(connection, directory), head)
            connection.commit()
            assert "helpfulness" not in {c["name"] for c in inspect(connection).get_columns("feedback")}
            assert _table_rows(connection) == before
            assert MigrationContext.configure(connection).get_current_revision() == head


def test_the_baseline_refuses_to_downgrade(tmp_path):
    app = make_app(tmp_path / "instance")
    with app.app_context(), db.engine.connect() as connection:
        with pytest.raises(RuntimeError, match="cannot be downgraded"):
            command.downgrade(alembic_config(connection), "base")


def test_db_commands_run_on_the_app(tmp_path):
    """Flask-Migrate's commands (in a child process: Alembic prints to the real stdout)."""
    import os
    import subprocess
    import sys

    make_app(tmp_path / "instance")
    env = {**os.environ, "RLHF_INSTANCE_DIR": str(tmp_path / "instance"), "RLHF_EMBEDDED_PRESET": "micro"}
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "webapp", "db", "current"], env=env,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0 and f"{head_revision()} (head)" in out.stdout, out.stderr


def test_copy_to_postgresql_keeps_every_id_and_row(tmp_path, micro_model_dir, postgres_server, monkeypatch):
    """Moving to PostgreSQL (docs): the create_all-era fixture, upgraded, then copied with
    `flask --app webapp copy-database URL`: every row and id arrives, new rows get new ids."""
    inst = tmp_path / "instance"
    path = _legacy_database(inst, micro_model_dir)
    app = make_app(inst)
    with app.app_context(), db.engine.connect() as connection:
        before = _typed_rows(connection)
    url = postgres_server.create_database()
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    result = flask_cli("copy-database", url)
    assert result.exit_code == 0, result.output
    assert f"({len(before['feedback'])} feedback)" in result.stdout
    moved = make_app(inst, SQLALCHEMY_DATABASE_URI=url)
    assert schema_problem(moved) is None
    with moved.app_context():
        with db.engine.connect() as connection:
            after = _typed_rows(connection)
        assert after == before
        from webapp.core.models import User

        user = User(anon_id="after-the-move")
        db.session.add(user)
        db.session.commit()
        assert user.id > max(row[0] for row in before["users"])
    again = flask_cli("copy-database", url)  # never into a database with rows
    assert again.exit_code == 1 and "not empty" in again.output
    del path


def test_wsgi_workers_never_upgrade_and_refuse_a_database_behind(tmp_path, micro_model_dir):
    """gunicorn's workers each import webapp.wsgi: none of them upgrades; each stops with the reason."""
    import os
    import subprocess
    import sys

    inst = tmp_path / "instance"
    path = _legacy_database(inst, micro_model_dir)
    env = {**os.environ, "RLHF_INSTANCE_DIR": str(inst), "RLHF_SCHEDULER": "0", "RLHF_AUTO_INIT_MODEL": "0"}
    out = subprocess.run([sys.executable, "-c", "import webapp.wsgi"], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 1 and "flask --app webapp db upgrade" in out.stderr, out.stderr
    conn = sqlite3.connect(path)
    assert "alembic_version" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()


def test_an_upgrade_that_cannot_go_on_stops_with_the_reason_and_changes_nothing(tmp_path, micro_model_dir):
    """Names that differ only in case (the old create-admin could make them) cannot take the
    case-insensitive unique index: the upgrade says which, before changing anything."""
    from webapp.core.schema_revision import SchemaError

    inst = tmp_path / "instance"
    path = _legacy_database(inst, micro_model_dir)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO users (username, password_hash, is_admin, created_at) "
                 "VALUES ('Admin', 'x', 1, '2026-11-01 00:00:00')")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError, match="differ only in case: admin"):
        make_app(inst)
    conn = sqlite3.connect(path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    columns = {row[1] for row in conn.execute("PRAGMA table_info(users)")}
    conn.close()
    # all pending revisions run in one transaction: the database is still the create_all one
    assert "alembic_version" not in tables and "api_keys" not in tables and "session_generation" not in columns
