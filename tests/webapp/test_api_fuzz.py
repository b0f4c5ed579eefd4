"""Property-based fuzzing of every JSON API route (hypothesis).

Every ``/api`` and ``/v1`` route in ``app.url_map`` gets random requests: JSON bodies of any shape and
type (huge strings, NUL, lone surrogates, huge numbers, deep nesting), invalid UTF-8 and
non-JSON bodies, wrong content types, random ids and keys in the URL (negative, huge,
non-numeric, percent-encoded junk), random query strings, a missing or wrong CSRF token and
now and then a wrong HTTP method. A fixed list of edge cases (``edge_cases``) runs first on
top of otherwise valid requests, so the rare values are tried on every run, not only when
chance draws them. The properties:

* never a 5xx;
* a rejected request (4xx) answers JSON ``{"error": "<clear message>"}`` (webapp/errors.py); under
  /v1 OpenAI's ``{"error": {"message", "type", "param", "code"}}``;
* a rejected request leaves the database exactly as it was (every table, every row);
* a state change without the CSRF token is a 400 that names CSRF (/v1 takes bearer keys, no CSRF);
* an accepted request answers JSON (or the documented SSE stream / NDJSON export).

The /v1 routes are called with an API key (``Authorization: Bearer``).

The routes come from ``app.url_map``: ``test_every_api_route_is_fuzzed`` fails when a route
exists that the table below does not know. The number of requests that ran is printed at the
end of the module (``FUZZ_EXAMPLES=<n>`` sets the random examples per route; default 25).
"""
from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from types import SimpleNamespace
from urllib.parse import quote, quote_from_bytes

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf.data.criteria import FLAG_VALUES
from tests.support.app import ApiClient, register_model, route_sweep_app
from webapp.core.ratings.reasons import REASONS

EXAMPLES_PER_ROUTE = int(os.environ.get("FUZZ_EXAMPLES", "25"))
STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]
ADMIN_PASSWORD = "fuzz-admin-pass"

# ---------------------------------------------------------------------------- value strategies

ANY_CHAR = st.characters(exclude_categories=())  # includes lone surrogates and control characters
SPECIAL_STRINGS = st.sampled_from([
    "", " ", "\x00", "a\x00b", "\ud800", "x\udfffy", "\ufeff", "\u202e", "🙂" * 3, "\r\n", "%00", "../..",
    "' OR 1=1 --", "<script>alert(1)</script>", "null", "1", "-1", "1e309", "NaN", "up", "a" * 300,
])


def _repeat(args):
    chunk, n = args
    return (chunk or "x") * n


HUGE_STRINGS = st.tuples(st.sampled_from(["a", "é", "🙂", " ", "\x00", "\ud800", "ab c"]),
                         st.integers(1_000, 20_000)).map(_repeat)
TEXT = st.one_of(st.text(ANY_CHAR, max_size=40), SPECIAL_STRINGS, HUGE_STRINGS)
NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, -2**63 - 1, 2**64, 10**30, -10**30,
                                     0.5, 1e308, -0.0]))
JSON_SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(ANY_CHAR, max_size=12), inner, max_size=4)), max_leaves=12)
IDS = st.one_of(st.integers(1, 12), st.integers(), st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64, 10**40]))

