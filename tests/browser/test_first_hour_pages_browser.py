"""Pages a newcomer reads in their first hour, in headless Chromium (Debian's ``chromium`` driven
by Playwright) against Django's live server: webhook deliveries whose collapsed rows say how each
went (status code or error, next try) with bodies pretty-printed, and checkpoint sizes in the units
of the CLI and the SDK (``labsdk.display.format_bytes``)."""

from __future__ import annotations

import json

import pytest
from labsdk.webhooks import WebhookReceiver

from jobs.models import Checkpoint, CheckpointStatus, Job
from jobs.webhooks import outbox
from jobs.webhooks.delivery import deliver
from jobs.webhooks.endpoints import endpoint_create, endpoint_send_test
from jobs.webhooks.models import WebhookDelivery
from lab.audit import Actor
from tests.support.browser import signed_in_page
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROJECT = "/o/acme/p/default/"


@pytest.fixture
def webhook_settings(settings, monkeypatch):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    settings.LAB_WEBHOOK_RETRY_SCHEDULE = [0, 300, 300]
    monkeypatch.setattr(outbox, "deliver_on_commit", lambda *args, **kwargs: None)  # delivered below


def test_each_collapsed_delivery_says_how_it_went_and_bodies_are_indented(live_server, owner, webhook_settings):
    actor = Actor(user=owner.user)
    with WebhookReceiver() as receiver:
        answering = endpoint_create(project=owner.project, actor=actor, data={"url": receiver.url("/hook")})
        receiver.expect("/hook", answering.secret, answers=[(503, 0.0)])
        refused = endpoint_create(project=owner.project, actor=actor, data={"url": "http://127.0.0.1:9/closed"})
        for endpoint in (answering, refused):
            endpoint_send_test(endpoint=endpoint, actor=actor)
        deliver(list(WebhookDelivery.objects.values_list("pk", flat=True)))
    answered = WebhookDelivery.objects.get(endpoint=answering)
    unanswered = WebhookDelivery.objects.get(endpoint=refused)
    assert (answered.status, answered.last_status_code) == ("pending", 503)
    assert unanswered.last_status_code is None and unanswered.last_error

    next_try = answered.next_attempt_at.strftime("%Y-%m-%d %H:%M:%S")
    sent = json.dumps(json.loads(answered.message.body), indent=2, ensure_ascii=False)
    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}webhooks/{answering.public_id}/")
        row = page.locator(f"details[data-delivery='{answered.public_id}']")
        summary = row.locator("> summary").inner_text()
        assert "HTTP 503" in summary
        assert f"next try {next_try} UTC" in summary
        assert row.locator("pre.payload").first.is_visible() is False  # collapsed
        row.locator("> summary").click()
        body = row.locator("pre.payload").first.inner_text()
        assert body == sent
        assert '\n  "type": "webhook.test",' in body

        page.goto(f"{PROJECT}webhooks/{refused.public_id}/")
        summary = page.locator(f"details[data-delivery='{unanswered.public_id}'] > summary").inner_text()
        assert unanswered.last_error[:40] in summary
        assert "next try " in summary and "HTTP" not in summary


def test_checkpoint_sizes_read_as_in_the_cli(live_server, owner, spec, no_broker):
    job = submit(owner, spec)
    engine = Engine(job)
    engine.running(step=2)
    Checkpoint.objects.create(job=job, step=2, attempt=1, status=CheckpointStatus.READY, format="peft-lora",
                              size_bytes=62_634_496, sha256="0" * 64)

    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}jobs/{job.public_id}/")
        listed = page.locator("#job-checkpoints").inner_text()
        icon = page.get_attribute("link[rel=icon]", "href")
        served = page.request.get(live_server.url + icon)

    assert "62.6 MB" in listed
    assert (served.status, served.headers["content-type"]) == (200, "image/svg+xml")


def test_a_new_job_starts_from_a_checkpoint_of_the_job_page(live_server, owner, spec, no_broker):
    job = submit(owner, spec, name="adder")
    Engine(job).running(step=4)
    checkpoint = Checkpoint.objects.create(job=job, step=4, attempt=1, status=CheckpointStatus.READY,
                                           format="peft-lora", size_bytes=1000, sha256="0" * 64)

    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}jobs/{job.public_id}/")
        page.click("#job-checkpoints a.new-from-checkpoint")
        page.wait_for_url(f"**/jobs/new/?from_checkpoint={checkpoint.public_id}")
        text = page.input_value("textarea[name=spec]")
        page.click("button[value=estimate]")
        page.wait_for_selector("#submit-job")
        page.click("#submit-job")
        page.wait_for_url("**/jobs/job_*/")
        landed = page.url

    assert f'init_from = "{checkpoint.public_id}"' in text and 'name = "adder-from-step-4"' in text
    new = Job.objects.unscoped().exclude(pk=job.pk).get()
    assert landed.endswith(f"/jobs/{new.public_id}/")
    assert new.spec["init_from"] == checkpoint.public_id


