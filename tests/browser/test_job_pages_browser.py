"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright; nothing
downloads a browser) against a live stack: uvicorn, a Celery worker with beat, and the engine on
the tiny model. A user logs in, submits a job from the form, watches the reward chart gain points
from the live stream without reloading, opens a rollout and sees the job succeed; an outsider's
session gets a 404. A screenshot of the job page is saved as an artifact (its path is printed).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import PASSWORD
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.stack import LabStack, running_stack

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

SPEC = """\
name = "addition-live"
model = "lab/tiny-random-llama"
max_steps = 30
batch_size = 8
rollouts_per_example = 4
learning_rate = 1e-3
lora_rank = 8
lora_alpha = 16
seed = 0

[sampling]
max_tokens = 8
temperature = 1.0

[[env]]
id = "lab/addition"
args = { max_operand = 9 }

[eval]
interval = 10
num_examples = 4

[val]
interval = 10
num_examples = 4

[checkpoints]
interval = 10
keep_last = 2

[resources]
gpu_type = "cpu"
gpus = 0
"""


@pytest.fixture
def stack(tmp_path, settings):
    with running_stack(tmp_path / "lab", settings, LAB_STOP_GRACE_S="2", LAB_KILL_GRACE_S="5") as lab:
        yield lab


@pytest.fixture(autouse=True)
def _fast_password_hashing() -> None:
    """Hash passwords with Lab's own hashers here: these tests sign in through a web server in a
    process of its own, which verifies with them (the root conftest's MD5 is this process's only)."""


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


# Runs before each document's own scripts: report every Content-Security-Policy violation to the
# console (where the test collects them) and count htmx swaps.
WATCH_PAGE = """
window.labSwaps = 0;
document.addEventListener("securitypolicyviolation", function (event) {
  console.error("CSP violation: " + event.violatedDirective + " blocked " + (event.blockedURI || "inline")
    + " at " + event.sourceFile + ":" + event.lineNumber);
});
document.addEventListener("htmx:afterSwap", function () { window.labSwaps += 1; });
"""


def log_in(browser, stack: LabStack, email: str):
    """Log ``email`` in on a new browser context; return its page and the list that collects the
    Content-Security-Policy violations of every page it opens."""
    context = browser.new_context(base_url=stack.base_url, viewport={"width": 1440, "height": 1000})
    context.add_init_script(WATCH_PAGE)
    violations: list[str] = []

    def collect(message) -> None:
        if "CSP violation" in message.text or "Content Security Policy" in message.text:
            violations.append(message.text)

    context.on("console", collect)
    page = context.new_page()
    page.goto("/login/")
    page.fill("input[name=username]", email)
    page.fill("input[name=password]", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)
    return page, violations


def artifacts_dir() -> Path:
    root = Path(os.environ.get("LAB_TEST_ARTIFACTS") or Path(os.environ.get("LAB_DATA_DIR", "var")) / "test-artifacts")
    root.mkdir(parents=True, exist_ok=True)
    return root


def chart_points(page) -> int:
    """How many steps the reward chart draws right now."""
    return page.evaluate("() => window.labJobPage ? window.labJobPage.charts[0].plot.data[0].length : -1")


