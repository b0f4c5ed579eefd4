"""Shared checks of the browser tests: CSP violations and injected markup."""
from __future__ import annotations

# Chromium prints every CSP violation to the console ("Refused to ... because it violates the
# following Content Security Policy directive"); the listener reports the DOM event as well.
CSP_LISTENER = """document.addEventListener("securitypolicyviolation", (e) => console.error(
    `Content Security Policy violation: ${e.violatedDirective} blocked ${e.blockedURI || "inline code"}`));"""

XSS_PAYLOADS = ['<img src=x onerror="window.__xss=1;alert(1)">', '<script>window.__xss=2;alert(2)</script>',
                '"><svg onload="window.__xss=3;alert(3)">']
XSS = " ".join(XSS_PAYLOADS)


def watch_csp(page) -> list[str]:
    """Collects the CSP violations of ``page`` (call before its first navigation)."""
    violations: list[str] = []
    page.add_init_script(CSP_LISTENER)
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    return violations


def watch_dialogs(page) -> list[str]:
    """Records (and dismisses) every alert/confirm/prompt of ``page``."""
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    return dialogs


def assert_nothing_injected(page, dialogs: list[str], where: str = "") -> None:
    assert dialogs == [], where
    assert page.evaluate("window.__xss") is None, where
    injected = page.locator("img[src='x'], svg[onload], body script")
    assert injected.count() == 0, f"{where}: {injected.first.evaluate('e => e.outerHTML')}"


def admin_login(browser, url: str, password: str, viewport: dict, **context_args):
    """A new browser context signed in as the admin "root" on the dashboard, with its page
    watched: returns (context, page, page errors, CSP violations, dialogs)."""
    context = browser.new_context(viewport=viewport, **context_args)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    csp = watch_csp(page)
    dialogs = watch_dialogs(page)
    page.goto(url + "/admin/login")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("[data-testid=active-version]")
    return context, page, errors, csp, dialogs
