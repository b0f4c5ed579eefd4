"""The admin raters page in Chromium: an admin sees the raters with their latest assessment,
filters them, quarantines one with a note (confirmed in a dialog), the audit log has it and the
status changes; restoring works the same way; signs an account out everywhere; user names are shown
as text, never as markup; accessible (axe-core) and fitting a phone."""
from __future__ import annotations

import pytest
import requests
from playwright.sync_api import expect
from werkzeug.security import generate_password_hash

from tests.support.accessibility import assert_accessible
from tests.support.browser_checks import admin_login, assert_nothing_injected, watch_csp
from tests.support.live_server import live_instance
from tests.webapp.admin.test_raters import seed_raters
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import RaterTrust, User

pytestmark = pytest.mark.browser

PASSWORD = "correct horse"
DESKTOP = {"width": 1300, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def server(tmp_path_factory, micro_model_dir):
    def prepare(app):
        ids = seed_raters(app)
        set_admin_password("root", PASSWORD)
        return ids

    with live_instance(tmp_path_factory.mktemp("raters") / "instance", micro_model_dir, prepare) as live:
        yield live.server, live.app, live.prepared


def admin_page(browser, url: str, viewport: dict):
    return admin_login(browser, url, PASSWORD, viewport)


def test_an_admin_quarantines_a_rater_with_a_note_and_restores_them(browser, server):
    live, app, ids = server
    context, page, errors, csp, dialogs = admin_page(browser, live.url, DESKTOP)
    page.get_by_role("navigation", name="Admin sections").get_by_role("link", name="Raters").click()
    expect(page.get_by_role("heading", name="Raters", level=1)).to_be_visible()
    rows = page.locator("table[data-testid=raters] tbody tr")
    expect(rows).to_have_count(4)
    assert page.locator(f"tr[data-rater='{ids['heavy']}'] td").nth(3).inner_text() == "8"  # feedback events
    odd = page.locator(f"tr[data-rater='{ids['odd']}']")
    expect(odd.locator(".rater-name")).to_have_text("<img src=x onerror=alert(1)>")  # text, not markup
    expect(odd.locator("[data-testid=rater-status]")).to_have_text("quarantined")
    assert_accessible(page, "raters")

    # filter: the assessment's quarantined raters only
    page.select_option("#f-status", "quarantined")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-rater", str(ids["odd"]))
    page.goto(live.url + "/admin/raters?min_events=3&sort=events")
    expect(rows).to_have_count(2)

    # quarantine with a note: asked first, in a dialog
    heavy = page.locator(f"tr[data-rater='{ids['heavy']}']")
    heavy.get_by_role("button", name="Quarantine heavy_rater").click()
    dialog = page.get_by_role("dialog", name="Quarantine this rater")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Quarantine heavy_rater? Their feedback and votes will be left out")
    assert_accessible(page, "quarantine dialog")
    dialog.get_by_label("Note").fill("the same rating 40 times a minute")
    dialog.get_by_role("button", name="Confirm").click()
    heavy = page.locator(f"tr[data-rater='{ids['heavy']}']")
    expect(heavy).to_have_attribute("data-trust", "quarantined")
    expect(heavy.locator("[data-testid=rater-trust]")).to_have_text("set by admin: quarantined")
    expect(heavy).to_contain_text("“the same rating 40 times a minute” — root")
    expect(heavy.locator("[data-testid=rater-excluded]")).to_have_text("counted out of A/B verdicts")
    audit = page.request.get(live.url + "/api/admin/audit").json()["events"][0]
    assert (audit["action"], audit["actor"], audit["subject"]) == ("rater_trust", "root", "heavy_rater")
    assert audit["detail"] == {"user_id": ids["heavy"], "old": "auto", "new": "quarantined",
                               "note": "the same rating 40 times a minute"}
    with app.app_context():
        assert db.session.get(RaterTrust, ids["heavy"]).trust == "quarantined"

    # cancel changes nothing; confirm restores
    heavy.get_by_role("button", name="Restore heavy_rater to automatic").click()
    dialog = page.get_by_role("dialog", name="Restore to automatic")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(heavy).to_have_attribute("data-trust", "quarantined")
    heavy.get_by_role("button", name="Restore heavy_rater to automatic").click()
    dialog.get_by_role("button", name="Confirm").click()
    expect(page.locator(f"tr[data-rater='{ids['heavy']}']")).to_have_attribute("data-trust", "auto")

    # the odd name in the dialog's question is text too
    page.goto(live.url + "/admin/raters")
    page.locator(f"tr[data-rater='{ids['odd']}']").get_by_role("button", name="Trust").click()
    expect(page.get_by_role("dialog")).to_contain_text("Trust <img src=x onerror=alert(1)>?")
    page.get_by_role("dialog").get_by_role("button", name="Confirm").click()
    expect(page.locator(f"tr[data-rater='{ids['odd']}']")).to_have_attribute("data-trust", "trusted")
    assert_nothing_injected(page, dialogs, "raters page")
    context.close()
    assert errors == [] and csp == [], (errors, csp)


def test_the_raters_page_fits_a_phone(browser, server):
    live, _, ids = server
    context, page, errors, csp, _ = admin_page(browser, live.url, PHONE)
    page.goto(live.url + "/admin/raters")
    row = page.locator(f"tr[data-rater='{ids['new']}']")
    assert row.evaluate("el => getComputedStyle(el).display") == "block"  # a card per rater
    assert page.evaluate("document.scrollingElement.scrollWidth") <= PHONE["width"]
    assert_accessible(page, "raters (phone)")
    row.get_by_role("button", name=f"Quarantine anonymous #{ids['new']}").click()
    box = page.get_by_role("dialog").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    context.close()
    assert errors == [] and csp == [], (errors, csp)


def test_an_admin_signs_an_account_out_everywhere(browser, server):
    live, app, ids = server
    with app.app_context():  # heavy_rater signs in somewhere with a real password
        db.session.get(User, ids["heavy"]).password_hash = generate_password_hash(PASSWORD)
        db.session.commit()
    member = requests.Session()
    token = member.get(live.url + "/api/session").json()["csrf_token"]
    assert member.post(live.url + "/api/account/login", json={"username": "heavy_rater", "password": PASSWORD},
                       headers={"X-CSRFToken": token}).status_code == 200
    assert member.get(live.url + "/api/session").json()["username"] == "heavy_rater"

    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    csp = watch_csp(page)
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))  # the confirmation, answered yes
    page.goto(live.url + "/admin/login")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", PASSWORD)
    with page.expect_navigation():
        page.click("button[type=submit]")
    page.goto(live.url + "/admin/raters")
    sign_out = "button[data-action=sign-out-everywhere]"  # by what it does, not by its (per-account) name
    expect(page.locator(f"tr[data-rater='{ids['new']}'] {sign_out}")).to_have_count(0)  # no account to sign out
    expect(page.locator(f"tr[data-rater='{ids['heavy']}'] {sign_out}")).to_have_count(1)  # the same locator finds it
    with page.expect_navigation():  # the page reloads once the sessions ended
        page.get_by_role("button", name="Sign heavy_rater out everywhere").click()
    assert asked == ["Sign heavy_rater out everywhere? Every browser signed in to this account is signed out at "
                     "once; the password stays the same."]
    assert member.get(live.url + "/api/session").json()["username"] is None
    audit = page.request.get(live.url + "/api/admin/audit").json()["events"][0]
    assert (audit["action"], audit["actor"], audit["subject"]) == ("sign_out_everywhere", "root", "heavy_rater")
    context.close()
    assert errors == [] and csp == [], (errors, csp)
