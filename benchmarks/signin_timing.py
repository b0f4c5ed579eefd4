"""Sign-in timing: does a failed sign-in take as long for a name that does not exist as for a wrong
password of one that does? (If not, the time of the answer tells an attacker which names exist.)

Both sign-in forms -- the admin login (``POST /admin/login``) and the end users' (``POST
/api/account/login``) -- are called through the whole Flask app (CSRF token, rate limits off, the
database lookup, the password check) in one process, on a fresh instance with one admin and one
end user whose passwords are hashed like every real one (werkzeug's default method). Cases, in a
random order within each round so that drift of the machine's load hits every case alike:

* ``admin: wrong password`` / ``admin: unknown name``
* ``account: wrong password`` / ``account: unknown name``

Reported per case: median, 10th and 90th percentile in ms over ``--rounds`` rounds (after one
round of warm-up), and per form the ratio of the medians (unknown / wrong password; 1.0 is what
is wanted), with the load average (``/proc/loadavg``) before and after. ``--code DIR`` imports
the app from another checkout (e.g. an older commit, for a before/after comparison).

    .venv/bin/python benchmarks/signin_timing.py [--rounds 40] [--code DIR] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ADMIN, ADMIN_PASSWORD = "bench_admin", "bench admin password"
MEMBER, MEMBER_PASSWORD = "bench_member", "bench member password"
TARGET = (0.9, 1.1)  # unknown-name median / wrong-password median


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unavailable"


def build_app(instance: Path):
    from webapp import create_app
    from webapp.admin.auth import set_admin_password
    from webapp.core.extensions import db

    app = create_app({"INSTANCE_DIR": str(instance), "RLHF_AUTO_INIT_MODEL": False, "RLHF_RATELIMIT_ENABLED": False,
                      "RLHF_NEW_IDENTITIES_PER_HOUR": 0})
    with app.app_context():
        set_admin_password(ADMIN, ADMIN_PASSWORD)
    member = app.test_client()
    token = member.get("/api/session").get_json()["csrf_token"]
    resp = member.post("/api/account/register", json={"username": MEMBER, "password": MEMBER_PASSWORD},
                       headers={"X-CSRFToken": token})
    assert resp.status_code == 201, resp.get_data(as_text=True)
    with app.app_context():
        db.session.remove()
    return app


def cases(app) -> dict:
    """Each case: a function making one failed sign-in (asserted to fail with 401)."""
    admin = app.test_client()
    admin_token = re.search(r'name="csrf_token" value="([^"]+)"',
                            admin.get("/admin/login").get_data(as_text=True)).group(1)
    account = app.test_client()
    account_token = account.get("/api/session").get_json()["csrf_token"]

    def admin_login(username: str):
        def attempt() -> int:
            return admin.post("/admin/login", data={"username": username, "password": "not the password",
                                                    "csrf_token": admin_token}).status_code
        return attempt

    def account_login(username: str):
        def attempt() -> int:
            return account.post("/api/account/login", json={"username": username, "password": "not the password"},
                                headers={"X-CSRFToken": account_token}).status_code
        return attempt

    return {"admin: wrong password": admin_login(ADMIN), "admin: unknown name": admin_login("no_such_admin"),
            "account: wrong password": account_login(MEMBER), "account: unknown name": account_login("no_such_user")}


def measure(app, rounds: int, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    todo = cases(app)
    times: dict[str, list[float]] = {name: [] for name in todo}
    for round_ in range(rounds + 1):  # the first round warms up (imports, the dummy hash, caches)
        order = list(todo)
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            status = todo[name]()
            elapsed = (time.perf_counter() - start) * 1000
            if status != 401:
                raise SystemExit(f"{name}: expected 401, got {status}")
            if round_:
                times[name].append(elapsed)
    return times


def summary(times: dict[str, list[float]]) -> dict:
    out: dict = {"cases": {}}
    for name, values in times.items():
        q = statistics.quantiles(values, n=10)
        out["cases"][name] = {"median_ms": statistics.median(values), "p10_ms": q[0], "p90_ms": q[-1],
                              "n": len(values)}
    medians = {name: c["median_ms"] for name, c in out["cases"].items()}
    out["ratios"] = {form: medians[f"{form}: unknown name"] / medians[f"{form}: wrong password"]
                     for form in ("admin", "account")}
    out["target"] = {"ratio_low": TARGET[0], "ratio_high": TARGET[1]}
    out["met"] = all(TARGET[0] <= r <= TARGET[1] for r in out["ratios"].values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds (each case once per round)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose webapp is measured")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve()))
    import webapp

    before = loadavg()
    with tempfile.TemporaryDirectory(prefix="signin-timing-") as tmp:
        app = build_app(Path(tmp) / "instance")
        times = measure(app, args.rounds, args.seed)
    code = Path(webapp.__file__).resolve().parent.parent
    result = {"code": "." if code == ROOT else str(code), "rounds": args.rounds,
              "loadavg_before": before, "loadavg_after": loadavg(), **summary(times)}
    for name, c in result["cases"].items():
        print(f"{name:26s} median {c['median_ms']:7.1f} ms   p10 {c['p10_ms']:7.1f}   p90 {c['p90_ms']:7.1f}")
    for form, ratio in result["ratios"].items():
        print(f"{form}: unknown name / wrong password = {ratio:.3f} (target {TARGET[0]}-{TARGET[1]})")
    print(f"load average before: {before}; after: {result['loadavg_after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
