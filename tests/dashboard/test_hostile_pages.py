"""The dashboard's job and webhook pages under hostile or careless use: other tenants' ids in
every URL, hostile "New job" text, double submits, CSRF and junk parameters. Never a 500."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db

PROJECT = "/o/acme/p/default/"
EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "addition-tiny.toml").read_text()


@pytest.fixture(autouse=True)
def _no_broker(no_broker):
    """Keep the run pipeline's tasks from reaching a broker: these tests look at pages, not at runs."""


def estimate_then_submit(client, format: str, text: str):
    """Estimate ``text``, then submit it with the digest of that estimate; return both answers."""
    estimated = client.post(PROJECT + "jobs/new/", {"format": format, "spec": text, "action": "estimate"})
    if estimated.status_code != 200:
        return estimated, None
    digest = estimated.context["form"].digest
    submitted = client.post(
        PROJECT + "jobs/new/", {"format": format, "spec": text, "action": "submit", "estimated": digest}
    )
    return estimated, submitted


def _hostile_specs(spec: dict) -> dict[str, tuple[str, str]]:
    return {
        "NUL escaped in JSON": ("json", json.dumps({**spec, "name": "a\u0000b"})),
        "NUL in a metadata key": ("json", json.dumps({**spec, "metadata": {"k\u0000": "v"}})),
        "lone surrogate": ("json", json.dumps({**spec, "name": "a\ud800b"})),
        "lone surrogate env id": ("json", json.dumps({**spec, "env": [{"id": "lab/\ud800"}]})),
        "deep JSON arrays": ("json", '{"metadata": {"a": ' + "[" * 100000 + "]" * 100000 + "}}"),
        "deep JSON objects": ("json", '{"metadata": ' + '{"a":' * 50000 + "1" + "}" * 50000 + "}"),
        "deep TOML arrays": ("toml", "a = " + "[" * 100000 + "]" * 100000),
        "deep TOML inline tables": ("toml", "a = " + "{b=" * 50000 + "1" + "}" * 50000),
        "TOML integer past 64 bits": ("toml", EXAMPLE.replace("max_steps = ", "max_steps = 99999999999999999999999#")),
        "JSON integer of 5000 digits": (
            "json",
            json.dumps(spec).replace('"max_steps": 3', '"max_steps": ' + "9" * 5000),
        ),
        "JSON 1e999": ("json", json.dumps(spec).replace('"max_steps": 3', '"max_steps": 1e999')),
        "JSON NaN": ("json", json.dumps(spec).replace('"max_steps": 3', '"max_steps": NaN')),
        "TOML nan in metadata": ("toml", EXAMPLE + "\n[metadata]\nx = nan\n"),
        "TOML datetime in metadata": ("toml", EXAMPLE + "\n[metadata]\nx = 1979-05-27T07:32:00Z\n"),
        "huge metadata": ("json", json.dumps({**spec, "metadata": {f"k{i}": "v" * 100 for i in range(5000)}})),
        "huge integer env arg": (
            "json",
            json.dumps({**spec, "env": [{"id": "lab/addition", "args": {"max_operand": 10**30}}]}),
        ),
        "init_from with NUL": ("json", json.dumps({**spec, "init_from": "ckpt_\u0000"})),
        "binary": ("toml", "\x01\x02\ufffd\ufeff = 1"),
    }


@pytest.mark.parametrize("case", list(_hostile_specs({})))
def test_hostile_new_job_text_is_a_problem_never_a_server_error_or_a_job(owner_client, spec, case):
    format, text = _hostile_specs(spec)[case]
    estimated, submitted = estimate_then_submit(owner_client, format, text)
    assert estimated.status_code in (200, 400, 413)
    if estimated.status_code == 200:
        form = estimated.context["form"]
        assert form.problems or form.errors
        assert submitted.status_code == 200
    assert Job.objects.unscoped().count() == 0


def test_a_submit_sent_twice_queues_the_job_once(owner, owner_client):
    """A double click (or a resend after "back") posts the estimated form twice: one job only."""
    estimated = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "estimate"})
    form = estimated.content.decode()
    import re

    fields = dict(re.findall(r'<input type="hidden" name="(estimated|submission)" value="([^"]*)"', form))
    body = {"format": "toml", "spec": EXAMPLE, "action": "submit", **fields}
    first = owner_client.post(PROJECT + "jobs/new/", body)
    second = owner_client.post(PROJECT + "jobs/new/", body)
    job = Job.objects.unscoped().get()
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == f"{PROJECT}jobs/{job.public_id}/"
    # Estimating again gives a new submission: the same spec may run twice on purpose.
    again = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "estimate"})
    fields = dict(
        re.findall(r'<input type="hidden" name="(estimated|submission)" value="([^"]*)"', again.content.decode())
    )
    third = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "submit", **fields})
    assert third.status_code == 302 and Job.objects.unscoped().count() == 2


