"""The headless Chromium the browser tests drive, and a page of it signed in to Django's live server."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from django.test import Client

CHROMIUM = "/usr/bin/chromium"


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Runs before each document's own scripts: report every Content-Security-Policy violation to the
# console, where ``signed_in_page`` collects them.
REPORT_CSP_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", function (event) {
  console.error("CSP violation: " + event.violatedDirective + " blocked " + (event.blockedURI || "inline")
    + " at " + event.sourceFile + ":" + event.lineNumber);
});
"""


@contextlib.contextmanager
def signed_in_page(live_server, user, *, violations: list[str] | None = None, viewport: dict | None = None):
    """Yield a Chromium page signed in as ``user`` (the session of Django's test client). Open it
    after the test's rows are written: Playwright runs an event loop in this thread, inside
    which Django refuses database queries. Content-Security-Policy violations of every page it
    opens are appended to ``violations`` when given."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)")
    client = Client()
    client.force_login(user)
    session = client.cookies["sessionid"].value
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = chromium.new_context(base_url=live_server.url, **({"viewport": viewport} if viewport else {}))
            context.add_cookies([{"name": "sessionid", "value": session, "url": live_server.url}])
            if violations is not None:
                context.add_init_script(REPORT_CSP_VIOLATIONS)
                context.on("console", lambda message: violations.append(message.text) if "CSP violation" in message.text else None)
            yield context.new_page()
        finally:
            chromium.close()
