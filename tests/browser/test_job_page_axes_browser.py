"""The job page's charts in headless Chromium (Debian's ``chromium`` driven by Playwright) against
Django's live server: a job that ended without a step draws no charts, and the eval chart's x axis
spans the job's steps (0..max_steps) rather than the few steps it was evaluated at."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from django.test import Client

from jobs.models import JobStatus
from jobs.services import job_transition
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROJECT = "/o/acme/p/default/"


@contextlib.contextmanager
def signed_in_page(live_server, user):
    """Yield a Chromium page signed in as ``user``; open it after the test's rows are written."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)")
    client = Client()
    client.force_login(user)
    session = client.cookies["sessionid"].value
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = chromium.new_context(base_url=live_server.url)
            context.add_cookies([{"name": "sessionid", "value": session, "url": live_server.url}])
            yield context.new_page()
        finally:
            chromium.close()


def test_an_ended_job_without_steps_draws_no_charts_and_eval_spans_the_jobs_steps(live_server, owner, spec, no_broker):
    refused = submit(owner, spec, name="refused")
    Engine(refused)
    job_transition(job=refused, to=JobStatus.FAILED, error_code="invalid_spec", error_message="bad argument")
    trained = submit(owner, spec, name="trained", max_steps=20)
    engine = Engine(trained)
    engine.running(0)
    engine.metrics((0, {"eval/addition/mean": 0.1}), (1, {"reward/mean": 0.2, "reward/std": 0.1}),
                   (5, {"eval/addition/mean": 0.3}))

    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}jobs/{refused.public_id}/")
        page.wait_for_function("() => window.labJobPage !== undefined")
        drawn = page.evaluate("() => window.labJobPage.charts.length")
        note = page.locator("#charts-empty").inner_text()
        controls = page.locator(".chart-controls").is_visible()

        page.goto(f"{PROJECT}jobs/{trained.public_id}/")
        page.wait_for_function("() => window.labJobPage && window.labJobPage.charts.length > 5")
        scale = page.evaluate("""() => {
            const chart = window.labJobPage.charts.find(c => c.names[0] === "eval/addition/mean");
            return [chart.plot.scales.x.min, chart.plot.scales.x.max];
        }""")
        reward = page.evaluate("() => [window.labJobPage.charts[0].plot.scales.x.min, window.labJobPage.charts[0].plot.scales.x.max]")

    assert drawn == 0 and controls is False
    assert note.startswith("No steps were recorded: the job ended (failed) before its first step")
    assert scale[0] <= 0 and scale[1] >= 20, scale  # 0..max_steps, not 0..5 nor 0..100
    assert scale[1] < 30, scale
    assert reward[1] < 20, reward  # the training charts keep the data's own range