# Plausible values per body field (mixed with arbitrary JSON below), so requests get past the
# "unknown field" check and reach the deeper validation.
FIELD_VALUES = {
    "content": TEXT, "title": TEXT, "correction": TEXT, "comment": TEXT,
    "stream": st.booleans(), "start": st.booleans(),
    "parent_id": IDS, "message_id": IDS, "control_version_id": IDS, "variant_version_id": IDS,
    "max_steps": IDS,
    "thumb": st.sampled_from(["up", "down", None]),
    "rating": st.one_of(st.none(), st.integers(-2, 8)),
    "reasons": st.one_of(st.none(), st.lists(st.one_of(st.sampled_from(REASONS), TEXT), max_size=4)),
    "winner": st.sampled_from(["a", "b", "tie", "both_bad"]),
    "key": st.one_of(st.from_regex(r"\A[a-z0-9][a-z0-9_-]{0,70}\Z"), TEXT),
    "traffic_split": st.one_of(st.floats(-1, 2), NUMBERS),
    "decision": st.sampled_from(["promote", "keep_control", "maybe"]),
    "algorithm": st.sampled_from(["ppo", "dpo", "kto", "rloo", "sgd"]),
    "username": st.one_of(st.from_regex(r"\A[a-z0-9][a-z0-9._-]{2,31}\Z"), TEXT),
    "password": st.one_of(st.sampled_from(["fuzz-password", "short", "x" * 201]), TEXT),
    "new_password": st.one_of(st.sampled_from(["changer-password", "short", "x" * 201]), TEXT),
    "trust": st.sampled_from(["auto", "trusted", "quarantined", "maybe"]), "note": TEXT,
    "category": st.one_of(st.sampled_from(FLAG_VALUES), st.sampled_from(["spam", "HATE", ""])),
    # the /v1 API and API keys
    "model": st.one_of(st.just("rlhf-chat"), TEXT),
    "messages": st.one_of(
        st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
                                        "content": st.one_of(TEXT, st.lists(st.fixed_dictionaries(
                                            {"type": st.sampled_from(["text", "image_url"]), "text": TEXT}),
                                            max_size=3))}), max_size=4),
        JSON_VALUES),
    "max_tokens": st.one_of(st.none(), NUMBERS), "max_completion_tokens": st.one_of(st.none(), NUMBERS),
    "temperature": st.one_of(st.none(), st.floats(-1, 3), NUMBERS), "top_p": st.one_of(st.none(), NUMBERS),
    "stop": st.one_of(st.none(), TEXT, st.lists(TEXT, max_size=6)), "seed": st.one_of(st.none(), NUMBERS),
    "n": st.one_of(st.none(), st.integers(-1, 3)),
    "user": st.one_of(st.none(), TEXT, st.fixed_dictionaries({"id": TEXT, "name": TEXT})),
    "safety_identifier": st.one_of(st.none(), TEXT),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries({"include_usage": JSON_SCALARS})),
    "completion_id": st.one_of(st.just("chatcmpl-fuzz-seeded"), TEXT),
    "flag": st.one_of(st.none(), st.fixed_dictionaries({"category": st.sampled_from([*FLAG_VALUES, "spam"])},
                                                       optional={"note": TEXT})),
    "name": st.one_of(st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,79}\Z"), TEXT),
    "client": st.one_of(st.none(), st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,79}\Z"), TEXT),
    "forwards_user_headers": st.booleans(),
    "rate_limit": st.one_of(st.none(), st.sampled_from(["10 per minute", "1/second; 100/day", "lots"]), TEXT),
}
QUERY_VALUES = {
    "experiment": st.one_of(st.sampled_from(["exp-draft", "exp-run"]), TEXT),
    "format": st.sampled_from(["pairs", "kto", "sft", "raw", "csv", ""]),
    "thumb": st.sampled_from(["up", "down", "sideways", ""]),
    "rating": st.sampled_from(["1", "5", "0", "9", "x", "", "²", "٣", "-1"]),
    "arm": st.sampled_from(["control", "variant", "both"]),
    "version": st.one_of(st.sampled_from(["v1-base", "v2-ppo"]), TEXT),
    "has_correction": st.sampled_from(["1", "true", "no", ""]),
    "flag": st.sampled_from(["any", *FLAG_VALUES, "spam", ""]),
    "status": st.sampled_from(["trusted", "normal", "new", "quarantined", "unassessed", "odd", ""]),
    "trust": st.sampled_from(["auto", "trusted", "quarantined", "maybe", ""]),
    "min_events": st.sampled_from(["0", "1", "5", "-1", "x", "²", "1" * 30, ""]),
    "sort": st.sampled_from(["events", "share", "agreement", "weight", "status", "assessed", "age", "id", "x", ""]),
    "order": st.sampled_from(["asc", "desc", "up", ""]),
    "q": TEXT, "page": st.one_of(st.sampled_from(["1", "2", "0", "-1", "x", "²", "١", "1" * 30]),
                                st.integers(-5, 2**70).map(str)),
}

# ---------------------------------------------------------------------------- the route table