def test_a_submission_token_sent_with_another_spec_is_refused_and_queues_nothing_more(owner, owner_client):
    """The token confirms one estimate: posting it again with a changed (and re-estimated) spec is a
    problem on the page, not a second job and not the first job again."""
    import re

    estimated = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "estimate"})
    fields = dict(
        re.findall(r'<input type="hidden" name="(estimated|submission)" value="([^"]*)"', estimated.content.decode())
    )
    assert (
        owner_client.post(
            PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "submit", **fields}
        ).status_code
        == 302
    )
    changed = EXAMPLE.replace('name = "', 'name = "changed-', 1)
    assert changed != EXAMPLE
    other = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": changed, "action": "estimate"})
    digest = dict(re.findall(r'<input type="hidden" name="(estimated)" value="([^"]*)"', other.content.decode()))

    reused = owner_client.post(
        PROJECT + "jobs/new/",
        {"format": "toml", "spec": changed, "action": "submit", "submission": fields["submission"], **digest},
    )

    assert reused.status_code == 200
    assert "This submission was already used with a different request." in reused.content.decode()
    assert Job.objects.unscoped().count() == 1


# --- checkpoint downloads --------------------------------------------------------------------------


@pytest.fixture
def checkpoints(owner, spec, settings, tmp_path):
    """A running job of Acme with a ready checkpoint and one still uploading."""
    from tests.support.jobs_helpers import Engine, ready_checkpoint, submit

    settings.LAB_DATA_DIR = tmp_path
    engine = Engine(submit(owner, spec, max_steps=30))
    engine.running(0)
    ready, data = ready_checkpoint(engine, step=2)
    pending = engine.post("checkpoints", {"attempt": 1, "step": 4, "format": "peft-lora"})["id"]
    return {"ready": ready, "data": data, "pending": pending, "engine": engine}


def test_checkpoint_downloads_of_other_tenants_or_odd_ids_are_404s(owner, outsider, checkpoints, outsider_client):
    from jobs.models import Checkpoint

    api = "/api/v1/checkpoints/{}/download"
    mine = owner.client().get(api.format(checkpoints["ready"]))
    assert mine.status_code == 200 and b"".join(mine.streaming_content) == checkpoints["data"]
    missing = owner.client().get(api.format("ckpt_missing"))
    assert missing.status_code == 404
    for ckpt in (checkpoints["ready"], checkpoints["pending"]):
        foreign = outsider.client().get(api.format(ckpt))
        assert (foreign.status_code, foreign.json()) == (404, missing.json())
    for odd in ("..", "ckpt_%2e%2e%2f%2e%2e", checkpoints["ready"].upper(), "ckpt_" + "x" * 5000, "%E2%98%83", "1"):
        response = owner.client().get(api.format(odd))
        assert response.status_code in (400, 404), odd
    # The checkpoint's numeric primary key is not an id.
    pk = Checkpoint.objects.unscoped().get(public_id=checkpoints["ready"]).pk
    assert owner.client().get(api.format(pk)).status_code == 404
    # The dashboard route: another organization's checkpoint, from its own project's URL too.
    for url in (
        f"{PROJECT}checkpoints/{checkpoints['ready']}/download/",
        f"/o/globex/p/default/checkpoints/{checkpoints['ready']}/download/",
    ):
        assert outsider_client.get(url).status_code == 404


def test_a_checkpoint_not_ready_or_gone_is_refused_cleanly(owner, checkpoints, owner_client):
    from jobs import storage
    from jobs.models import Checkpoint

    api = "/api/v1/checkpoints/{}/download"
    pending = owner.client().get(api.format(checkpoints["pending"]))
    assert pending.status_code == 409 and pending.json()["error"]["code"] == "checkpoint_not_ready"
    checkpoint = Checkpoint.objects.unscoped().get(public_id=checkpoints["ready"])
    storage.delete(checkpoint.storage_key)
    gone = owner.client().get(api.format(checkpoints["ready"]))
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    page = owner_client.get(f"{PROJECT}checkpoints/{checkpoints['ready']}/download/")
    assert page.status_code == 404
    # Several quick clicks on a pending checkpoint's link: each one a redirect with the reason.
    for _ in range(3):
        again = owner_client.get(f"{PROJECT}checkpoints/{checkpoints['pending']}/download/")
        assert again.status_code == 302


# --- webhook pages ---------------------------------------------------------------------------------


