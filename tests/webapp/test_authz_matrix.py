"""Authorization matrix: every route of ``app.url_map`` x (anonymous, another user, the owner, a
signed-in end user (``member``: an account, not an admin), admin), with the expected outcome of
each cell written down in ``MATRIX``.

* chat objects (conversations, messages, comparison pairs) belong to one user: everyone else,
  the admin included, gets 404, exactly as for an object that does not exist (never 403, so
  ids do not leak);
* the admin JSON API answers 401 JSON to everyone but a logged-in admin; admin pages redirect
  everyone else to the login page -- a signed-in end user too;
* a denied request changes nothing in the database;
* the /v1 API answers only to bearer keys (401 to every cookie, the admin's too; 401 to a revoked
  key), a completion is rated only with the key that produced it (404 for another key's, even one
  of the same front end), and a key opens nothing outside /v1 (there it is an anonymous caller).

Every cell runs against fresh objects (a new conversation, version, experiment... created for
it), so a successful DELETE or promote in one cell cannot change the outcome of another. A
route that is added to the app without a row here fails ``test_every_route_is_classified``.
Requests carry the caller's valid CSRF token: what is tested is who may do what, not CSRF. A cell
that ends the admin's or the member's sessions (logging out, a new password) ends them for every
later cell too (webapp/core/signin.py), so those two are signed in again when that happened.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import pytest
import sqlalchemy as sa

from tests.support.app import register_model, route_sweep_app

ROLES = ("anonymous", "other", "owner", "member", "admin")
# bearer keys of the /v1 API: the key that produced the cell's completion, another key of the same
# front end, and a revoked key. Outside /v1 only "key" runs, expected to fare as "anonymous".
KEY_ROLES = ("key", "other_key", "revoked_key")
ADMIN_PASSWORD = "authz-admin-pass"
MEMBER_PASSWORD = "authz-member-pass"
LOGIN = "login"  # expected outcome: a redirect to the admin login page
_ids = itertools.count(1)


def everyone(outcome) -> dict:
    return {role: outcome for role in ROLES}


def owner_only(outcome) -> dict:
    """Chat objects: only their owner; everyone else (the admin too) sees a 404."""
    return {"anonymous": 404, "other": 404, "owner": outcome, "member": 404, "admin": 404}


def admin_api(outcome) -> dict:
    return {"anonymous": 401, "other": 401, "owner": 401, "member": 401, "admin": outcome}


ADMIN_PAGE = {"anonymous": LOGIN, "other": LOGIN, "owner": LOGIN, "member": LOGIN, "admin": 200}


def keys_only(key: int, other_key: int) -> dict:
    """/v1 routes: no cookie opens them (401); a valid key, and no revoked one."""
    return {**everyone(401), "key": key, "other_key": other_key, "revoked_key": 401}


# ---------------------------------------------------------------------------- fresh objects per cell

def chat_objects(world) -> dict:
    """A conversation of the owner with a question, two answers and a comparison pair."""
    from webapp.core.extensions import db
    from webapp.core.models import Comparison, Conversation, Message

    with world.app.app_context():
        conv = Conversation(user_id=world.owner_id, title="owner's secret chat")
        db.session.add(conv)
        db.session.flush()
        question = Message(conversation_id=conv.id, role="user", content="How do I boil rice?")
        db.session.add(question)
        db.session.flush()
        answers = [Message(conversation_id=conv.id, role="assistant", content=f"Answer {i}.", parent_id=question.id,
                           model_version_id=1) for i in (1, 2)]
        db.session.add_all(answers)
        db.session.flush()
        pair = Comparison(user_id=world.owner_id, prompt_message_id=question.id, message_a_id=answers[0].id,
                          message_b_id=answers[1].id)
        db.session.add(pair)
        db.session.commit()
        return {"conversation_id": conv.id, "message_id": answers[0].id, "pair_id": pair.id}


def flagged_answer(world) -> dict:
    """chat_objects, with the owner's flag on the answer (what a DELETE removes)."""
    from webapp.core.extensions import db
    from webapp.core.models import Flag

    ids = chat_objects(world)
    with world.app.app_context():
        db.session.add(Flag(user_id=world.owner_id, message_id=ids["message_id"], category="hate"))
        db.session.commit()
    return ids