# endpoint -> who calls it (the owner of the seeded chat data, or the admin), its body fields
# with a valid body to start from, and its query parameters. Every /api endpoint of
# app.url_map must be here (test_every_api_route_is_fuzzed).
ROUTES: dict[str, dict] = {
    "session_api.get_session": {"caller": "owner"},
    "session_api.health": {"caller": "owner"},
    "chat_api.create_conversation": {"caller": "owner", "base": {"title": "t"}},
    "chat_api.list_conversations": {"caller": "owner"},
    "chat_api.get_conversation": {"caller": "owner"},
    "chat_api.rename_conversation": {"caller": "owner", "base": {"title": "t"}},
    "chat_api.delete_conversation": {"caller": "owner"},
    "chat_api.post_message": {"caller": "owner", "base": {"content": "hi", "stream": False},
                              "fields": ["parent_id"]},
    "chat_api.regenerate": {"caller": "owner", "base": {"stream": False}},
    "chat_api.edit_message": {"caller": "owner", "base": {"content": "hi", "stream": False}},
    "chat_api.post_feedback": {"caller": "owner", "base": {"thumb": "up"},
                               "fields": ["rating", "correction", "comment", "reasons"]},
    "chat_api.post_flag": {"caller": "owner", "base": {"category": "harassment"}, "fields": ["note"]},
    "chat_api.delete_flag": {"caller": "owner"},
    "chat_api.compare": {"caller": "owner", "base": {"content": "hi"}, "fields": ["parent_id", "message_id"]},
    "chat_api.vote": {"caller": "owner", "base": {"winner": "a"}},
    "admin_api.metrics": {"caller": "admin", "query": ["experiment"]},
    "admin_api.list_experiments": {"caller": "admin"},
    "admin_api.post_experiment": {"caller": "admin", "base": {"key": "fuzz-new", "control_version_id": 1,
                                                              "variant_version_id": 2, "start": False},
                                  "fields": ["traffic_split"]},
    "admin_api.patch_experiment": {"caller": "admin", "base": {"traffic_split": 0.3}},
    "admin_api.post_start": {"caller": "admin"},
    "admin_api.post_stop": {"caller": "admin"},
    "admin_api.post_conclude": {"caller": "admin", "base": {"decision": "keep_control"}},
    "admin_api.list_versions": {"caller": "admin"},
    "admin_api.post_promote": {"caller": "admin"},
    "admin_api.post_rollback": {"caller": "admin"},
    "admin_api.list_runs": {"caller": "admin"},
    "admin_api.get_run": {"caller": "admin"},
    "admin_api.get_run_curves": {"caller": "admin"},
    "admin_api.start_run": {"caller": "admin", "base": {"algorithm": "ppo"}, "fields": ["max_steps"]},
    "admin_api.browse_feedback": {"caller": "admin",
                                  "query": ["thumb", "rating", "version", "arm", "has_correction", "flag", "q",
                                            "page"]},
    "admin_api.export": {"caller": "admin", "query": ["format"]},
    "admin_api.audit_log": {"caller": "admin"},
    "admin_api.list_raters": {"caller": "admin",
                              "query": ["status", "trust", "q", "min_events", "sort", "order", "page"]},
    "admin_api.post_rater_trust": {"caller": "admin", "base": {"trust": "quarantined", "note": "fuzz"}},
    # accounts: a visitor of their own (registering, signing in and out changes who the caller is)
    "account_api.register": {"caller": "visitor", "base": {"username": "fuzzer", "password": "fuzz-password"}},
    "account_api.login": {"caller": "visitor", "base": {"username": "member", "password": "member-password"}},
    "account_api.logout": {"caller": "visitor"},
    # a signed-in end user of their own (a new password ends their other sessions, not this one)
    "account_api.change_password": {"caller": "changer", "base": {"password": "changer-password",
                                                                  "new_password": "changer-password"}},
    "admin_api.post_user_sign_out": {"caller": "admin"},
    # API keys (admin JSON)
    "api_keys.list_keys": {"caller": "admin"},
    "api_keys.create_key": {"caller": "admin", "base": {"name": "fuzz-key"},
                            "fields": ["client", "forwards_user_headers", "rate_limit"]},
    "api_keys.revoke_key": {"caller": "admin"},
    # the /v1 API: a front end's key (rated: its own completion, seeded)
    "v1_api.list_models": {"caller": "apikey"},
    "v1_api.get_model": {"caller": "apikey"},
    "v1_api.chat_completions": {"caller": "apikey",
                                "base": {"model": "rlhf-chat", "messages": [{"role": "user", "content": "hi"}],
                                         "stream": False},
                                "fields": ["max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
                                           "seed", "n", "user", "safety_identifier", "stream_options"]},
    "v1_api.post_feedback": {"caller": "apikey", "base": {"completion_id": "chatcmpl-fuzz-seeded", "thumb": "up"},
                             "fields": ["rating", "correction", "comment", "reasons", "flag", "user"]},
}