def test_job_charts_tick_at_whole_steps_and_show_latest_values_without_hovering(live_server, owner, spec, no_broker):
    job = submit(owner, spec, max_steps=30)
    engine = Engine(job)
    engine.running(0)
    engine.metrics((1, {"reward/mean": 0.125, "reward/std": 0.05}), (2, {"reward/mean": 0.25, "reward/std": 0.05}),
                   (3, {"reward/mean": 0.375, "reward/std": 0.05}))

    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}jobs/{job.public_id}/")
        page.wait_for_function("() => window.labJobPage && window.labJobPage.charts.length > 0")
        splits = page.evaluate("() => window.labJobPage.charts[0].plot.axes[0]._splits")
        legend = page.evaluate("""() => Array.from(window.labJobPage.charts[0].plot.root
            .querySelectorAll('.u-legend tr.u-series')).filter(row => row.style.display !== 'none')
            .map(row => [row.querySelector('.u-label').textContent, row.querySelector('.u-value').textContent])""")

    assert splits and all(float(split).is_integer() for split in splits), splits
    # The latest step and its (smoothed) reward/mean, not uPlot's dashes for "no cursor".
    assert legend[0] == ["step", "3"], legend
    assert legend[1][0] == "reward/mean" and 0.125 <= float(legend[1][1]) <= 0.375, legend


def test_engine_progress_bars_in_the_log_show_as_progress_not_errors(live_server, owner, spec, no_broker):
    job = submit(owner, spec)
    engine = Engine(job)
    engine.running(0)
    lines = [
        ("stderr", "Loading checkpoint shards:  50%|█████     | 1/2 [00:01<00:01,  1.20it/s]"),
        ("stderr", "Loading checkpoint shards: 100%|██████████| 2/2 [00:02<00:00,  1.10it/s]"),
        ("stderr", "ValueError: something real went wrong"),
        ("stdout", "step 1 done"),
    ]
    engine.post("logs", {"attempt": 1, "lines": [
        {"seq": seq, "time": "2026-11-29T22:16:31Z", "stream": stream, "line": line} for seq, (stream, line) in enumerate(lines)
    ]})

    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}jobs/{job.public_id}/")
        page.wait_for_selector("#logs .log-progress")
        shown = page.evaluate("""() => Array.from(document.querySelectorAll('#logs .log-line'))
            .map(span => [span.className, span.textContent.trim()])""")

    assert shown == [
        ["log-line log-progress", lines[1][1]],
        ["log-line log-stderr", lines[2][1]],
        ["log-line log-stdout", lines[3][1]],
    ]


def test_runs_picked_in_the_jobs_table_are_compared_with_a_metric_picker_and_spec_differences(
    live_server, owner, spec, no_broker
):
    jobs = [submit(owner, spec, name=name, learning_rate=rate) for name, rate in (("slow", 1e-4), ("fast", 1e-3))]
    for job, rewards in zip(jobs, ((0.1, 0.2), (0.3, 0.6))):
        engine = Engine(job)
        engine.running(0)
        engine.metrics(*((step, {"reward/mean": reward, "loss/mean": 1.0}) for step, reward in enumerate(rewards, 1)))

    with signed_in_page(live_server, owner.user) as page:
        page.goto(PROJECT)
        for job in jobs:
            page.check(f"#pick-{job.public_id}")
        page.wait_for_timeout(3500)  # the table refreshes every 3 s: the picks must survive it
        assert all(page.is_checked(f"#pick-{job.public_id}") for job in jobs)
        page.click("#compare-picked button")
        page.wait_for_selector("#compare-chart canvas")
        options = page.eval_on_selector_all("#compare-metric option", "options => options.map(o => o.value)")
        page.select_option("#compare-metric", "loss/mean")
        page.click(".compare-form button[type=submit]")
        page.wait_for_selector("#compare-chart canvas")
        caption = page.inner_text(".compare-chart figcaption")
        differences = page.eval_on_selector_all(
            "#spec-differences tbody tr", "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent.trim()))"
        )

    assert options == ["loss/mean", "reward/mean"]
    assert caption == "loss/mean"
    # Columns in the jobs table's order, newest first.
    assert ["learning_rate", "0.001", "0.0001"] in differences and ["name", '"fast"', '"slow"'] in differences
    assert all(row[0] not in ("model", "max_steps") for row in differences)