def chat_question(world) -> dict:
    """chat_objects, naming the question (a user message) instead of an answer."""
    from webapp.core.extensions import db
    from webapp.core.models import Message

    objs = chat_objects(world)
    with world.app.app_context():
        objs["message_id"] = db.session.get(Message, objs["message_id"]).parent_id
    return objs


def _version(world, status: str, parent_id: int | None = None) -> int:
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion

    version = ModelVersion(name=f"authz-v{next(_ids)}", path=world.model_path, kind="ppo", status=status,
                           parent_id=parent_id)
    db.session.add(version)
    db.session.flush()
    return version.id


def no_running_experiment(world) -> None:
    """Versions are promoted or rolled back, and a draft starts, only while no experiment runs."""
    from webapp.core.extensions import db
    from webapp.core.models import Experiment

    with world.app.app_context():
        for running in db.session.scalars(db.select(Experiment).filter_by(status="running")):
            running.status = "stopped"
        db.session.commit()


def candidate_version(world) -> dict:
    no_running_experiment(world)
    from webapp.core.extensions import db

    with world.app.app_context():
        vid = _version(world, "candidate")
        db.session.commit()
        return {"version_id": vid}


def active_version_with_parent(world) -> dict:
    """An active version whose parent can take over again (what rollback needs)."""
    no_running_experiment(world)
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion

    with world.app.app_context():
        for v in db.session.scalars(db.select(ModelVersion).filter_by(status="active")):
            v.status = "retired"
        parent = _version(world, "retired")
        vid = _version(world, "active", parent_id=parent)
        db.session.commit()
        return {"version_id": vid}


def draft_experiment(world) -> dict:
    from webapp.core.extensions import db
    from webapp.core.models import Experiment

    with world.app.app_context():
        control, variant = _version(world, "retired"), _version(world, "candidate")
        key = f"authz-exp-{next(_ids)}"
        db.session.add(Experiment(key=key, control_version_id=control, variant_version_id=variant, status="draft"))
        db.session.commit()
        return {"key": key}


def startable_draft(world) -> dict:
    """A draft while no other experiment runs (only then can it start)."""
    no_running_experiment(world)
    return draft_experiment(world)


def new_experiment_body(world) -> dict:
    with world.app.app_context():
        from webapp.core.extensions import db

        variant = _version(world, "candidate")
        db.session.commit()
    return {"body": {"key": f"authz-new-{next(_ids)}", "control_version_id": 1, "variant_version_id": variant,
                     "start": False}}


def fresh_rater(world) -> dict:
    """A user with no setting yet (what an admin's trust decision is about)."""
    from webapp.core.extensions import db
    from webapp.core.models import User

    with world.app.app_context():
        user = User(anon_id=f"authz-rater-{next(_ids)}")
        db.session.add(user)
        db.session.commit()
        return {"user_id": user.id}


def fresh_account(world) -> dict:
    """An end user's account that nobody else's cell uses (what an admin signs out everywhere)."""
    from webapp.core.extensions import db
    from webapp.core.models import User

    with world.app.app_context():
        user = User(username=f"authz-account-{next(_ids)}", password_hash="not a real hash")
        db.session.add(user)
        db.session.commit()
        return {"user_id": user.id}


def new_account_body(world) -> dict:
    return {"body": {"username": f"authz-user-{next(_ids)}", "password": "a long password"}}


def training_run(world) -> dict:
    from webapp.core.extensions import db
    from webapp.core.models import TrainingRun

    with world.app.app_context():
        run = TrainingRun(status="succeeded", algorithm="ppo")
        db.session.add(run)
        db.session.commit()
        return {"run_id": run.id}


def rail_rule(world) -> dict:
    from webapp.core.extensions import db
    from webapp.core.models import RailRule

    with world.app.app_context():
        rule = RailRule(kind="phrase", value=f"authz phrase {next(_ids)}")
        db.session.add(rule)
        db.session.commit()
        return {"rule_id": rule.id}