def fields_of(spec: dict) -> list[str]:
    return list(spec.get("base", {})) + spec.get("fields", [])


RUN_COUNTS: Counter = Counter()

# ---------------------------------------------------------------------------- request strategies


def _enc(text: str) -> str:
    return quote(text, safe="", errors="surrogatepass")


URL_TEXT = st.one_of(st.text(ANY_CHAR, min_size=1, max_size=30).map(_enc), SPECIAL_STRINGS.filter(bool).map(_enc),
                     st.binary(min_size=1, max_size=20).map(lambda b: quote_from_bytes(b, safe="")))
INT_SEGMENTS = st.one_of(st.integers(1, 12).map(str), IDS.map(str), URL_TEXT,
                         st.sampled_from(["0", "007", "-3", "1.5", "1e3", "0x1f", "%31", "%EF%BC%91", "٣", " 1"]))
KEY_SEGMENTS = st.one_of(st.sampled_from(["exp-draft", "exp-run", "exp-stopped"]),
                         st.from_regex(r"\A[a-z0-9][a-z0-9_-]{0,70}\Z"), URL_TEXT)
CONVERTER = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")


def fill(rule: str, values: dict[str, str]) -> str:
    """The rule's path with its variables replaced (``values`` by variable name)."""
    return CONVERTER.sub(lambda m: values[m.group(2)], rule)


@st.composite
def paths(draw, rule: str, valid: dict[str, str]) -> str:
    """The seeded objects' path half of the time, else random ids and keys."""
    if draw(st.booleans()):
        return fill(rule, valid)
    return CONVERTER.sub(lambda m: draw(INT_SEGMENTS if m.group(1) == "int" else KEY_SEGMENTS), rule)


@st.composite
def query_strings(draw, known: list[str]) -> str:
    names = st.sampled_from(known) if known else st.nothing()
    pairs = draw(st.lists(st.one_of(
        names.flatmap(lambda k: st.tuples(st.just(k), QUERY_VALUES[k])),
        st.tuples(st.text(ANY_CHAR, max_size=10), TEXT)), max_size=4))
    parts = [f"{_enc(k)}={_enc(v[:3000])}" for k, v in pairs]
    if draw(st.integers(0, 9)) == 0:
        parts.append(draw(st.sampled_from(["%ff=%fe", "a=%", "=&&=", "page", "q=%00", "x" * 5000])))
    return "&".join(parts)


def _json_bytes(value, ascii_only: bool = True) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


CONTENT_TYPES = st.one_of(
    st.just("application/json"),
    st.sampled_from(["application/json", "application/json; charset=utf-8", "application/json; charset=latin-1",
                     "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=zz",
                     "multipart/form-data", "application/octet-stream", "application/vnd.api+json", "",
                     "text/html; charset=\x7f", None]))