def test_rollouts_are_searched_sorted_and_shown_as_histograms(live_server, owner, spec, no_broker):
    job = submit(owner, spec)
    engine = Engine(job)
    engine.running(0)
    engine.samples(1, [
        {"group": 0, "prompt": "What is 2 + 2?", "completion": "4", "reward": 1.0, "advantage": 0.5},
        {"group": 0, "prompt": "What is 2 + 2?", "completion": "five", "reward": 0.0, "advantage": -0.5},
        {"group": 1, "prompt": "What is 3 + 4?", "completion": "7", "reward": 1.0, "advantage": 0.0},
        {"group": 1, "prompt": "What is 3 + 4?", "completion": "seven", "reward": 1.0, "advantage": 0.0},
    ])

    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}jobs/{job.public_id}/")
        page.wait_for_selector("#rollouts figure[data-histogram=reward]")
        reward_counts = page.eval_on_selector_all(
            "#rollouts figure[data-histogram=reward] progress", "bars => bars.map(b => Number(b.value))")
        page.select_option("#rollout-sort", "-advantage")
        page.wait_for_selector("#rollouts table.rollouts th:has-text('Group')")
        by_advantage = page.eval_on_selector_all("#rollouts tr.rollout td:nth-child(2) > pre", "cells => cells.map(c => c.textContent)")
        page.fill("#rollout-search", "seven")
        page.wait_for_function("() => document.querySelectorAll('#rollouts tr.rollout').length === 1")
        found = page.eval_on_selector_all("#rollouts tr.rollout td:nth-child(2) > pre", "cells => cells.map(c => c.textContent)")
        page.fill("#rollout-search", "")
        page.wait_for_function("() => document.querySelectorAll('#rollouts tr.rollout').length === 4")
        page.select_option("#rollout-keep", "reward=0")
        page.wait_for_function("() => document.querySelectorAll('#rollouts tr.rollout').length === 1")
        failed = page.eval_on_selector_all("#rollouts tr.rollout td:nth-child(2) > pre", "cells => cells.map(c => c.textContent)")

    assert sum(reward_counts) == 4 and reward_counts[0] == 1 and reward_counts[-1] == 3
    assert by_advantage[0] == "4" and by_advantage[-1] == "five"
    assert found == ["seven"]
    assert failed == ["five"]


def test_the_jobs_table_filters_by_tag_and_keeps_the_filter_when_it_refreshes(live_server, owner, spec, no_broker):
    submit(owner, spec, name="research-run", metadata={"team": "research"})
    submit(owner, spec, name="infra-run", metadata={"team": "infra"})

    with signed_in_page(live_server, owner.user) as page:
        page.goto(PROJECT)
        page.fill("#filter-tag", "team=research")
        page.click("#job-filters button")
        page.wait_for_url("**tag=team%3Dresearch**")
        page.wait_for_timeout(3500)  # one refresh of the table
        names = page.eval_on_selector_all("#jobs-table tr[data-job] td:nth-child(2) a", "links => links.map(a => a.textContent)")

    assert names == ["research-run"]


def test_compare_puts_wall_time_on_the_x_axis(live_server, owner, spec, no_broker):
    jobs = [submit(owner, spec, name=name) for name in ("a", "b")]
    for job, seconds in zip(jobs, ((0, 60, 120), (0, 30, 90))):
        engine = Engine(job)
        engine.running(0)
        engine.post("metrics", {"attempt": 1, "points": [
            {"step": step, "time": f"2026-11-29T22:{10 + s // 60:02d}:{s % 60:02d}Z", "values": {"reward/mean": step / 10}}
            for step, s in enumerate(seconds, 1)
        ]})
    query = "&".join(f"job={job.public_id}" for job in jobs)

    with signed_in_page(live_server, owner.user) as page:
        page.goto(f"{PROJECT}compare/?{query}&x=time")
        page.wait_for_selector("#compare-chart canvas")
        xs = page.evaluate("() => document.querySelector('#compare-x').value")
        data = page.evaluate("() => window.labCompare && window.labCompare.plot.data[0]")

    assert xs == "time"
    assert data == [0, 0.5, 1, 1.5, 2]