def api_completion(world) -> dict:
    """A completion the world's "key" produced for one of its end users."""
    from webapp.core.extensions import db
    from webapp.core.models import Conversation, Message, User
    from webapp.openai_api.users import anon_id_for

    with world.app.app_context():
        user = User(anon_id=anon_id_for("authz-front", f"end-user-{next(_ids)}"))
        db.session.add(user)
        db.session.flush()
        conv = Conversation(user_id=user.id, title="an API chat")
        db.session.add(conv)
        db.session.flush()
        question = Message(conversation_id=conv.id, role="user", content="How do I boil rice?")
        db.session.add(question)
        db.session.flush()
        completion_id = f"chatcmpl-authz{next(_ids)}"
        db.session.add(Message(conversation_id=conv.id, role="assistant", content="Boil it.", parent_id=question.id,
                               model_version_id=1, api_key_id=world.key_ids["key"], completion_id=completion_id))
        db.session.commit()
    return {"body": {"completion_id": completion_id, "thumb": "up", "comment": "authz"}}


def fresh_api_key(world) -> dict:
    from webapp.openai_api.keys import create_api_key

    with world.app.app_context():
        return {"key_id": create_api_key(f"authz-fresh-{next(_ids)}")[0].id}


def new_api_key_body(world) -> dict:
    return {"body": {"name": f"authz-new-key-{next(_ids)}", "client": "authz-front"}}


ADMIN_FORM = {**{role: LOGIN for role in ROLES}, "admin": 303}  # a form that redirects back to its page


# ---------------------------------------------------------------------------- checks of successful cells

def lists_only_own(world, role: str, resp, objs: dict) -> None:
    ids = {c["id"] for c in resp.get_json()["conversations"]}
    assert (objs["conversation_id"] in ids) == (role == "owner"), (role, ids)


def session_identity(world, role: str, resp, objs: dict) -> None:
    data = resp.get_json()
    assert data["is_admin"] is (role == "admin"), role
    assert (data["user_id"] == world.owner_id) == (role == "owner"), role
    assert (data["user_id"] == world.member_id) == (role == "member"), role
    assert data["username"] == {"member": "member", "admin": "root"}.get(role), role


def undo_registration(world, role: str, resp, objs: dict) -> None:
    """The owner and the other user just registered (201, the same user): put them back as they
    were, anonymous with their cookie, for the cells that follow."""
    from webapp.core.extensions import db
    from webapp.core.models import User

    data = resp.get_json()
    assert data["signed_in"] is True and data["username"].startswith("authz-user-"), (role, data)
    if role in ("owner", "other"):
        assert data["user_id"] == (world.owner_id if role == "owner" else world.other_id), role
        with world.app.app_context():
            user = db.session.get(User, data["user_id"])
            user.username = user.password_hash = None
            user.anon_id = f"authz-{role}-cookie-id"
            db.session.commit()


def generation_bumped(world, role: str, resp, objs: dict) -> None:
    from webapp.core.extensions import db
    from webapp.core.models import User

    assert resp.get_json() == {"user_id": objs["user_id"], "username": resp.get_json()["username"], "signed_out": True}
    with world.app.app_context():
        assert db.session.get(User, objs["user_id"]).session_generation == 1, role


def redirects_to(path: str) -> Callable:
    def check(world, role: str, resp, objs: dict) -> None:
        if 300 <= resp.status_code < 400:
            assert resp.location.split("?")[0].endswith(path), (role, resp.location)
    return check


# ---------------------------------------------------------------------------- the matrix

@dataclass
class Row:
    expect: dict  # role -> status code, or LOGIN
    setup: Callable | None = None  # world -> path values (and optionally "body"), fresh for every cell
    body: dict | None = None
    form: dict | None = None
    query: str = ""
    path: dict = field(default_factory=dict)  # fixed path values
    check: Callable | None = None  # extra check of a successful response