def wait_for_reward_steps(page, steps: list[int], stack: LabStack, *, timeout_ms: int = 30_000) -> None:
    """Wait until the reward chart draws exactly ``steps``; fail naming the steps it lacks (and
    whether the page's store holds a reward/mean for them) after ``timeout_ms``."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    try:
        page.wait_for_function(
            "steps => { const drawn = window.labJobPage.charts[0].plot.data[0];"
            " return drawn.length === steps.length && steps.every((step, i) => drawn[i] === step); }",
            arg=steps,
            timeout=timeout_ms,
        )
    except PlaywrightTimeoutError:
        drawn = page.evaluate("() => Array.from(window.labJobPage.charts[0].plot.data[0])")
        missing = sorted(set(steps) - set(drawn))
        stored = page.evaluate(
            "steps => steps.map(step => [step, (window.labJobPage.store.get(step) || {})['reward/mean'] ?? null])",
            missing,
        )
        pytest.fail(
            f"the reward chart lacks steps {missing} (reward/mean in the page's store: {stored}); "
            f"it draws {drawn}\n{stack.logs()}"
        )


def test_a_user_submits_a_job_and_watches_it_live_until_it_succeeds(owner, outsider, stack, browser, capsys):
    page, violations = log_in(browser, stack, owner.user.email)
    page.goto("/o/acme/p/default/jobs/new/")
    assert page.input_value("textarea").startswith("# A fast smoke job")
    page.fill("textarea", SPEC)
    page.click("button[value=estimate]")
    page.wait_for_selector("#estimate")
    assert "Queue position" in page.inner_text("#estimate")
    page.click("#submit-job")
    page.wait_for_url("**/jobs/job_*/")
    job_url = page.url
    job_id = job_url.rstrip("/").rsplit("/", 1)[1]
    page.wait_for_function("() => window.labJobPage !== undefined")
    page.evaluate("() => { window.notReloaded = true; }")

    # The reward chart gains points from the live stream while the job runs.
    deadline = time.monotonic() + 240
    seen: list[tuple[int, str]] = []
    while time.monotonic() < deadline:
        status = page.inner_text("#job-status")
        points = chart_points(page)
        if not seen or seen[-1] != (points, status):
            seen.append((points, status))
        if status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.1)
    growing = [points for points, status in seen if status == "running" and points > 0]
    assert len(set(growing)) >= 2, f"the chart did not grow while running: {seen}\n{stack.logs()}"
    page.wait_for_function("() => document.getElementById('job-status').textContent === 'succeeded'", timeout=120_000)
    wait_for_reward_steps(page, list(range(1, 31)), stack)
    assert page.evaluate("() => window.notReloaded") is True
    # reward/mean is drawn raw and smoothed, inside a band of ± reward/std.
    assert page.evaluate("() => window.labJobPage.charts[0].plot.data.length") == 5
    assert page.evaluate("() => window.labJobPage.charts[0].plot.bands.length") == 1
    assert page.inner_text("#job-step") == "30"
    assert "job.succeeded" in page.inner_text("#events")

    # Open a rollout of the latest step.
    page.wait_for_selector("#rollouts details.group")
    page.select_option("#rollout-step", page.eval_on_selector("#rollout-step", "select => select.options[0].value"))
    page.wait_for_selector("#rollouts tr.rollout")
    first_group = page.locator("#rollouts details.group").first
    assert "prompt" in first_group.inner_text().lower()
    assert first_group.locator("td.num").count() >= 2  # reward and advantage per rollout

    # Checkpoints are listed with download links; the eval and validation charts exist, each
    # with its points: eval at steps 0 (the base model), 10, 20, 30; validation at 10, 20, 30.
    page.wait_for_selector("#job-checkpoints a:has-text('Download')")
    assert page.locator("#eval-charts figure").count() == 1
    page.wait_for_selector("#val-charts figure[data-metric='val/addition/mean'] canvas")
    assert page.locator("#val-section").is_visible()
    held_out_steps = page.evaluate(
        "() => window.labJobPage.charts.filter(c => c.names[0].indexOf('/addition/mean') > 0 && c.names[0] !== 'reward/addition/mean')"
        ".map(c => [c.names[0], Array.from(c.plot.data[0])])"
    )
    assert sorted(held_out_steps) == [["eval/addition/mean", [0, 10, 20, 30]], ["val/addition/mean", [10, 20, 30]]]

    # Any other metric can be charted from the list.
    page.select_option("#add-metric", "time/step")
    page.wait_for_selector("#charts figure[data-metric='time/step'] canvas")
    assert page.evaluate("() => window.labJobPage.charts.at(-1).plot.data[0].length") == 30

    page.evaluate("() => window.scrollTo(0, 0)")
    shot = artifacts_dir() / f"job-page-{job_id}.png"
    page.screenshot(path=str(shot), full_page=True)
    with capsys.disabled():  # shown even when output is captured
        print(f"\njob page screenshot: {shot}")
    if os.environ.get("LAB_DOCS_SCREENSHOT"):  # the README's picture: the top of the page as rendered anew
        page.reload()
        page.wait_for_selector("#rollouts details.group")
        clip = {"x": 0, "y": 0, "width": 1440, "height": 1480}
        page.screenshot(path=os.environ["LAB_DOCS_SCREENSHOT"], full_page=True, clip=clip)

    # The project page lists it as succeeded; compare overlays its reward curve.
    page.goto("/o/acme/p/default/?status=succeeded")
    row = page.locator(f"tr[data-job='{job_id}']")
    assert "succeeded" in row.inner_text() and "30/30" in row.inner_text()
    page.goto(f"/o/acme/p/default/compare/?job={job_id}")
    page.wait_for_selector("#compare-chart canvas")
    assert "addition-live" in page.inner_text("#compare-chart")

    # An outsider's session gets the 404 of a missing page.
    stranger, _ = log_in(browser, stack, outsider.user.email)
    response = stranger.goto(job_url)
    assert response.status == 404
    assert "addition-live" not in stranger.content()
    # Nothing on the way broke the Content-Security-Policy.
    assert violations == []


@pytest.fixture
def web(tmp_path, settings):
    """The web server alone (no worker: submitted jobs stay queued)."""
    lab = LabStack(tmp_path / "lab", LAB_WEBHOOK_ALLOW_PRIVATE="1")
    settings.LAB_DATA_DIR = lab.data_dir
    lab.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        lab.start_web()
        yield lab
    finally:
        lab.stop()


def test_the_dashboard_works_under_its_content_security_policy(owner, web, browser):
    page, violations = log_in(browser, web, owner.user.email)
    response = page.goto("/o/acme/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "'unsafe-eval'" not in policy and "'unsafe-inline'" not in policy
    assert page.evaluate("() => [htmx.config.allowEval, htmx.config.allowScriptTags]") == [False, False]

    # A job page: its scripts, charts and htmx fragments load; the queued job's header polls.
    page.goto("/o/acme/p/default/jobs/new/")
    page.fill("textarea", SPEC)
    page.click("button[value=estimate]")
    page.wait_for_selector("#estimate")
    page.click("#submit-job")
    page.wait_for_url("**/jobs/job_*/")
    page.wait_for_function("() => window.labJobPage !== undefined && window.labJobPage.charts.length > 0")
    page.wait_for_function("() => window.labSwaps > 0", timeout=15_000)
    assert page.get_attribute("#job-progress", "value") == "0"

    # The project page's jobs table refreshes itself through htmx.
    page.goto("/o/acme/p/default/")
    page.wait_for_function("() => window.labSwaps > 0", timeout=15_000)
    assert "addition-live" in page.inner_text("#jobs-table")

    # A form that asks first: dismissing the question sends nothing; accepting it sends the form.
    page.goto("/o/acme/p/default/webhooks/")
    page.fill("input[name=url]", "http://127.0.0.1:9/hook")
    page.click("form.inline-form button[type=submit]")
    first_secret = page.inner_text("#new-webhook-secret")
    page.click("text=Open the endpoint")
    endpoint_url = page.url
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("button:has-text('Rotate secret')")
    page.wait_for_timeout(500)
    assert page.url == endpoint_url and page.locator("#new-webhook-secret").count() == 0
    questions: list[str] = []

    def accept(dialog) -> None:
        questions.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.click("button:has-text('Rotate secret')")
    page.wait_for_selector("#new-webhook-secret")
    assert questions == ["Rotate the signing secret? The old one keeps signing for 24 hours."]
    assert page.inner_text("#new-webhook-secret").startswith("whsec_")
    assert page.inner_text("#new-webhook-secret") != first_secret

    assert violations == []
