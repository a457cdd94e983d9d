"""The playground of a deployment's page, in headless Chromium against uvicorn (a web process of
its own): a chat message goes through the page's relay to an inference server of the tiny model
(the engine's serving role in a thread of this process) and its streamed answer appears, under
the page's Content-Security-Policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from billing.models import TokenUsage
from serving.models import Deployment, DeploymentStatus, InferenceServer, ServerStatus, ServingMode, SourceType
from tests.conftest import PASSWORD
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, REPORT_CSP_VIOLATIONS
from tests.support.serving import tiny_serving_engine
from tests.support.stack import LabStack

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the web process shares a PostgreSQL test database"),
]

TINY = "lab/tiny-random-llama"
MAX_TOKENS = 12


@pytest.fixture
def web(tmp_path, settings):
    """The web server alone, under uvicorn (streams are sent as they come)."""
    lab = LabStack(tmp_path / "lab")
    settings.LAB_DATA_DIR = lab.data_dir
    lab.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        lab.start_web()
        yield lab
    finally:
        lab.stop()


@pytest.fixture(autouse=True)
def _fast_password_hashing() -> None:
    """Hash passwords with Lab's own hashers here: the test signs in through a web server in a
    process of its own, which verifies with them (the root conftest's MD5 is this process's only)."""


@pytest.fixture
def engine():
    """The tiny model's serving role on a free port of this process."""
    with tiny_serving_engine() as served:
        yield served


def test_a_chat_message_streams_its_answer_into_the_page(owner, web, engine):
    _, url = engine
    inference = InferenceServer.objects.create(key=f"base:{TINY}", model=TINY, served_model=TINY, status=ServerStatus.RUNNING,
                                               url=url, token="engine-token", generation=1, handle={"workdir": "/nonexistent"})
    deployment = Deployment.objects.create(
        organization=owner.organization, project=owner.project, name="tiny", source_type=SourceType.MODEL, source_id=TINY,
        base_model=TINY, mode=ServingMode.BASE, server=inference, status=DeploymentStatus.READY,
    )
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)"
    violations: list[str] = []
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = chromium.new_context(base_url=web.base_url)
        context.add_init_script(REPORT_CSP_VIOLATIONS)
        context.on("console", lambda message: violations.append(message.text) if "CSP violation" in message.text else None)
        page = context.new_page()
        page.goto("/login/")
        page.fill("input[name=username]", owner.user.email)
        page.fill("input[name=password]", PASSWORD)
        page.click("form button[type=submit]")
        page.wait_for_url(lambda url: "/login/" not in url)
        page.goto(f"/o/acme/p/default/deployments/{deployment.public_id}/")
        # count the moments the conversation changes: the two messages appear in one, then a streamed
        # answer grows in one more per chunk read (an answer sent whole would be one)
        page.evaluate("""() => {
          window.labAnswerUpdates = 0;
          new MutationObserver(() => { window.labAnswerUpdates += 1; })
            .observe(document.getElementById('chat-log'), {childList: true, characterData: true, subtree: true});
        }""")
        page.fill("#chat-message", "Say something")
        page.fill("#chat-max-tokens", str(MAX_TOKENS))
        with page.expect_response(lambda response: response.request.method == "POST") as relayed:
            page.click("#chat-send")
        page.wait_for_function("() => !document.getElementById('chat-send').disabled && document.querySelector('.chat-assistant')",
                               timeout=60_000)
        answer = page.locator(".chat-assistant .chat-text").text_content()
        updates = page.evaluate("() => window.labAnswerUpdates")
        response = relayed.value
        events = [line for line in response.text().splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
        assert page.locator(".chat-error").count() == 0
        assert page.input_value("#chat-message") == ""
        chromium.close()
    assert answer.strip()
    # The relay answered as a stream of chunks; how many network reads they arrive in is the
    # browser's and the machine's business: the page changed for the messages, then for the answer.
    assert response.headers["content-type"].startswith("text/event-stream") and len(events) >= 3, events
    assert updates >= 2
    assert violations == []
    usage = TokenUsage.objects.unscoped().get()  # one request, streamed (its first token timed), billed once
    assert usage.deployment_public_id == deployment.public_id and 0 < usage.completion_tokens <= MAX_TOKENS
    assert usage.first_token_ms is not None and usage.first_token_ms <= usage.duration_ms