MATRIX: dict[tuple[str, str], Row] = {
    # ---- public
    ("GET", "/"): Row(everyone(200)),
    ("GET", "/static/<path:filename>"): Row(everyone(200), path={"filename": "css/app.css"}),
    ("GET", "/api/health"): Row(everyone(200)),
    ("GET", "/api/session"): Row(everyone(200), check=session_identity),
    ("GET", "/admin/login"): Row({"anonymous": 200, "other": 200, "owner": 200, "member": 200, "admin": 302},
                                 check=redirects_to("/admin/")),
    ("POST", "/admin/login"): Row({"anonymous": 401, "other": 401, "owner": 401, "member": 401, "admin": 302},
                                  form={"username": "root", "password": "wrong password"},
                                  check=redirects_to("/admin/")),
    ("POST", "/admin/logout"): Row(everyone(302), check=redirects_to("/admin/login")),
    # ---- end-user accounts: anyone may register (once: a signed-in caller is told to sign out
    # first), sign in to an account whose password they know, and sign out
    ("POST", "/api/account/register"): Row({"anonymous": 201, "other": 201, "owner": 201, "member": 409,
                                            "admin": 409}, setup=new_account_body, check=undo_registration),
    ("POST", "/api/account/login"): Row(everyone(200), body={"username": "member", "password": MEMBER_PASSWORD}),
    ("POST", "/api/account/logout"): Row(everyone(200)),
    # a new password: only for the signed-in end user (an admin's is set with create-admin)
    ("POST", "/api/account/password"): Row({"anonymous": 401, "other": 401, "owner": 401, "member": 200, "admin": 403},
                                           body={"password": MEMBER_PASSWORD, "new_password": MEMBER_PASSWORD}),
    # ---- chat: a caller's own list, and their own objects only
    ("GET", "/api/conversations"): Row(everyone(200), setup=chat_objects, check=lists_only_own),
    ("POST", "/api/conversations"): Row(everyone(201), body={"title": "mine"}),
    ("GET", "/api/conversations/<int:conversation_id>"): Row(owner_only(200), setup=chat_objects),
    ("PATCH", "/api/conversations/<int:conversation_id>"): Row(owner_only(200), setup=chat_objects,
                                                               body={"title": "renamed"}),
    ("DELETE", "/api/conversations/<int:conversation_id>"): Row(owner_only(200), setup=chat_objects),
    ("POST", "/api/conversations/<int:conversation_id>/messages"): Row(
        owner_only(201), setup=chat_objects, body={"content": "And pasta?", "stream": False}),
    ("POST", "/api/conversations/<int:conversation_id>/compare"): Row(owner_only(201), setup=chat_objects,
                                                                      body={"content": "And pasta?"}),
    ("POST", "/api/messages/<int:message_id>/regenerate"): Row(owner_only(201), setup=chat_objects,
                                                               body={"stream": False}),
    ("POST", "/api/messages/<int:message_id>/edit"): Row(owner_only(201), setup=chat_question,
                                                         body={"content": "And pasta?", "stream": False}),
    ("POST", "/api/messages/<int:message_id>/feedback"): Row(owner_only(200), setup=chat_objects,
                                                             body={"thumb": "down", "comment": "rude"}),
    ("POST", "/api/messages/<int:message_id>/flag"): Row(owner_only(200), setup=chat_objects,
                                                         body={"category": "harassment", "note": "insulting"}),
    ("DELETE", "/api/messages/<int:message_id>/flag"): Row(owner_only(200), setup=flagged_answer),
    ("POST", "/api/pairs/<int:pair_id>/vote"): Row(owner_only(200), setup=chat_objects, body={"winner": "b"}),
    # ---- admin JSON API
    ("GET", "/api/admin/metrics"): Row(admin_api(200)),
    ("GET", "/api/admin/experiments"): Row(admin_api(200)),
    ("POST", "/api/admin/experiments"): Row(admin_api(201), setup=new_experiment_body),
    ("PATCH", "/api/admin/experiments/<key>"): Row(admin_api(200), setup=draft_experiment,
                                                   body={"traffic_split": 0.25}),
    ("POST", "/api/admin/experiments/<key>/start"): Row(admin_api(200), setup=startable_draft),
    ("POST", "/api/admin/experiments/<key>/stop"): Row(admin_api(200), setup=draft_experiment),
    ("POST", "/api/admin/experiments/<key>/conclude"): Row(admin_api(200), setup=draft_experiment,
                                                           body={"decision": "keep_control"}),
    ("GET", "/api/admin/versions"): Row(admin_api(200)),
    ("POST", "/api/admin/versions/<int:version_id>/promote"): Row(admin_api(200), setup=candidate_version),
    ("POST", "/api/admin/versions/<int:version_id>/rollback"): Row(admin_api(200),
                                                                   setup=active_version_with_parent),
    ("GET", "/api/admin/runs"): Row(admin_api(200)),
    ("POST", "/api/admin/runs"): Row(admin_api(202), body={"algorithm": "dpo"}),
    ("GET", "/api/admin/runs/<int:run_id>"): Row(admin_api(200), setup=training_run),
    ("GET", "/api/admin/runs/<int:run_id>/curves"): Row(admin_api(200), setup=training_run),
    ("GET", "/api/admin/feedback"): Row(admin_api(200), query="thumb=up"),
    ("GET", "/api/admin/export"): Row(admin_api(200), query="format=pairs"),
    ("GET", "/api/admin/audit"): Row(admin_api(200)),
    ("POST", "/api/admin/users/<int:user_id>/sign-out"): Row(admin_api(200), setup=fresh_account,
                                                             check=generation_bumped),
    ("GET", "/api/admin/raters"): Row(admin_api(200), query="status=quarantined&sort=share"),
    ("POST", "/api/admin/raters/<int:user_id>/trust"): Row(admin_api(200), setup=fresh_rater,
                                                          body={"trust": "quarantined", "note": "authz"}),
    # ---- admin pages
    ("GET", "/admin/"): Row(ADMIN_PAGE),
    ("GET", "/admin/experiments"): Row(ADMIN_PAGE),
    ("GET", "/admin/experiments/<key>"): Row(ADMIN_PAGE, setup=draft_experiment),
    ("GET", "/admin/experiment"): Row(ADMIN_PAGE),
    ("GET", "/admin/runs"): Row(ADMIN_PAGE),
    ("GET", "/admin/runs/<int:run_id>"): Row(ADMIN_PAGE, setup=training_run),
    ("GET", "/admin/versions"): Row(ADMIN_PAGE),
    ("GET", "/admin/settings"): Row(ADMIN_PAGE),
    ("GET", "/admin/feedback"): Row(ADMIN_PAGE, query="thumb=up"),
    ("GET", "/admin/raters"): Row(ADMIN_PAGE),
    ("GET", "/admin/safety/"): Row(ADMIN_PAGE),
    ("POST", "/admin/safety/rules"): Row(ADMIN_FORM, form={"kind": "phrase", "value": "authz blocked words"}),
    ("POST", "/admin/safety/rules/<int:rule_id>/toggle"): Row(ADMIN_FORM, setup=rail_rule, form={}),
    ("POST", "/admin/safety/rules/<int:rule_id>/delete"): Row(ADMIN_FORM, setup=rail_rule, form={}),
    ("POST", "/admin/safety/presets/<name>"): Row(ADMIN_FORM, path={"name": "email"}, form={"enabled": "0"}),
    # ---- API keys (admin) and the /v1 API (bearer keys)
    ("GET", "/admin/api-keys"): Row(ADMIN_PAGE),
    ("POST", "/admin/api-keys"): Row({**ADMIN_FORM, "admin": 200}, form={"name": "authz-form-key"}),
    ("POST", "/admin/api-keys/<int:key_id>/revoke"): Row(ADMIN_FORM, setup=fresh_api_key, form={}),
    ("GET", "/api/admin/api-keys"): Row(admin_api(200)),
    ("POST", "/api/admin/api-keys"): Row(admin_api(201), setup=new_api_key_body),
    ("POST", "/api/admin/api-keys/<int:key_id>/revoke"): Row(admin_api(200), setup=fresh_api_key),
    ("GET", "/v1/models"): Row(keys_only(200, 200)),
    ("GET", "/v1/models/<path:model_id>"): Row(keys_only(200, 200), path={"model_id": "rlhf-chat"}),
    ("POST", "/v1/chat/completions"): Row(keys_only(200, 200), body={
        "model": "rlhf-chat", "user": "authz-person", "messages": [{"role": "user", "content": "And pasta?"}]}),
    ("POST", "/v1/feedback"): Row(keys_only(200, 404), setup=api_completion),
}

