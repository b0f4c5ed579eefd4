"""The run page in Chromium while a real PPO run trains (production server, rl-train child
process): the training curves appear and grow live, another run's curves overlay them with a
legend, no CSP violation, no page error, no serious accessibility problem."""
from __future__ import annotations

import os
import signal

import pytest

from rlhf.training.curves import CurvesFile
from tests.support.accessibility import assert_accessible
from tests.support.app import make_app, register_model
from tests.support.browser_checks import watch_csp
from tests.support.feedback_factory import seed_feedback
from tests.support.live_server import LiveServer
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import TrainingRun

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "correct horse battery"
SHOTS = os.environ.get("RLHF_ADMIN_SHOTS")


@pytest.fixture
def server(tmp_path, micro_model_dir):
    inst = tmp_path / "instance"
    app = make_app(inst)
    register_model(app, micro_model_dir)
    seed_feedback(app, 40)
    with app.app_context():
        set_admin_password("root", PASSWORD)
        db.session.add(TrainingRun(status="succeeded", algorithm="ppo", stage="done", progress=1.0))  # run #1
        db.session.commit()
        db.engine.dispose()
    folder = inst / "runs" / "run-1"
    folder.mkdir(parents=True)
    write = CurvesFile(folder / "curves.jsonl")
    for step in range(1, 41):
        write("reward", "reward", step, {"loss": 0.7 - step / 100, "accuracy": min(1.0, 0.5 + step / 80)})
    for step in range(1, 21):
        write("policy", "ppo", step, {"objective/kl": step / 50, "objective/scores": -0.5 + step / 40})
    # long enough a run to be watched while it trains (many PPO updates of the micro model)
    live = LiveServer(inst, env={"RLHF_DEVICE": "cpu", "RLHF_PPO_EPISODES": "2048", "RLHF_POLICY_LR": "1e-3",
                                 "RLHF_RETRAIN_MIN_FEEDBACK": "10"})
    yield live
    live.stop()


GROWN = """([selector, seen]) => {
    const svg = document.querySelector(selector);
    return svg !== null && Number(svg.dataset.points) > seen;
}"""


def wait_points(page, selector: str, seen: int, timeout: float) -> None:
    """Until the chart ``selector`` (an svg) has more than ``seen`` points of this run (a function,
    not an expression string: the page's CSP forbids eval)."""
    page.wait_for_function(GROWN, arg=[selector, seen], timeout=timeout)


def points(page, chart: str) -> int:
    return int(page.locator(f"figure[data-chart='{chart}'] svg").get_attribute("data-points") or 0)


def test_run_page_draws_the_curves_live_and_compares(browser, server):
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    csp = watch_csp(page)
    pid = None
    try:
        page.goto(server.url + "/admin/login")
        page.fill("input[name=username]", "root")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("[data-testid=active-version]")
        page.goto(server.url + "/admin/runs")
        page.select_option("#run-algorithm", "ppo")
        page.click("form[data-action=start-run] button[type=submit]")
        page.wait_for_url("**/admin/runs/2")
        pid = page.evaluate("fetch('/api/admin/runs/2').then(r => r.json())")["pid"]
        live = "#curves[data-live=yes]"
        page.wait_for_selector(live)
        # the reward model's curves appear while the run trains, then the policy's, and grow
        wait_points(page, "figure[data-chart='reward:loss'] svg", 0, 120_000)
        wait_points(page, "figure[data-chart='policy:objective/kl'] svg", 0, 180_000)
        assert page.locator(live).count() == 1  # still live: drawn by the page, not a reload
        seen = points(page, "policy:objective/kl")
        wait_points(page, "#curves[data-live=yes] figure[data-chart='policy:objective/kl'] svg", seen, 120_000)
        for chart in ("policy:objective/scores", "policy:objective/entropy", "policy:loss/policy_avg",
                      "policy:loss/value_avg", "policy:policy/clipfrac_avg", "reward:accuracy"):
            assert points(page, chart) > 0, chart
        assert page.locator("figure[data-chart='policy:objective/kl'] polyline.series-a0").count() == 1
        if SHOTS:
            page.screenshot(path=f"{SHOTS}/admin-run-live-desktop.png", full_page=True)
        # compare with run #1: its series overlaid (dashed), named in the legend, kept on the next redraw
        page.select_option("#compare-run", "1")
        kl = page.locator("figure[data-chart='policy:objective/kl']")
        kl.locator("polyline.series-b0").wait_for()
        assert "run #1" in kl.locator(".legend").inner_text() and "run #2" in kl.locator(".legend").inner_text()
        assert "compare=1" in page.url
        seen = points(page, "policy:objective/kl")
        wait_points(page, "#curves[data-live=yes] figure[data-chart='policy:objective/kl'] svg", seen, 120_000)
        assert kl.locator("polyline.series-b0").count() == 1
        assert_accessible(page, "live run page with a compared run")
        page.set_viewport_size({"width": 390, "height": 844})
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
        if SHOTS:
            page.screenshot(path=f"{SHOTS}/admin-run-live-phone.png", full_page=True)
        assert_accessible(page, "live run page, phone")
    finally:
        context.close()
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)  # the run's own process group (spawned with a new session)
            except ProcessLookupError:
                pass
    assert errors == [] and csp == [], (errors, csp)