@st.composite
def bodies(draw, spec: dict) -> tuple[bytes | None, str | None]:
    """(raw body, Content-Type)."""
    kind = draw(st.sampled_from(["fields", "fields", "fields", "json", "raw", "empty", "deep", "form"]))
    if kind == "fields":  # a valid body (or none) with some fields set to plausible or arbitrary values
        value = dict(spec.get("base", {})) if draw(st.booleans()) else {}
        field_values = {f: st.one_of(FIELD_VALUES[f], JSON_VALUES) for f in fields_of(spec)}
        value.update(draw(st.fixed_dictionaries({}, optional=field_values)))
        if draw(st.integers(0, 7)) == 0:
            value[draw(st.text(ANY_CHAR, max_size=8))] = draw(JSON_VALUES)
        body = _json_bytes(value, draw(st.booleans()))
    elif kind == "json":
        body = _json_bytes(draw(JSON_VALUES), draw(st.booleans()))
    elif kind == "raw":
        body = draw(st.one_of(st.binary(max_size=200),
                              st.sampled_from([b"{", b"\xff\xfe{}", b'{"content": "\xff"}', b"\x00", b"null",
                                               b'{"a": NaN}', b"[1, 2", b"1" * 5000, b'"' + b"\\" * 9 + b'"'])))
    elif kind == "deep":
        n = draw(st.integers(100, 200_000))
        body = draw(st.sampled_from([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n, b"[" * n]))
    elif kind == "form":
        body = f"content={_enc(draw(TEXT)[:200])}&csrf_token=x".encode()
    else:
        body = None
    return body, draw(CONTENT_TYPES)


def method_of(rule) -> str:
    (method,) = rule.methods - {"HEAD", "OPTIONS"}
    return method


@st.composite
def requests(draw, rule, spec: dict, valid: dict[str, str]) -> dict:
    method = method_of(rule)
    if draw(st.integers(0, 14)) == 0:
        method = draw(st.sampled_from(ANY_METHOD))
    body, content_type = draw(bodies(spec))
    return {"method": method, "path": draw(paths(rule.rule, valid)),
            "query": draw(query_strings(spec.get("query", []))), "body": body, "content_type": content_type,
            "csrf": draw(st.sampled_from(["valid"] * 8 + ["missing", "garbage"]))}


# Systematic edge cases: every field of every route set to each of these (on top of a valid
# body), every id in the path replaced by each segment, every query parameter set to each value.
EDGE_VALUES = [None, True, 0, -1, 1.5, 2**63, -2**63 - 1, 10**30, float("nan"), "", " ", "\x00", "\ud800", "🙂",
               "x" * 100_000, [], ["\ud800", "x" * 5000], {"a": None}]
EDGE_SEGMENTS = ["0", "-1", "9223372036854775807", "9223372036854775808", "1" * 40, "abc", "%ff", "%ED%A0%80",
                 "%2F", "1.5", "%D9%A3"]
EDGE_QUERY = ["", "%00", "%ff", "%ED%A0%80", "%C2%B2", "-1", "0", "1" * 40, "x" * 5000, "%25%5F"]
EDGE_BODIES = [(None, None), (b"", "application/json"), (b"null", "application/json"), (b"[]", "application/json"),
               (b'"x"', "application/json"), (b"{", "application/json"), (b"\xff\xfe", "application/json"),
               (b"[" * 100_000 + b"]" * 100_000, "application/json"), (b'{"a": NaN}', "application/json"),
               (b"{}", "text/plain"), (b"content=hi", "application/x-www-form-urlencoded"),
               (b"--zz--", "multipart/form-data; boundary=zz")]


def edge_cases(rule, spec: dict, valid: dict[str, str]) -> list[dict]:
    method, base = method_of(rule), spec.get("base", {})
    path = fill(rule.rule, valid)

    def case(**changes) -> dict:
        req = {"method": method, "path": path, "query": "", "body": _json_bytes(base) if base else None,
               "content_type": "application/json" if base else None, "csrf": "valid"}
        return req | changes

    cases = [case(csrf="missing"), case(csrf="garbage")]
    cases += [case(method=m) for m in ANY_METHOD if m != method]
    if method in STATE_CHANGING:
        cases += [case(body=body, content_type=ct) for body, ct in EDGE_BODIES]
        cases += [case(body=_json_bytes({**base, name: 1})) for name in ("unknown_field", "x" * 5000)]
        for field in fields_of(spec):
            cases += [case(body=_json_bytes({**base, field: v})) for v in EDGE_VALUES]
    for name in CONVERTER.findall(rule.rule):
        cases += [case(path=fill(rule.rule, {**valid, name[1]: seg})) for seg in EDGE_SEGMENTS]
    for name in spec.get("query", []):
        cases += [case(query=f"{name}={value}") for value in EDGE_QUERY]
    if spec.get("query"):
        cases += [case(query="unknown=1"), case(query="x" * 5000 + "=1")]
    return cases


