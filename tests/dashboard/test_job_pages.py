"""The dashboard's job pages: the jobs table, "New job", the job page and its data, cancel and
restart, checkpoint downloads and compare. Members only; another organization's job is a 404."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dashboard.spec_editor import param_line
from jobs.models import Job, JobStatus, MetricStep
from jobs.webhooks.models import WebhookEndpoint
from lab.models import AuditLogEntry
from tests.support.jobs_helpers import Engine, ready_checkpoint, submit

pytestmark = pytest.mark.django_db

PROJECT = "/o/acme/p/default/"
EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "addition-tiny.toml").read_text()


@pytest.fixture(autouse=True)
def _no_broker(no_broker):
    """Keep the run pipeline's tasks from reaching a broker: these tests look at pages, not at runs."""


def job_url(job: Job, rest: str = "") -> str:
    return f"{PROJECT}jobs/{job.public_id}/{rest}"


def without_csrf(response) -> str:
    """The page with its (per-render) CSRF token blanked out, to compare two pages."""
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", response.content.decode())


def page_data(response) -> dict:
    match = re.search(
        r'<script id="job-data" type="application/json">(.*?)</script>', response.content.decode(), re.DOTALL
    )
    assert match, "the page carries no job data"
    return json.loads(match.group(1))


@pytest.fixture
def running_job(owner, spec):
    """A running job at step 3 with metrics, two groups of rollouts, log lines and a checkpoint."""
    job = submit(owner, spec, max_steps=30, name="watch-me")
    engine = Engine(job)
    engine.running(0)
    engine.metrics(
        (1, {"reward/mean": 0.1, "reward/std": 0.05, "loss/mean": 1.5, "entropy/mean": 2.0}),
        (2, {"reward/mean": 0.2, "reward/std": 0.04, "loss/mean": 1.4, "optim/grad_norm": 0.9}),
        (3, {"reward/mean": 0.25, "reward/std": 0.03, "eval/addition/mean": 0.5}),
    )
    engine.samples(
        3,
        [
            {"group": 0, "prompt": "2+3=", "completion": "5", "reward": 1.0, "advantage": 0.5},
            {"group": 0, "prompt": "2+3=", "completion": "<script>alert(1)</script>", "reward": 0.0, "advantage": -0.5},
            {"group": 1, "prompt": "4+4=", "completion": "8", "reward": 1.0, "advantage": 0.0},
        ],
    )
    engine.logs("loading model", "step 1/30 reward 0.100")
    engine.job = Job.objects.unscoped().get(pk=job.pk)
    return engine


# --- the jobs table ------------------------------------------------------------------------------


def test_it_lists_jobs_with_status_progress_latest_reward_and_usage(owner, owner_client, spec, running_job):
    queued = submit(owner, spec, name="waiting-one")
    response = owner_client.get(PROJECT)
    assert response.status_code == 200
    content = response.content.decode()
    assert [job.public_id for job, _ in response.context["jobs"]] == [queued.public_id, running_job.job.public_id]
    row = dict(response.context["jobs"])
    running = next(job for job in row if job.public_id == running_job.job.public_id)
    assert running.latest_reward == 0.25
    assert next(job for job in row if job.public_id == queued.public_id).latest_reward is None
    assert "3/30" in content
    assert "0.250" in content
    assert 'hx-trigger="every 3s"' in content
    assert f'href="{job_url(running_job.job)}"' in content


def test_it_filters_jobs_by_status_and_ignores_an_unknown_status(owner, owner_client, spec, running_job):
    submit(owner, spec, name="waiting-one")
    queued = owner_client.get(PROJECT + "?status=queued")
    assert [job.name for job, _ in queued.context["jobs"]] == ["waiting-one"]
    running = owner_client.get(PROJECT + "jobs/table/?status=running")
    assert running.status_code == 200
    assert [job.name for job, _ in running.context["jobs"]] == ["watch-me"]
    assert "<html" not in running.content.decode()  # the partial alone
    unknown = owner_client.get(PROJECT + "?status=%3Cscript%3E")
    assert unknown.status_code == 200
    assert len(unknown.context["jobs"]) == 2
    assert "Unknown status" in unknown.content.decode()
    assert "<script>" not in unknown.content.decode().split("Unknown status")[1][:60]