CONVERTER = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")


def app_routes(app) -> set[tuple[str, str]]:
    return {(method, rule.rule) for rule in app.url_map.iter_rules()
            for method in rule.methods - {"HEAD", "OPTIONS"}}


# ---------------------------------------------------------------------------- the world

def _csrf_from_login_page(client) -> str:
    page = client.get("/admin/login").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


@pytest.fixture(scope="module")
def world(tmp_path_factory, micro_model_dir, request):
    """One app for the module: the micro model as the active version, an admin, a chat user who
    owns the objects under test, another chat user, an end user with an account (signed in), and a
    concluded experiment (for the metrics and experiment pages). Starting a training run is
    stubbed (no child process)."""
    from webapp.admin.auth import set_admin_password
    from webapp.core.extensions import db
    from webapp.core.models import Experiment, ModelVersion, User

    with route_sweep_app(tmp_path_factory, request, "authz", micro_model_dir) as app:
        register_model(app, micro_model_dir, name="v2-ppo", status="retired")
        with app.app_context():
            set_admin_password("root", ADMIN_PASSWORD)
            owner, other = User(anon_id="authz-owner-cookie-id"), User(anon_id="authz-other-cookie-id")
            db.session.add_all([owner, other, Experiment(key="seed", control_version_id=1, variant_version_id=2,
                                                         status="concluded", decision="keep_control")])
            db.session.commit()
            owner_id, other_id = owner.id, other.id
            model_path = db.session.get(ModelVersion, 1).path
        member = app.test_client()
        token = member.get("/api/session").get_json()["csrf_token"]
        signed = member.post("/api/account/register", json={"username": "member", "password": MEMBER_PASSWORD},
                             headers={"X-CSRFToken": token})
        assert signed.status_code == 201, signed.get_data(as_text=True)
        from webapp.openai_api.keys import create_api_key, revoke_api_key

        with app.app_context():
            admin_id = db.session.scalars(db.select(User).filter_by(username="root")).one().id
            made = {role: create_api_key(f"authz-{role}", "authz-front") for role in KEY_ROLES}
            revoke_api_key(made["revoked_key"][0])
            keys = {role: key for role, (_, key) in made.items()}
            key_ids = {role: row.id for role, (row, _) in made.items()}
        world = SimpleNamespace(app=app, owner_id=owner_id, other_id=other_id, model_path=model_path,
                                admin_id=admin_id, member_id=signed.get_json()["user_id"], sessions={},
                                keys=keys, key_ids=key_ids)
        yield world