# ---------------------------------------------------------------------------- the world


def snapshot(world) -> dict[str, list]:
    """Every row of every table (including ones the ORM does not map)."""
    from webapp.core.extensions import db

    with world.app.app_context():
        with db.engine.connect() as conn:
            return {name: sorted(map(repr, conn.execute(sa.text(f'SELECT * FROM "{name}"'))))
                    for name in world.tables}


def admin_client(app):
    client = app.test_client()
    page = client.get("/admin/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    resp = client.post("/admin/login", data={"username": "root", "password": ADMIN_PASSWORD, "csrf_token": token})
    assert resp.status_code == 302, resp.status_code
    return SimpleNamespace(client=client, csrf=client.get("/api/session").get_json()["csrf_token"])


@pytest.fixture(scope="module")
def world(tmp_path_factory, micro_model_dir, request):
    """One app for the whole module, seeded with chat data of two users, versions, experiments
    and a training run. Starting a training run is stubbed (no child process)."""
    from webapp.admin.auth import set_admin_password
    from webapp.core.extensions import db
    from webapp.core.models import Experiment, TrainingRun

    with route_sweep_app(tmp_path_factory, request, "fuzz", micro_model_dir) as app:
        register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
        register_model(app, micro_model_dir, name="v3-ppo", status="candidate")
        with app.app_context():
            set_admin_password("root", ADMIN_PASSWORD)
            db.session.add_all([
                Experiment(key="exp-draft", control_version_id=1, variant_version_id=2, status="draft"),
                Experiment(key="exp-stopped", control_version_id=1, variant_version_id=3, status="stopped"),
                TrainingRun(status="succeeded", algorithm="ppo")])
            db.session.commit()
        users = {}
        for name in ("other", "owner"):  # the owner's rows come second: ids 1..12 hit both users' objects
            user = ApiClient(app.test_client())
            conv = user.post("/api/conversations", json={"title": f"{name}'s chat"}).get_json()["id"]
            answer = user.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?",
                                                                           "stream": False}).get_json()
            user.post(f"/api/messages/{answer['assistant_message']['id']}/feedback", json={"thumb": "up"})
            pair = user.post(f"/api/conversations/{conv}/compare", json={"content": "And pasta?"}).get_json()
            assert pair["pair_id"], pair
            users[name] = user
        # the owner's objects (and the admin's) named in the paths of valid requests
        valid = {"conversation_id": str(conv), "message_id": str(answer["assistant_message"]["id"]),
                 "pair_id": str(pair["pair_id"]), "version_id": "2", "run_id": "1", "key": "exp-draft",
                 "user_id": str(users["other"].user_id)}
        visitor = ApiClient(app.test_client())  # the account routes' caller
        assert visitor.post("/api/account/register", json={"username": "member", "password": "member-password"}
                            ).status_code == 201
        assert visitor.post("/api/account/logout").get_json() == {"signed_out": True}
        visitor = ApiClient(app.test_client())
        changer = ApiClient(app.test_client())  # signed in to an account of its own
        assert changer.post("/api/account/register", json={"username": "changer", "password": "changer-password"}
                            ).status_code == 201
        admin = admin_client(app)
        from webapp.openai_api.keys import create_api_key

        with app.app_context():
            _, key = create_api_key("fuzz-front", forwards_user_headers=True)
            victim = create_api_key("fuzz-victim")[0].id
        apikey = SimpleNamespace(client=app.test_client(), csrf=None, headers={"Authorization": f"Bearer {key}"})
        seeded = apikey.client.post("/v1/chat/completions", headers=apikey.headers, json={
            "model": "rlhf-chat", "user": "fuzzer", "messages": [{"role": "user", "content": "How do I cook rice?"}]})
        assert seeded.status_code == 200, seeded.get_data(as_text=True)
        with app.app_context():  # a fixed id, so that valid feedback bodies can name it
            db.session.execute(sa.text("UPDATE messages SET completion_id = 'chatcmpl-fuzz-seeded' "
                                       "WHERE completion_id = :cid"), {"cid": seeded.get_json()["id"]})
            db.session.commit()
        valid.update(key_id=str(victim), model_id="rlhf-chat")
        with app.app_context():  # a running experiment, so routing, compare and metrics take their A/B paths
            db.session.add(Experiment(key="exp-run", control_version_id=1, variant_version_id=2, status="running"))
            db.session.commit()
        started = time.perf_counter()
        with app.app_context():
            tables = sa.inspect(db.engine).get_table_names()
        yield SimpleNamespace(app=app, owner=users["owner"], other=users["other"], admin=admin, visitor=visitor,
                              changer=changer, apikey=apikey, valid=valid,
                              tables=tables, rules={r.endpoint: r for r in app.url_map.iter_rules()})
        elapsed = time.perf_counter() - started
        random_cases = sum(n for (kind, _), n in RUN_COUNTS.items() if kind == "random")
        edge_cases_run = sum(n for (kind, _), n in RUN_COUNTS.items() if kind == "edge")
        routes = {endpoint for _, endpoint in RUN_COUNTS}
        line = (f"API fuzz: {random_cases + edge_cases_run} requests ({random_cases} random, {edge_cases_run} "
                f"systematic edge cases) over {len(routes)} routes in {elapsed:.1f} s")
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line("\n" + line)
        else:
            print(line)