def test_an_empty_project_points_to_the_new_job_page(owner_client):
    content = owner_client.get(PROJECT).content.decode()
    assert "No jobs yet" in content
    assert f'href="{PROJECT}jobs/new/"' in content


# --- new job -------------------------------------------------------------------------------------


def test_the_editor_is_pre_filled_from_an_example(owner_client):
    response = owner_client.get(PROJECT + "jobs/new/")
    assert response.status_code == 200
    assert response.context["form"]["spec"].value() == EXAMPLE
    other = owner_client.get(PROJECT + "jobs/new/?example=alphabet-sort-tiny")
    assert 'name = "alphabet-sort-tiny"' in other.context["form"]["spec"].value()
    unknown = owner_client.get(PROJECT + "jobs/new/?example=../../etc/passwd")
    assert unknown.context["form"]["spec"].value() == EXAMPLE


def test_validating_shows_the_estimate_and_creates_nothing(owner, owner_client):
    response = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "estimate"})
    assert response.status_code == 200
    estimate = response.context["estimate"]
    assert set(estimate) == {
        "gpu_seconds",
        "cpu_seconds",
        "cost_usd",
        "queue_position",
        "can_start_now",
        "reason",
        "warnings",
    }
    assert estimate["cpu_seconds"] > 0
    content = response.content.decode()
    assert 'id="estimate"' in content and 'id="submit-job"' in content
    assert response.context["digest"] == response.context["form"].digest
    assert Job.objects.unscoped().count() == 0


def test_submitting_the_estimated_spec_creates_the_job_as_the_signed_in_user(owner, owner_client):
    estimated = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "estimate"})
    digest = estimated.context["digest"]
    response = owner_client.post(
        PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "submit", "estimated": digest}
    )
    job = Job.objects.unscoped().get()
    assert response.status_code == 302
    assert response["Location"] == job_url(job)
    assert job.name == "addition-tiny"
    assert job.status == JobStatus.QUEUED
    assert job.created_by == owner.user
    assert job.created_by_key is None
    assert AuditLogEntry.objects.filter(action="job.create", target=job.public_id, actor_user=owner.user).exists()


def test_a_member_submits_json_too(member, member_client, spec):
    text = json.dumps(spec)
    estimated = member_client.post(PROJECT + "jobs/new/", {"format": "json", "spec": text, "action": "estimate"})
    assert estimated.context["estimate"] is not None
    member_client.post(
        PROJECT + "jobs/new/",
        {"format": "json", "spec": text, "action": "submit", "estimated": estimated.context["digest"]},
    )
    assert Job.objects.unscoped().get().created_by == member


def test_text_changed_after_the_estimate_is_estimated_again_not_submitted(owner_client):
    estimated = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "estimate"})
    changed = EXAMPLE.replace("max_steps = 3", "max_steps = 300")
    response = owner_client.post(
        PROJECT + "jobs/new/",
        {"format": "toml", "spec": changed, "action": "submit", "estimated": estimated.context["digest"]},
    )
    assert response.status_code == 200
    assert response.context["estimate"]["cpu_seconds"] > estimated.context["estimate"]["cpu_seconds"]
    assert 'id="estimate-changed"' in response.content.decode()
    assert Job.objects.unscoped().count() == 0


def test_every_spec_problem_is_shown_next_to_its_line(owner_client):
    text = (
        EXAMPLE.replace('model = "lab/tiny-random-llama"', 'model = "no/such-model"')
        .replace('id = "lab/addition"', 'id = "primeintellect/reverse-text"')
        .replace("max_tokens = 8", "max_tokens = -1")
    )
    response = owner_client.post(
        PROJECT + "jobs/new/", {"format": "toml", "spec": text, "action": "submit", "estimated": "x"}
    )
    assert response.status_code == 200
    problems = {problem["param"]: problem for problem in response.context["form"].problems}
    lines = text.splitlines()
    assert set(problems) >= {"model", "sampling.max_tokens"}
    assert lines[problems["model"]["line"] - 1].startswith("model =")
    assert problems["model"]["source"] == 'model = "no/such-model"'
    assert lines[problems["sampling.max_tokens"]["line"] - 1].startswith("max_tokens =")
    content = response.content.decode()
    assert 'id="spec-problems"' in content
    assert 'data-param="model"' in content
    assert response.context["estimate"] is None
    assert Job.objects.unscoped().count() == 0