def _sign_in(world, role: str) -> dict:
    """A new signed-in session of the admin or the member (their cookie's content)."""
    client = world.app.test_client()
    if role == "admin":
        resp = client.post("/admin/login", data={"username": "root", "password": ADMIN_PASSWORD,
                                                 "csrf_token": _csrf_from_login_page(client)})
        assert resp.status_code == 302, resp.status_code
    else:
        token = client.get("/api/session").get_json()["csrf_token"]
        resp = client.post("/api/account/login", json={"username": "member", "password": MEMBER_PASSWORD},
                           headers={"X-CSRFToken": token})
        assert resp.status_code == 200, resp.get_data(as_text=True)
    with client.session_transaction() as sess:
        return dict(sess)


def signed_in_session(world, role: str) -> dict:
    """The admin's or the member's session, signed in again when a cell ended it (a logout, a
    password change)."""
    from webapp.core.extensions import db
    from webapp.core.models import User
    from webapp.core.signin import GENERATION

    with world.app.app_context():
        generation = db.session.get(User, world.admin_id if role == "admin" else world.member_id).session_generation
    if world.sessions.get(role, {}).get(GENERATION) != generation:
        world.sessions[role] = _sign_in(world, role)
    return world.sessions[role]


def roles_of(rule: str) -> tuple[str, ...]:
    return ROLES + (KEY_ROLES if rule.startswith("/v1/") else ("key",))


def expected_of(row: Row, role: str):
    return row.expect[role] if role in row.expect else row.expect["anonymous"]  # a key opens nothing outside /v1


def client_as(world, role: str):
    """A fresh client acting as ``role`` and its CSRF token (fresh, so a logout in one cell
    cannot affect another). A key role is a client without a cookie of its own that sends the key."""
    client = world.app.test_client()
    with client.session_transaction() as sess:
        if role in ("admin", "member"):
            sess.update(signed_in_session(world, role))
        elif role in ("owner", "other"):
            sess["anon_id"] = "authz-owner-cookie-id" if role == "owner" else "authz-other-cookie-id"
    if role in ("admin", "member"):
        token = client.get("/api/session").get_json()["csrf_token"]
    else:
        token = _csrf_from_login_page(client)
    if role in KEY_ROLES:
        client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {world.keys[role]}"
    return client, token


def snapshot(world) -> dict[str, set]:
    from webapp.core.extensions import db

    with world.app.app_context():
        with db.engine.connect() as conn:
            return {name: set(map(repr, conn.execute(sa.text(f'SELECT * FROM "{name}"'))))
                    for name in sa.inspect(conn).get_table_names()}