def _reset(world) -> None:
    """Undo what earlier examples did to the seeded data that later examples need: deleted
    conversations come back (a 404 because an earlier example deleted the target teaches us
    nothing); so do revoked API keys (the caller's key may have been revoked)."""
    from webapp.core.extensions import db

    with world.app.app_context():
        db.session.execute(sa.text("UPDATE conversations SET deleted_at = NULL WHERE deleted_at IS NOT NULL"))
        db.session.execute(sa.text("UPDATE api_keys SET revoked_at = NULL WHERE revoked_at IS NOT NULL"))
        db.session.commit()


def send(world, caller, req: dict):
    headers = dict(getattr(caller, "headers", {}))
    if req["csrf"] == "valid" and caller.csrf:
        headers["X-CSRFToken"] = caller.csrf
    elif req["csrf"] == "garbage":
        headers["X-CSRFToken"] = "not-a-token"
    if req["content_type"] is not None:
        headers["Content-Type"] = req["content_type"]
    resp = caller.client.open(req["path"], method=req["method"], query_string=req["query"], data=req["body"],
                              headers=headers, buffered=True)
    data = resp.get_json(silent=True) if resp.is_json and resp.status_code < 300 else None
    if isinstance(data, dict) and isinstance(data.get("csrf_token"), str):  # signing in starts a new token
        caller.csrf = data["csrf_token"]
    return resp


def check_response(world, endpoint: str, req: dict, resp, before: dict) -> None:
    status = resp.status_code
    where = f"{req['method']} {req['path']}?{req['query'][:200]} -> {status}"
    assert status < 500, f"{where}: {resp.get_data(as_text=True)[:500]}"
    if status == 308:  # werkzeug normalises a path with "//" (an encoded "/" in an id): nothing ran
        assert resp.location.split("localhost", 1)[-1].startswith("/api/"), f"{where}: {resp.location}"
        assert snapshot(world) == before, f"{where}: a redirect changed the database"
        return
    assert 200 <= status < 300 or 400 <= status < 500, where
    v1 = req["path"].startswith("/v1/")
    if status >= 400:
        assert resp.mimetype == "application/json", f"{where}: not JSON: {resp.get_data()[:300]!r}"
        body = resp.get_json()
        if v1:  # OpenAI's shape
            assert isinstance(body, dict) and set(body) == {"error"} and set(body["error"]) == {
                "message", "type", "param", "code"}, f"{where}: {body!r}"
            body = {"error": body["error"]["message"]}
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip(), \
            f"{where}: {body!r}"
        assert len(body["error"]) <= 1000, f"{where}: the error echoes too much: {len(body['error'])} characters"
        after = snapshot(world)
        changed = {t for t in before if before[t] != after.get(t)} | (set(after) - set(before))
        assert not changed, f"{where}: a rejected request changed table(s) {sorted(changed)}"
        return
    if req["method"] in STATE_CHANGING and not v1:
        assert req["csrf"] == "valid", f"{where}: a state change without a valid CSRF token was accepted"
    if resp.mimetype == "text/event-stream" and v1:
        text = resp.get_data(as_text=True)
        assert text.endswith("data: [DONE]\n\n") and '"error"' not in text, f"{where}: {text[-300:]}"
        for block in text.split("\n\n")[:-2]:
            assert json.loads(block.removeprefix("data: "))["object"] == "chat.completion.chunk", where
    elif resp.mimetype == "text/event-stream":
        text = resp.get_data(as_text=True)
        assert "event: error" not in text and "event: done" in text, f"{where}: {text[-300:]}"
    elif resp.mimetype == "application/x-ndjson":
        for line in resp.get_data(as_text=True).splitlines():
            json.loads(line)
    else:
        assert resp.mimetype == "application/json", f"{where}: {resp.mimetype}"
        assert isinstance(resp.get_json(), dict), where