def test_an_unknown_environment_points_at_its_id_line(owner_client, spec):
    text = EXAMPLE.replace('id = "lab/addition"', 'id = "primeintellect/reverse-text"')
    response = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": text, "action": "estimate"})
    (problem,) = [problem for problem in response.context["form"].problems if problem["param"] == "env.0.id"]
    assert text.splitlines()[problem["line"] - 1].strip().startswith("id =")
    assert "lab/addition" in problem["message"]  # names the installed ones


@pytest.mark.parametrize(
    ("format", "text", "code"),
    [
        ("toml", 'name = "x"\nmax_steps = = 3\n', "invalid_syntax"),
        ("toml", 'name = "a"\nname = "b"\n', "duplicate_key"),
        ("json", '{"name": "x",', "invalid_syntax"),
        ("json", "[1, 2, 3]", None),
        ("toml", "", None),
    ],
)
def test_malformed_specs_are_problems_not_errors(owner_client, format, text, code):
    response = owner_client.post(PROJECT + "jobs/new/", {"format": format, "spec": text, "action": "submit"})
    assert response.status_code == 200
    form = response.context["form"]
    assert form.problems or form.errors
    if code:
        assert [problem["code"] for problem in form.problems] == [code]
    assert Job.objects.unscoped().count() == 0


def test_hostile_input_is_refused_or_escaped_and_changes_nothing(owner_client):
    bad_format = owner_client.post(PROJECT + "jobs/new/", {"format": "yaml", "spec": EXAMPLE, "action": "estimate"})
    assert bad_format.status_code == 200
    assert "format" in bad_format.context["form"].errors
    nul = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE + "\x00", "action": "estimate"})
    assert nul.status_code in (200, 400)
    script = EXAMPLE.replace('name = "addition-tiny"', 'name = "<script>alert(1)</script>"\nbogus_key = 1')
    escaped = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": script, "action": "estimate"})
    assert escaped.status_code == 200
    assert "<script>alert(1)</script>" not in escaped.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in escaped.content.decode()
    assert [problem["param"] for problem in escaped.context["form"].problems] == ["bogus_key"]
    assert Job.objects.unscoped().count() == 0


def test_an_oversized_spec_is_refused_without_a_server_error(owner_client):
    huge = owner_client.post(PROJECT + "jobs/new/", {"format": "toml", "spec": "# " + "x" * (1024 * 1024 + 10)})
    assert huge.status_code in (400, 413)
    assert Job.objects.unscoped().count() == 0


def test_param_line_finds_fields_in_toml_and_json():
    toml = '[sampling]\nmax_tokens = 8\n\n[[env]]\nid = "a"\n\n[[env]]\nid = "b"\nargs = { x = 1 }\n'
    assert param_line(toml, "toml", "sampling.max_tokens") == 2
    assert param_line(toml, "toml", "env.1.id") == 8
    assert param_line(toml, "toml", "env.1.args.x") == 9
    assert param_line(toml, "toml", "env.0.args") == 4  # not written: its table
    assert param_line(toml, "toml", "") is None
    text = json.dumps({"model": "m", "sampling": {"max_tokens": 8}}, indent=2)
    assert param_line(text, "json", "sampling.max_tokens") == 4


# --- the job page --------------------------------------------------------------------------------