def assert_unchanged(before: dict, after: dict, role: str, where: str) -> None:
    for table in before.keys() | after.keys():
        old, new = before.get(table, set()), after.get(table, set())
        if table in ("users", "identity_origins") and role in ("anonymous", "key") and " /v1/" not in where:
            # a first-time visitor is recorded as a user (with where it came from), nothing else may change
            assert old <= new and len(new - old) <= 1, f"{where}: {table} changed"
            continue
        if table == "signin_failures" and where.endswith(" POST /admin/login"):
            # a failed admin sign-in is recorded (name tried, address) for the overview: one row, or its count
            assert len(new - old) <= 1 and len(old - new) <= 1, f"{where}: {table} changed"
            continue
        assert old == new, f"{where}: a denied request changed table {table}"


# ---------------------------------------------------------------------------- tests

def test_every_route_is_classified(world):
    routes = app_routes(world.app)
    missing = routes - set(MATRIX)
    assert not missing, f"route(s) without an authorization row in MATRIX: {sorted(missing)}"
    stale = set(MATRIX) - routes
    assert not stale, f"MATRIX rows for routes the app no longer has: {sorted(stale)}"
    for (_, rule), row in MATRIX.items():
        assert set(row.expect) == set(ROLES + KEY_ROLES if rule.startswith("/v1/") else ROLES), rule


@pytest.mark.parametrize("route", sorted(MATRIX), ids=lambda r: f"{r[0]} {r[1]}")
def test_authorization(world, route):
    method, rule = route
    row = MATRIX[route]
    for role in roles_of(rule):
        objs = row.setup(world) if row.setup else {}
        body = objs.pop("body", row.body)
        path = CONVERTER.sub(lambda m: str({**row.path, **objs}[m.group(2)]), rule)
        client, token = client_as(world, role)
        where = f"{role}: {method} {path}"
        before = snapshot(world)
        if row.form is not None:
            resp = client.open(path, method=method, data={**row.form, "csrf_token": token})
        else:
            resp = client.open(path, method=method, query_string=row.query, json=body,
                               headers={"X-CSRFToken": token})
        expected = expected_of(row, role)
        if expected == LOGIN:
            assert resp.status_code == 302, f"{where}: {resp.status_code}"
            assert resp.location.split("?")[0].endswith("/admin/login"), f"{where}: {resp.location}"
            assert_unchanged(before, snapshot(world), role, where)
            continue
        assert resp.status_code == expected, f"{where}: {resp.status_code} {resp.get_data(as_text=True)[:300]}"
        if path.startswith("/api/") and resp.status_code >= 400:
            assert resp.is_json, f"{where}: not JSON"
            error = resp.get_json()["error"]
            assert error, where
            if resp.status_code == 404:
                assert "not found" in error.lower(), f"{where}: {error}"
        if path.startswith("/v1/") and resp.status_code >= 400:  # OpenAI's error shape
            error = resp.get_json()["error"]
            assert error["message"] and error["type"], where
            if resp.status_code == 401:
                assert error["code"] in ("invalid_api_key", "api_key_revoked"), f"{where}: {error}"
        if resp.status_code >= 400:
            assert_unchanged(before, snapshot(world), role, where)
        elif row.check is not None:
            row.check(world, role, resp, objs)


def test_ids_in_bodies_are_scoped_to_the_caller(world):
    """Ids inside request bodies are checked like ids in paths: another user's message cannot be
    replied to (parent_id) or compared again (message_id) from one's own conversation."""
    from webapp.core.extensions import db
    from webapp.core.models import Conversation

    theirs = chat_objects(world)  # the owner's objects; the caller below is the other user
    with world.app.app_context():
        conv = Conversation(user_id=world.other_id, title="other's chat")
        db.session.add(conv)
        db.session.commit()
        own_conv = conv.id
    client, token = client_as(world, "other")
    question = theirs["message_id"] - 1  # the owner's question (the answers follow it)
    for url, body in ((f"/api/conversations/{own_conv}/messages",
                       {"content": "hi", "stream": False, "parent_id": theirs["message_id"]}),
                      (f"/api/conversations/{own_conv}/compare", {"content": "hi", "parent_id": theirs["message_id"]}),
                      (f"/api/conversations/{own_conv}/compare", {"message_id": question})):
        before = snapshot(world)
        resp = client.post(url, json=body, headers={"X-CSRFToken": token})
        assert resp.status_code == 404, (url, body, resp.status_code)
        assert "not found" in resp.get_json()["error"].lower(), (url, body)
        assert_unchanged(before, snapshot(world), "other", url)