# ---------------------------------------------------------------------------- tests


def test_every_api_route_is_fuzzed(world):
    api = {r.endpoint for r in world.app.url_map.iter_rules() if r.rule.startswith(("/api", "/v1"))}
    assert api - set(ROUTES) == set(), "API route(s) missing from the fuzz table; add them to ROUTES"
    assert set(ROUTES) - api == set(), "the fuzz table names route(s) the app no longer has"
    for endpoint in api:
        methods = world.rules[endpoint].methods - {"HEAD", "OPTIONS"}
        assert len(methods) == 1, f"{endpoint} serves several methods; give each its own fuzz entry"


FUZZ_SETTINGS = settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                HealthCheck.data_too_large, HealthCheck.large_base_example])


def run_case(world, endpoint: str, kind: str, req: dict) -> None:
    _reset(world)
    before = snapshot(world)
    resp = send(world, getattr(world, ROUTES[endpoint]["caller"]), req)
    RUN_COUNTS[kind, endpoint] += 1
    check_response(world, endpoint, req, resp, before)


@pytest.mark.parametrize("endpoint", sorted(ROUTES))
def test_edge_cases(world, endpoint):
    """The edge cases, each once, on top of an otherwise valid request to the seeded objects."""
    rule = world.rules.get(endpoint)
    assert rule is not None, f"{endpoint} is not in app.url_map"
    for req in edge_cases(rule, ROUTES[endpoint], world.valid):
        run_case(world, endpoint, "edge", req)


@pytest.mark.parametrize("endpoint", sorted(ROUTES))
def test_fuzz(world, endpoint):
    """Random requests (hypothesis)."""
    rule = world.rules.get(endpoint)
    assert rule is not None, f"{endpoint} is not in app.url_map"

    @FUZZ_SETTINGS
    @given(req=requests(rule, ROUTES[endpoint], world.valid))
    def fuzz(req):
        run_case(world, endpoint, "random", req)

    fuzz()


def test_csrf_failures_name_csrf(world):
    """A state change that would otherwise succeed is rejected for its missing token, and the
    error says so."""
    for endpoint, spec in ROUTES.items():
        rule = world.rules[endpoint]
        if method_of(rule) not in STATE_CHANGING:
            continue
        for csrf in ("missing", "garbage"):
            _reset(world)
            before = snapshot(world)
            req = {"method": method_of(rule), "path": fill(rule.rule, world.valid), "query": "",
                   "body": _json_bytes(spec.get("base", {})), "content_type": "application/json", "csrf": csrf}
            resp = send(world, getattr(world, spec["caller"]), req)
            if rule.rule.startswith("/v1/"):  # bearer keys: no CSRF token, none needed
                assert resp.status_code == 200, (endpoint, resp.status_code, resp.get_data(as_text=True)[:300])
                continue
            assert resp.status_code == 400 and "CSRF" in resp.get_json()["error"], (endpoint, resp.status_code)
            assert snapshot(world) == before, endpoint