def test_the_job_page_draws_eval_and_validation_means_in_their_own_sections(owner_client, owner, spec):
    job = submit(owner, spec, max_steps=30, name="held-out")
    engine = Engine(job)
    engine.running(0)
    engine.metrics(
        (0, {"eval/addition/mean": 0.1, "eval/addition/correct/mean": 0.1}),
        (1, {"reward/mean": 0.1, "val/addition/mean": 0.2, "val/addition/correct/mean": 0.2}),
        (2, {"reward/mean": 0.3, "eval/addition/mean": 0.4, "val/addition/mean": 0.5, "filter/zero_advantage/fraction": 0.25}),
    )

    response = owner_client.get(job_url(job))

    assert response.status_code == 200
    content = response.content.decode()
    data = page_data(response)
    assert data["eval_names"] == ["eval/addition/mean"]
    assert data["val_names"] == ["val/addition/mean"]
    # The first points hold the charts' metrics and both sections' means; the per-function means are in the picker.
    assert [(point["step"], point["values"]) for point in data["metrics"]] == [
        (0, {"eval/addition/mean": 0.1}),
        (1, {"reward/mean": 0.1, "val/addition/mean": 0.2}),
        (2, {"reward/mean": 0.3, "eval/addition/mean": 0.4, "val/addition/mean": 0.5}),
    ]
    assert {"eval/addition/correct/mean", "val/addition/correct/mean", "filter/zero_advantage/fraction"} <= set(data["metric_names"])
    assert '<section id="val-section">' in content and '<div class="charts" id="val-charts">' in content
    assert '<section id="eval-section">' in content


def test_the_job_page_hides_the_validation_section_without_val_metrics(owner_client, running_job):
    response = owner_client.get(job_url(running_job.job))
    assert '<section id="val-section" hidden>' in response.content.decode()
    assert page_data(response)["val_names"] == []


def test_the_job_page_shows_status_progress_data_logs_events_and_rollouts(owner_client, running_job):
    job = running_job.job
    response = owner_client.get(job_url(job))
    assert response.status_code == 200
    content = response.content.decode()
    assert 'id="job-status">running<' in content
    assert 'max="30" value="3" id="job-progress"' in content and "/30 steps" in content
    data = page_data(response)
    assert data["stream_url"] == f"/api/v1/jobs/{job.public_id}/stream"
    assert data["stream_after"] == job.stream_seq > 0
    assert [point["step"] for point in data["metrics"]] == [1, 2, 3]
    assert data["metrics"][1]["values"] == {"reward/mean": 0.2, "reward/std": 0.04, "loss/mean": 1.4}
    assert data["eval_names"] == ["eval/addition/mean"]
    assert "optim/grad_norm" in data["metric_names"]
    assert data["sample_steps"] == [3]
    assert "step 1/30 reward 0.100" in content
    assert "job.started" in content and "job.queued" in content
    assert 'src="/static/vendor/uplot-1.6.32/uPlot.iife.min.js"' in content
    assert 'src="/static/vendor/htmx-2.0.11/htmx.min.js"' in content
    rollouts = owner_client.get(job_url(job, "rollouts/?step=3"))
    assert rollouts.status_code == 200
    assert [group for group, _ in rollouts.context["groups"]] == [0, 1]
    rendered = rollouts.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered and "<script>alert" not in rendered
    assert "-0.500" in rendered


def test_the_rollouts_view_keeps_those_whose_reward_or_advantage_compares_so(owner_client, running_job):
    job = running_job.job

    def kept(keep: str) -> list[str]:
        response = owner_client.get(job_url(job, "rollouts/"), {"step": 3, "keep": keep, "sort": "-reward"})
        assert response.status_code == 200
        return [sample["completion"] for sample in response.context["sorted"]]

    assert kept("reward>0") == ["5", "8"]
    assert kept("reward=0") == ["<script>alert(1)</script>"]
    assert kept("advantage<0") == ["<script>alert(1)</script>"]
    assert kept("advantage=0") == ["8"]
    assert sorted(kept("nonsense")) == sorted(kept("")) == sorted(["5", "8", "<script>alert(1)</script>"])


def test_the_rollouts_view_defaults_to_the_latest_step_and_refuses_bad_steps(owner_client, running_job):
    job = running_job.job
    latest = owner_client.get(job_url(job, "rollouts/"))
    assert latest.context["step"] == 3
    empty = owner_client.get(job_url(job, "rollouts/?step=2"))
    assert empty.status_code == 200 and empty.context["groups"] == []
    bad = owner_client.get(job_url(job, "rollouts/?step=abc"))
    assert bad.status_code == 400
    assert "step" in bad.content.decode()