def test_hostile_webhook_forms_and_ids_are_never_a_server_error(owner, owner_client, member_client, outsider_client):
    from jobs.webhooks.models import WebhookEndpoint

    owner_client.raise_request_exception = False
    endpoint = WebhookEndpoint.objects.create(project=owner.project, url="http://127.0.0.1:9/x", secret="whsec_x")
    base = f"{PROJECT}webhooks/"
    page = f"{base}{endpoint.public_id}/"
    posts = [
        (base, {"url": "http://" + "a" * 5000 + ".test/", "events": ["job.queued"]}),
        (base, {"url": "javascript:alert(1)", "events": ["job.queued"]}),
        (base, {"url": "https://example.com/\u202ehook", "events": ["nope", "job.queued"]}),
        (base, {"url": "https://example.com/x", "events": "job.queued" * 1000}),
        (base, {}),
        (page + "enabled/", {"enabled": "maybe"}),
        (page + "enabled/", {}),
        (page + "rotate/", {"extra": "x" * 10000}),
        (page + "deliveries/whd_missing/redeliver/", {}),
        (page + "deliveries/" + "x" * 3000 + "/redeliver/", {}),
        (f"{base}whep_missing/enabled/", {"enabled": "true"}),
    ]
    for client in (member_client, owner_client):
        client.raise_request_exception = False
        if client is owner_client:  # the member before could neither rotate nor disable it
            assert WebhookEndpoint.objects.unscoped().get(pk=endpoint.pk).secret == "whsec_x"
            assert WebhookEndpoint.objects.unscoped().get(pk=endpoint.pk).enabled
        for url, body in posts:
            response = client.post(url, body)
            assert response.status_code in (200, 302, 400, 403, 404), (url[:80], response.status_code)
        for url in (page + "rotate/", page + "enabled/", page + "test/"):
            assert client.get(url).status_code == 405
        assert client.get(page + "?status=%F0%9F%92%A5&page=99999999999999999999").status_code == 200
    assert WebhookEndpoint.objects.unscoped().filter(project=owner.project).count() == 1
    for url, body in posts:
        assert outsider_client.post(url, body).status_code == 404


def test_cancel_and_restart_posted_twice_act_once(owner, owner_client, member_client, spec):
    from jobs.models import JobEvent, JobStatus
    from tests.support.jobs_helpers import submit

    job = submit(owner, spec)
    url = f"{PROJECT}jobs/{job.public_id}/"
    assert owner_client.post(url + "cancel/").status_code == 302
    assert member_client.post(url + "cancel/").status_code == 302
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.CANCELLED
    assert owner_client.post(url + "restart/").status_code == 302
    assert member_client.post(url + "restart/").status_code == 302
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED
    types = list(JobEvent.objects.filter(job=job).values_list("type", flat=True))
    assert types.count("job.cancelled") == 1 and types.count("job.restarted") == 1
    # Without the CSRF token a post changes nothing.
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner.user)
    assert strict.post(url + "cancel/").status_code == 403
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED


JUNK_DATA_QUERIES = [
    "?max_points=1e9&limit=99999999999999999999999",
    "?after_step=1e400&names=",
    "?after_step=" + "9" * 5000,
    "?limit=-0&max_points=0",
    "?names=" + ",".join(f"m{i}" for i in range(3000)),
    "?step=" + "1" * 5000 + "&after=" + "2" * 5000,
    "?after=NaN&step=inf&limit=Infinity",
    "?names=reward%2Fmean&names=loss%2Fmean&max_points=2&max_points=-5",
]


@pytest.mark.parametrize("query", JUNK_DATA_QUERIES)
def test_the_chart_json_routes_answer_junk_with_a_400_in_the_api_shape(owner, owner_client, spec, query):
    from tests.support.jobs_helpers import Engine, submit

    engine = Engine(submit(owner, spec, max_steps=30))
    engine.running(0)
    engine.metrics((1, {"reward/mean": 0.1}), (2, {"reward/mean": 0.2}))
    owner_client.raise_request_exception = False
    for rest in ("data/metrics/", "data/samples/", "data/logs/", "rollouts/"):
        response = owner_client.get(f"{PROJECT}jobs/{engine.job.public_id}/{rest}{query}")
        assert response.status_code in (200, 400), (rest, query[:60], response.status_code)
        if response.status_code == 400 and rest.startswith("data/"):
            assert response.json()["error"]["type"]


def test_pointing_at_problem_lines_takes_linear_time_on_hostile_text(owner_client):
    """The editor finds the line of each problem with regular expressions: a line built to make
    them backtrack (within the 1 MB limit) must not hold a server worker for minutes."""
    import time

    evil = "[a" + " " * 60_000 + "x"
    text = f'name = """\n{evil}\n{evil}\n"""\nbogus_key = 1\n' + EXAMPLE.replace('name = "addition-tiny"\n', "")
    started = time.monotonic()
    response = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": text, "action": "estimate"})
    took = time.monotonic() - started
    assert response.status_code == 200
    assert "bogus_key" in [problem["param"] for problem in response.context["form"].problems]
    # A bound for backtracking (minutes), not a speed measurement: it holds on a loaded 2-core machine.
    assert took < 30, f"the editor took {took:.1f} s to point at the problems"


def test_many_problems_in_a_long_spec_are_pointed_at_quickly(owner_client):
    import time

    envs = "".join(f'[[env]]\nid = "nobody/env-{n}"\n' for n in range(1500))
    text = EXAMPLE.split("[[env]]")[0] + envs
    started = time.monotonic()
    response = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": text, "action": "estimate"})
    took = time.monotonic() - started
    assert response.status_code == 200 and response.context["form"].problems
    # A bound for quadratic work (minutes for 1,500 problems), not a speed measurement.
    assert took < 30, f"the editor took {took:.1f} s for {len(response.context['form'].problems)} problems"
