"""The admin dashboard in Chromium: log in, read the experiment, promote, roll back."""
from __future__ import annotations

import random

import pytest
import requests

from rlhf.data.corpus import sample_prompts
from tests.support.app import make_app, register_model
from tests.support.browser_checks import XSS, XSS_PAYLOADS, admin_login, assert_nothing_injected, watch_csp
from tests.support.live_server import LiveServer
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Experiment, ModelVersion

pytestmark = pytest.mark.browser


def traffic(url: str, users: int, seed: int = 0) -> None:
    """Simulated users over HTTP: each chats, rates, and sometimes writes a (hostile) comment."""
    rng = random.Random(seed)
    prompts = sample_prompts(30)
    for i in range(users):
        s = requests.Session()
        csrf = s.get(url + "/api/session").json()["csrf_token"]
        h = {"X-CSRFToken": csrf}
        conv = s.post(url + "/api/conversations", json={}, headers=h).json()["id"]
        answer = s.post(f"{url}/api/conversations/{conv}/messages", json={"content": rng.choice(prompts),
                                                                          "stream": False}, headers=h).json()
        body = {"thumb": rng.choice(["up", "down"]), "rating": rng.randint(1, 5)}
        if i == 0:
            body.update(comment=XSS, correction=XSS)
        s.post(f"{url}/api/messages/{answer['assistant_message']['id']}/feedback", json=body, headers=h)


@pytest.fixture(scope="module")
def admin_server(tmp_path_factory, micro_model_dir):
    inst = tmp_path_factory.mktemp("admin") / "instance"
    app = make_app(inst)
    register_model(app, micro_model_dir)
    register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    with app.app_context():
        db.session.get(ModelVersion, 2).parent_id = 1
        db.session.add(Experiment(key="ppo-vs-base", control_version_id=1, variant_version_id=2, traffic_split=0.5,
                                  status="running"))
        db.session.commit()
        set_admin_password("root", "correct horse")
    server = LiveServer(inst, env={"RLHF_AB_MIN_SAMPLE": "5"})
    traffic(server.url, 30)
    yield server
    server.stop()


def test_admin_reads_experiment_promotes_and_rolls_back(browser, admin_server):
    url = admin_server.url
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: d.accept())
    csp_violations = watch_csp(page)

    page.goto(url + "/admin/experiments/ppo-vs-base")
    assert "/admin/login" in page.url  # behind login
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".error").inner_text() == "Wrong username or password."
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "correct horse")
    page.click("button[type=submit]")
    page.wait_for_selector("[data-testid=metrics-table]")
    assert page.locator("[data-testid=experiment-key]").inner_text() == "ppo-vs-base"

    # the page shows the same numbers as the API
    api = page.evaluate("fetch('/api/admin/metrics?experiment=ppo-vs-base').then(r => r.json())")
    users = api["arms"]["control"]["users"] + api["arms"]["variant"]["users"]
    assert users == 30
    thumbs = api["metrics"][0]
    row = page.locator("tr[data-metric=thumbs_up_rate]")
    assert f"{thumbs['control']['n']} users" in row.inner_text()
    if thumbs["enough_data"]:  # the always-valid p-value, and the fixed-horizon one for reference
        assert f"{thumbs['sequential']['p_value']:.4f}" in row.locator(".p-value").inner_text()
        assert f"p {thumbs['comparison']['p_value']:.4f}" in row.locator(".fixed-horizon").inner_text()
    assert "Power (Thumbs-up rate)" in page.locator("[data-testid=power]").inner_text()
    assert "Sample ratio check passed" in page.locator("[data-testid=srm]").inner_text()
    assert page.locator("svg.chart").count() == 3

    # hostile text from users renders as text in the feedback browser
    page.goto(url + "/admin/feedback")
    assert XSS in page.locator(".feedback-table").inner_text()
    assert page.evaluate("window.__xss") is None and page.locator("img[src='x']").count() == 0

    # promote the variant (concludes the experiment), then new users get it
    page.goto(url + "/admin/experiments/ppo-vs-base")
    page.click("button[data-decision=promote]")
    page.wait_for_selector(".status-concluded")
    page.goto(url + "/admin/")
    assert page.locator("[data-testid=active-version]").inner_text() == "v2-ppo"
    session = "fetch('/api/session').then(r => r.json())"  # as the logged-in admin: with the version
    assert page.evaluate(session)["model_version"] == "v2-ppo"
    assert "model_version" not in requests.get(url + "/api/session").json()  # users are never told (blind arms)

    # roll back from the versions page
    page.goto(url + "/admin/versions")
    page.click("tr[data-version=v2-ppo] button[data-action=rollback]")
    page.wait_for_selector("tr[data-version=v1-base] .status-active")
    assert page.locator("tr[data-version=v2-ppo] .status").inner_text() == "retired"
    assert page.evaluate(session)["model_version"] == "v1-base"

    # decision history on the overview
    page.goto(url + "/admin/")
    history = page.locator(".events").inner_text()
    assert "rollback v2-ppo" in history and "experiment conclude ppo-vs-base" in history
    context.close()
    assert errors == []
    assert csp_violations == [], csp_violations


def hostile_user(url: str) -> None:
    """A user whose question, correction, comment and conversation title are all markup."""
    s = requests.Session()
    h = {"X-CSRFToken": s.get(url + "/api/session").json()["csrf_token"]}
    conv = s.post(url + "/api/conversations", json={"title": XSS}, headers=h).json()["id"]
    answer = s.post(f"{url}/api/conversations/{conv}/messages", json={"content": XSS, "stream": False},
                    headers=h).json()["assistant_message"]["id"]
    resp = s.post(f"{url}/api/messages/{answer}/feedback", headers=h,
                  json={"thumb": "down", "rating": 1, "correction": XSS, "comment": XSS})
    assert resp.status_code == 200, resp.text


def test_hostile_user_text_is_literal_text_on_every_admin_page(browser, admin_server):
    url = admin_server.url
    hostile_user(url)
    context, page, errors, csp_violations, dialogs = admin_login(browser, url, "correct horse",
                                                                 {"width": 1300, "height": 1000})

    # the feedback browser shows the question, the correction and the comment as typed
    page.goto(url + "/admin/feedback?has_correction=1&thumb=down&rating=1")
    rows = [r for r in page.locator(".feedback-table tbody tr").all() if r.locator("td").first.inner_text() == XSS]
    assert len(rows) == 1  # the question, as typed
    assert rows[0].locator(".correction-text").inner_text() == XSS
    assert rows[0].locator("td").nth(5).inner_text().split("\n") == [XSS, XSS]  # the correction, then the comment
    assert_nothing_injected(page, dialogs, "feedback browser")

    # text typed into the filters comes back as text too (reflected)
    page.goto(url + "/admin/feedback?q=" + requests.utils.quote(XSS_PAYLOADS[2]))
    assert page.input_value("input[name=q]") == XSS_PAYLOADS[2]
    assert_nothing_injected(page, dialogs, "feedback search")
    page.goto(url + "/admin/feedback?" + requests.utils.quote(XSS_PAYLOADS[0]) + "=1")
    assert XSS_PAYLOADS[0] in page.locator("main").inner_text()  # "Unknown filter(s): <img ...>"
    assert_nothing_injected(page, dialogs, "error page")

    # every other admin page renders with that data in the database
    for path in ("/admin/", "/admin/experiments", "/admin/experiment", "/admin/runs", "/admin/versions"):
        page.goto(url + path)
        page.wait_for_selector("main")
        assert_nothing_injected(page, dialogs, path)
    context.close()
    assert errors == []
    assert csp_violations == [], csp_violations