def test_the_metrics_route_downsamples_wide_ranges_and_refuses_bad_parameters(owner_client, running_job):
    job = running_job.job
    MetricStep.objects.bulk_create(
        MetricStep(job=job, step=step, attempt=1, time=job.created_at, values={"reward/mean": step % 97 / 97})
        for step in range(4, 5004)
    )
    body = owner_client.get(job_url(job, "data/metrics/?names=reward/mean&max_points=500")).json()
    steps = [point["step"] for point in body["data"]]
    assert len(steps) <= 500 and steps[0] == 1 and steps[-1] == 5003
    assert steps == sorted(steps)
    assert max(point["values"]["reward/mean"] for point in body["data"]) == 96 / 97  # peaks survive
    page = owner_client.get(job_url(job, "data/metrics/?after_step=100&limit=10")).json()
    assert [point["step"] for point in page["data"]] == list(range(101, 111)) and page["has_more"] is True
    bad = owner_client.get(job_url(job, "data/metrics/?max_points=-5"))
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "max_points"
    assert owner_client.get(job_url(job, "data/samples/?step=x")).status_code == 400
    logs = owner_client.get(job_url(job, "data/logs/")).json()
    assert [line["line"] for line in logs["data"]] == ["loading model", "step 1/30 reward 0.100"]


def test_the_job_page_serves_a_hundred_thousand_steps_downsampled(owner_client, owner, spec):
    job = submit(owner, spec, max_steps=100_000)
    MetricStep.objects.bulk_create(
        (
            MetricStep(
                job=job, step=step, attempt=1, time=job.created_at, values={"reward/mean": step / 1e5, "loss/mean": 1.0}
            )
            for step in range(1, 100_001)
        ),
        batch_size=5000,
    )
    data = page_data(owner_client.get(job_url(job)))
    assert 2 < len(data["metrics"]) <= data["max_points"] == 2000
    assert data["metrics"][-1]["step"] == 100_000


def test_the_header_of_a_queued_job_shows_its_queue_position_and_reason(owner, owner_client, spec):
    first, second = submit(owner, spec, name="first"), submit(owner, spec, name="second")
    header = owner_client.get(job_url(second, "header/"))
    assert header.status_code == 200
    content = header.content.decode()
    assert 'id="job-status">queued<' in content
    assert 'id="job-queue-position">#2 in queue<' in content
    assert 'id="job-status-reason">waiting<' in content
    assert 'id="queue-poll"' in content
    assert f'href="{job_url(second, "cancel/")}"' in content
    assert "restart/" not in content
    table = owner_client.get(PROJECT + "jobs/table/").content.decode()
    assert "#1" in table and "#2" in table and first.public_id in table
    owner_client.post(job_url(second, "cancel/"))
    assert 'id="queue-poll"' not in owner_client.get(job_url(second, "header/")).content.decode()


def test_a_failed_job_shows_its_error(owner, owner_client, spec):
    from jobs.services import job_transition

    job = job_transition(
        job=submit(owner, spec), to=JobStatus.FAILED, error_code="oom", error_message="out of <memory>"
    )
    content = owner_client.get(job_url(job)).content.decode()
    assert "<strong>oom</strong>: out of &lt;memory&gt;" in content
    assert f'href="{job_url(job, "restart/")}"' in content
    assert f'href="{job_url(job, "cancel/")}"' not in content


def test_cancel_asks_to_confirm_then_cancels(owner, owner_client, spec):
    job = submit(owner, spec)
    confirm = owner_client.get(job_url(job, "cancel/"))
    assert confirm.status_code == 200
    assert 'id="confirm-cancel"' in confirm.content.decode()
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED
    response = owner_client.post(job_url(job, "cancel/"))
    assert response.status_code == 302 and response["Location"] == job_url(job)
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.CANCELLED
    assert AuditLogEntry.objects.filter(action="job.cancel", actor_user=owner.user).count() == 1


