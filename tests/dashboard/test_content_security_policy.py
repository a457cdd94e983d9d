"""The Content-Security-Policy header on the dashboard, and templates that need nothing it refuses.

The browser tests (tests/browser) load the pages in Chromium under this policy and fail on any
violation; these tests keep the header and the templates' shape without a browser.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db

POLICY = {
    "default-src": "'none'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self'",
    "font-src": "'self'",
    "connect-src": "'self'",
    "form-action": "'self'",
    "base-uri": "'none'",
    "frame-ancestors": "'none'",
}
TEMPLATES = Path(settings.BASE_DIR) / "templates"


def policy_of(response) -> dict[str, str]:
    """The response's Content-Security-Policy as {directive: sources}."""
    directives = [part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";")]
    return {name: sources for name, sources in directives}


@pytest.mark.parametrize("path", ["/login/", "/signup/", "/password-reset/"])
def test_it_sends_the_policy_on_account_pages(path):
    response = Client().get(path)
    assert response.status_code == 200
    assert policy_of(response) == POLICY


@pytest.mark.parametrize("path", ["/o/acme/", "/o/acme/p/default/", "/o/acme/p/default/keys/", "/o/no-such-org/"])
def test_it_sends_the_policy_on_dashboard_pages(owner_client, path):
    response = owner_client.get(path)
    assert response.status_code == (404 if "no-such-org" in path else 200)
    assert policy_of(response) == POLICY


def test_it_tells_htmx_not_to_eval(owner_client):
    content = owner_client.get("/o/acme/").content.decode()
    assert (
        """<meta name="htmx-config" content='{"allowEval": false, "allowScriptTags": false, """
        """"includeIndicatorStyles": false}'>"""
    ) in content


def test_the_templates_have_no_inline_scripts_styles_or_event_handlers():
    problems = []
    for template in sorted(TEMPLATES.rglob("*.html")):
        text = template.read_text()
        for pattern, what in [
            (r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", "inline script"),
            (r"<style\b", "style element"),
            (r"\sstyle=", "style attribute"),
            (r"\son[a-z]+=", "event-handler attribute"),
            (r"\shx-on", "hx-on attribute (evaluated)"),
            (r"javascript:", "javascript: URL"),
        ]:
            for match in re.finditer(pattern, text):
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{template.relative_to(TEMPLATES)}:{line}: {what}")
    assert problems == []