def test_cancelling_a_finished_job_says_why_and_changes_nothing(owner, owner_client, spec):
    job = submit(owner, spec)
    owner_client.post(job_url(job, "cancel/"))
    again = owner_client.post(job_url(job, "cancel/"), follow=True)
    assert again.status_code == 200
    assert "nothing to cancel" in again.content.decode()
    assert AuditLogEntry.objects.filter(action="job.cancel").count() == 1


def test_restart_runs_a_cancelled_job_again_and_refuses_a_queued_one(owner, member_client, spec):
    job = submit(owner, spec)
    refused = member_client.post(job_url(job, "restart/"), follow=True)
    assert "Only failed or cancelled jobs can restart" in refused.content.decode()
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED
    member_client.post(job_url(job, "cancel/"))
    header = member_client.get(job_url(job, "header/")).content.decode()
    assert f'href="{job_url(job, "restart/")}"' in header
    member_client.post(job_url(job, "restart/"))
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED
    assert list(Job.objects.unscoped().get(pk=job.pk).events.values_list("type", flat=True).order_by("id")) == [
        "job.queued",
        "job.cancelled",
        "job.restarted",
    ]


def test_a_ready_checkpoint_downloads_from_the_job_page(owner_client, running_job, settings, tmp_path):
    settings.LAB_DATA_DIR = tmp_path
    checkpoint_id, data = ready_checkpoint(running_job)
    listing = owner_client.get(job_url(running_job.job, "checkpoints/")).content.decode()
    download = f"{PROJECT}checkpoints/{checkpoint_id}/download/"
    assert f'href="{download}"' in listing
    response = owner_client.get(download)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == data
    assert "attachment" in response["Content-Disposition"]


def test_a_checkpoint_that_is_not_ready_is_not_downloaded(owner_client, running_job):
    registered = running_job.post("checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"})
    response = owner_client.get(f"{PROJECT}checkpoints/{registered['id']}/download/", follow=True)
    assert response.status_code == 200
    assert "only ready checkpoints can be downloaded" in response.content.decode()


# --- compare -------------------------------------------------------------------------------------


def test_compare_overlays_the_reward_curves_of_chosen_jobs(owner, owner_client, spec, running_job):
    other = submit(owner, spec, name="second")
    Engine(other).metrics((1, {"reward/mean": 0.7}), (2, {"loss/mean": 1.0}))
    response = owner_client.get(f"{PROJECT}compare/?job={running_job.job.public_id}&job={other.public_id}")
    assert response.status_code == 200
    series = response.context["page_data"]["series"]
    assert [(item["id"], item["points"]) for item in series] == [
        (running_job.job.public_id, [[1, 0.1], [2, 0.2], [3, 0.25]]),
        (other.public_id, [[1, 0.7]]),
    ]
    loss = owner_client.get(f"{PROJECT}compare/?job={other.public_id}&metric=loss/mean")
    assert loss.context["page_data"]["series"][0]["points"] == [[2, 1.0]]
    assert owner_client.get(f"{PROJECT}compare/").status_code == 200


def test_compare_refuses_a_job_of_another_organization(owner_client, outsider, spec):
    foreign = submit(outsider, spec)
    assert owner_client.get(f"{PROJECT}compare/?job={foreign.public_id}").status_code == 404
    assert owner_client.get(f"{PROJECT}compare/?job=job_missing").status_code == 404


# --- tenancy and sign-in -------------------------------------------------------------------------

JOB_GETS = [
    "",
    "header/",
    "checkpoints/",
    "rollouts/",
    "data/metrics/",
    "data/samples/",
    "data/logs/",
    "cancel/",
    "restart/",
]


@pytest.mark.parametrize("rest", JOB_GETS)
def test_another_organizations_job_is_a_404_like_a_missing_one(owner, outsider_client, spec, rest):
    job = submit(owner, spec)
    foreign = outsider_client.get(job_url(job, rest))
    assert foreign.status_code == 404
    own_project = outsider_client.get(f"/o/globex/p/default/jobs/{job.public_id}/{rest}")
    missing = outsider_client.get(f"/o/globex/p/default/jobs/job_missing/{rest}")
    assert own_project.status_code == missing.status_code == 404
    assert without_csrf(own_project) == without_csrf(missing) == without_csrf(foreign)


def test_outsiders_change_nothing(owner, outsider, outsider_client, spec, running_job):
    job = submit(owner, spec)
    for url in (job_url(job, "cancel/"), job_url(job, "restart/"), f"/o/globex/p/default/jobs/{job.public_id}/cancel/"):
        assert outsider_client.post(url).status_code == 404
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED
    assert (
        outsider_client.post(
            PROJECT + "jobs/new/", {"format": "toml", "spec": EXAMPLE, "action": "estimate"}
        ).status_code
        == 404
    )
    for url in (PROJECT, PROJECT + "jobs/table/", PROJECT + "jobs/new/", PROJECT + "compare/"):
        assert outsider_client.get(url).status_code == 404
    assert Job.objects.unscoped().filter(project=outsider.project).count() == 0


def test_a_checkpoint_of_another_organization_is_a_404(owner_client, outsider, spec, settings, tmp_path):
    settings.LAB_DATA_DIR = tmp_path
    engine = Engine(submit(outsider, spec))
    checkpoint_id, _ = ready_checkpoint(engine)
    assert owner_client.get(f"{PROJECT}checkpoints/{checkpoint_id}/download/").status_code == 404
    assert owner_client.get(f"{PROJECT}checkpoints/ckpt_missing/download/").status_code == 404


def test_signed_out_visitors_are_sent_to_log_in(client, owner, spec):
    job = submit(owner, spec)
    for url in (PROJECT, PROJECT + "jobs/new/", job_url(job), job_url(job, "data/metrics/"), PROJECT + "compare/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_vendored_libraries_are_served_with_their_licences(owner_client):
    from django.contrib.staticfiles import finders

    for path in (
        "vendor/htmx-2.0.11/htmx.min.js",
        "vendor/htmx-2.0.11/LICENSE",
        "vendor/uplot-1.6.32/uPlot.iife.min.js",
        "vendor/uplot-1.6.32/uPlot.min.css",
        "vendor/uplot-1.6.32/LICENSE",
        "js/job.js",
        "js/charts.js",
    ):
        assert finders.find(path), path
    assert "Zero-Clause BSD" in Path(finders.find("vendor/htmx-2.0.11/LICENSE")).read_text()
    assert "MIT" in Path(finders.find("vendor/uplot-1.6.32/LICENSE")).read_text()
    assert b'version:"2.0.11"' in Path(finders.find("vendor/htmx-2.0.11/htmx.min.js")).read_bytes().replace(b" ", b"")


HOSTILE_QUERIES = [
    "?status=%00&page=-1",
    "?step=99999999999999999999&page=abc",
    "?names=" + "a," * 5000 + "&max_points=10001&after_step=-7",
    "?job=%F0%9F%92%A5&job=" + "x" * 300 + "&metric=" + "m" * 300,
    "?example=%2e%2e%2f%2e%2e%2fsettings&status=%ED%A0%80",
    "?limit=0&after=-1&last_event_id=%3Cscript%3E",
]


@pytest.mark.parametrize("query", HOSTILE_QUERIES)
def test_hostile_query_strings_never_cause_a_server_error(owner, owner_client, member_client, running_job, query):
    job = running_job.job
    endpoint = WebhookEndpoint.objects.create(project=owner.project, url="http://127.0.0.1:9/x", secret="whsec_x")
    urls = [
        PROJECT,
        PROJECT + "jobs/table/",
        PROJECT + "jobs/new/",
        PROJECT + "compare/",
        PROJECT + "webhooks/",
        f"{PROJECT}webhooks/{endpoint.public_id}/",
        *(job_url(job, rest) for rest in JOB_GETS),
    ]
    for client in (owner_client, member_client):
        for url in urls:
            response = client.get(url + query)
            assert response.status_code in (200, 400, 404), (url + query[:80], response.status_code)


def test_a_member_reads_every_job_page(member_client, running_job):
    job = running_job.job
    for rest in ("", "header/", "checkpoints/", "rollouts/", "data/metrics/", "data/samples/", "data/logs/"):
        assert member_client.get(job_url(job, rest)).status_code == 200, rest
    assert member_client.get(f"{PROJECT}compare/?job={job.public_id}").status_code == 200
