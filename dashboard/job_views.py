"""Dashboard pages for jobs: the project's jobs table, "New job", the job page, compare.

Thin adapters over ``jobs.services``, ``jobs.estimates`` and ``jobs.selectors``; every job is looked
up *with* the project that ``dashboard.access`` resolved for the signed-in member, so another
organization's job is the same 404 as a missing one. Any member of the organization may submit,
cancel and restart the project's jobs (as a read-write API key of the project may).

The job page renders its initial state on the server and then follows the job's live stream
(``GET /api/v1/jobs/{id}/stream``, authenticated by the session) from the stream sequence number
read before that state, so nothing between the render and the connection is lost. The JSON routes
under ``.../data/`` serve the charts' other metrics with the API's shapes and downsampling.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models.fields.json import KeyTransform
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods
from labsdk.spec_template import spec_to_toml

from dashboard.access import OrganizationAccess, project_view
from dashboard.forms import JobSpecForm
from dashboard.spec_editor import example_named, examples, with_model
from dashboard.views import _actor, _render
from jobs.artifacts.downloads import download_response
from jobs.artifacts.kinds import ADAPTER, CHECKPOINT, ArtifactKind
from jobs.artifacts.lifecycle import artifact_list
from jobs.distributions import histogram
from jobs.estimates import job_estimate
from jobs.models import Checkpoint, CheckpointStatus, Job, JobStatus, MetricStep
from jobs.queue import queue_positions
from jobs.registry.selectors import installed_models
from jobs.sandboxes import job_sandbox_use
from jobs.selectors import (
    job_eta_seconds,
    job_list,
    job_logs,
    job_logs_tail,
    job_samples,
    jobs_with_latest_reward,
    metric_names,
    metric_points,
    sample_steps,
)
from jobs.serializers import job_to_dict
from jobs.services import job_cancel, job_restart, job_submit
from lab.api.errors import http_status, lab_error_body
from lab.errors import LabError
from lab.formats import money
from lab.idempotency import StoredAnswer, run_once
from lab.models import Project
from lab.tenancy import get_owned

JOBS_PAGE_SIZE = 25
#: The job page's fixed charts; ``reward/std`` draws the band around ``reward/mean``.
CHART_METRICS = ("reward/mean", "reward/std", "loss/mean", "entropy/mean", "seq_len/mean", "perf/tokens_per_s")
#: Points per series the charts ask for: the server downsamples wider ranges (min-max per bucket).
CHART_MAX_POINTS = 2000
EVENTS_SHOWN = 200
LOG_LINES_SHOWN = 200
COMPARE_MAX_JOBS = 8


#: Bins of the reward and advantage histograms above a step's rollouts.
ROLLOUT_HISTOGRAM_BINS = 8


def _job(project: Project, job_id: str) -> Job:
    """Return the project's job ``job_id``; Http404 for a missing or foreign one."""
    return get_owned(Job.objects.select_related("project"), project, job_id, "job", error=_no_such)


def _no_such(what: str) -> Http404:
    return Http404(f"No such {what}.")


def _api_error_json(error: LabError) -> JsonResponse:
    return JsonResponse(lab_error_body(error), status=http_status(error))


# --- the project's jobs ------------------------------------------------------------------------


def _jobs_table_context(request: HttpRequest, project: Project) -> dict:
    """The jobs table for ``?status=`` (an unknown status shows every job, with a notice)."""
    status = request.GET.get("status") or ""
    if status not in JobStatus.values:
        status_problem = f"Unknown status {status[:40]!r}; showing every job." if status else ""
        status = ""
    else:
        status_problem = ""
    model = (request.GET.get("model") or "")[:256]
    tag = (request.GET.get("tag") or "")[:577]
    key, equals, value = tag.partition("=")
    metadata = {key.strip(): value.strip()} if equals and key.strip() else {}
    environment = (request.GET.get("env") or "")[:256]
    jobs = job_list(
        project=project, status=status or None, metadata=metadata, model=model or None, environment=environment or None
    )
    page = Paginator(jobs_with_latest_reward(jobs).order_by("-id"), JOBS_PAGE_SIZE).get_page(request.GET.get("page"))
    positions = queue_positions(list(page))
    now = timezone.now()
    return {
        "project": project,
        "page": page,
        "jobs": [
            (job, {"queue_position": positions.get(job.pk), "cost_usd": money(job.cost_usd),
                   "eta_s": job_eta_seconds(job, now=now)})
            for job in page
        ],
        "model": model,
        "environment": environment,
        "environments": _environment_ids(project),
        "tag": tag,
        "models": sorted(
            m for m in Job.objects.filter(project=project).order_by().values_list("spec__model", flat=True).distinct()
            if isinstance(m, str)
        ),
        "status": status,
        "status_problem": status_problem,
        "statuses": JobStatus.values,
    }


def _environment_ids(project: Project) -> list[str]:
    """The environment ids (without version) the project's jobs train on, for the filter."""
    ids = set()
    for blocks in Job.objects.filter(project=project).order_by().values_list("spec__env", flat=True).distinct():
        for block in blocks if isinstance(blocks, list) else ():
            if isinstance(block, dict) and isinstance(block.get("id"), str):
                ids.add(block["id"].partition("@")[0])
    return sorted(ids)


@require_GET
@project_view
def project_detail(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """The project page: its jobs (filtered by ``?status=``), updating live, with "New job"."""
    return _render(request, "dashboard/project.html", _jobs_table_context(request, project), access=access)


@require_GET
@project_view
def jobs_table(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """The jobs table alone, for the project page to poll."""
    return _render(request, "dashboard/_jobs_table.html", _jobs_table_context(request, project), access=access)


@require_http_methods(["GET", "POST"])
@project_view
def job_create(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """ "New job": edit a spec (pre-filled from an example, with ``?from_checkpoint=ckpt_...``
    from that checkpoint's job with ``init_from`` set, or with ``?from_job=job_...`` from that
    job: "Edit and resubmit"), see its estimate, then submit it.

    A POST validates the spec through ``jobs.estimates.job_estimate`` (what ``POST /jobs/estimate``
    does) and shows every problem next to its line, or the estimate with a "Submit" button. The
    submit (``action=submit``) goes through ``jobs.services.job_submit`` only when the text is the
    one whose estimate was shown; otherwise it is estimated again first.
    """
    example = example_named(request.GET.get("example"))
    usable = installed_models(project.organization)
    estimate, changed_since_estimate = None, False
    if request.method == "GET":
        source, job_source = request.GET.get("from_checkpoint"), request.GET.get("from_job")
        if source:
            text = _spec_from_checkpoint(project, source)
        elif job_source:
            text = _spec_from_job(project, job_source)
        else:
            text = example.text if example else ""
            if request.GET.get("model") in usable:  # "Use this model" of the models menu
                text = with_model(text, request.GET["model"])
        form = JobSpecForm(initial={"format": "toml", "spec": text})
    else:
        form = JobSpecForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data["data"]
            submitting = request.POST.get("action") == "submit"
            confirmed = submitting and form.cleaned_data["estimated"] == form.digest
            changed_since_estimate = submitting and not confirmed
            try:
                if confirmed:
                    job, first_time = _submit_once(
                        request, project, data, token=form.cleaned_data["submission"], digest=form.digest
                    )
                    if job is None:
                        messages.info(request, "This spec was already submitted.")
                        return redirect("project", org_slug=access.organization.slug, project_slug=project.slug)
                    if first_time:
                        messages.success(request, f"Submitted {job.name or job.public_id}.")
                    else:
                        messages.info(request, f"{job.name or job.public_id} was already submitted.")
                    return redirect(
                        "job", org_slug=access.organization.slug, project_slug=project.slug, job_id=job.public_id
                    )
                estimate = job_estimate(project=project, data=data)
            except LabError as error:
                form.add_problems(
                    [item.as_dict() for item in error.errors]
                    or [{"param": error.param, "code": error.code, "message": error.message}]
                )
    context = {
        "project": project,
        "form": form,
        "examples": examples(),
        "example": example,
        "models": list(usable.values()),
        "estimate": estimate,
        "changed_since_estimate": changed_since_estimate and estimate is not None,
        "digest": form.digest if estimate else "",
        "submission": secrets.token_urlsafe(24) if estimate else "",
    }
    return _render(request, "dashboard/job_new.html", context, access=access, status=200)


def _spec_from_checkpoint(project: Project, checkpoint_id: str) -> str:
    """Return, as TOML, the spec of the job that wrote ready checkpoint ``checkpoint_id`` with
    ``init_from`` naming it (a new job starts from its weights) and a name saying so. Http404
    for a checkpoint that is missing, another tenant's, or not ready."""
    checkpoint = get_owned(Checkpoint.objects.select_related("job"), project, checkpoint_id, "checkpoint", error=_no_such)
    if checkpoint.status != CheckpointStatus.READY:
        raise _no_such("ready checkpoint")
    spec = {key: value for key, value in checkpoint.job.spec.items() if key != "checkpoint_id"}  # Prime's init_from
    base_name = spec.get("name") or checkpoint.job.public_id
    spec = {"name": f"{base_name}-from-step-{checkpoint.step}", **{k: v for k, v in spec.items() if k != "name"}}
    spec["init_from"] = checkpoint.public_id
    comment = (f"A new job from {checkpoint.public_id}: step {checkpoint.step} of {checkpoint.job.public_id}, "
               f"whose spec this is.\ninit_from starts it from that checkpoint's weights (a fresh optimizer, step 1).")
    return spec_to_toml(spec, comment=comment)


def _spec_from_job(project: Project, job_id: str) -> str:
    """Return, as TOML, the spec of the project's job ``job_id`` for a new job ("Edit and
    resubmit"), its error quoted in the comment when it failed. Http404 for a job that is missing
    or another tenant's."""
    job = _job(project, job_id)
    comment = f"A new job from the spec of {job.public_id}."
    if job.error_code:
        comment += f"\nIt failed with {job.error_code}: {job.error_message[:500]}\nEdit what the error names, then submit."
    return spec_to_toml(dict(job.spec), comment=comment)


def _submit_once(request: HttpRequest, project: Project, data, *, token: str, digest: str) -> tuple[Job | None, bool]:
    """Submit ``data`` once per submission token (issued with its estimate).

    Returns ``(job, True)`` for a new job, ``(job, False)`` when the token was used already (a
    double click, a resend after "back"; ``job`` is ``None`` if that job has since been deleted).
    The token is the project's idempotency key ``dashboard-new-job:<token>`` (``lab.idempotency``),
    so two concurrent posts are serialized; the same token with another spec is refused
    (``idempotency_conflict``). Without a token, it just submits.
    """
    if not token:
        return job_submit(project=project, actor=_actor(request), data=data), True
    result = run_once(
        project=project,
        key=f"dashboard-new-job:{token}",
        request_hash=digest,
        work=lambda: job_submit(project=project, actor=_actor(request), data=data),
        answer=lambda job: StoredAnswer(201, {"id": job.public_id}),
        param="submission",
    )
    if isinstance(result, StoredAnswer):
        job_id = (result.body or {}).get("id") or ""
        return Job.objects.filter(project=project, public_id=job_id).first(), False
    return result, True


# --- one job -----------------------------------------------------------------------------------


def _job_header_context(job: Job) -> dict:
    return {"job": job, "job_data": job_to_dict(job), "sandboxes": job_sandbox_use(job)}


def _held_out_names(names: list[str], prefix: str) -> list[str]:
    """Return the per-environment means of eval or validation (``<prefix>/<env>/mean``, docs/api.md),
    which the job page draws in their own section; per-function means stay in the chart picker."""
    return [name for name in names if name.startswith(f"{prefix}/") and name.count("/") == 2 and name.endswith("/mean")]


@require_GET
@project_view
def job_detail(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> HttpResponse:
    """The job page: status, progress, live charts, eval, rollouts, logs, events and checkpoints.
    A job that ended without a step recorded says so instead of drawing empty charts."""
    job = _job(project, job_id)
    # Read the stream position before the data, so the live stream resumes with nothing lost
    # (a point seen twice is merged by step on the page).
    stream_after = job.stream_seq
    names = metric_names(job=job)
    eval_names, val_names = _held_out_names(names, "eval"), _held_out_names(names, "val")
    initial = metric_points(
        job=job, params={"names": ",".join((*CHART_METRICS, *eval_names, *val_names)), "max_points": str(CHART_MAX_POINTS)}
    )
    events = list(job.events.order_by("-id")[:EVENTS_SHOWN])
    steps = sample_steps(job=job)
    header = _job_header_context(job)
    ended_without_steps = job.is_terminal and not names
    context = {
        **header,
        "project": project,
        "ended_without_steps": ended_without_steps,
        "events": events,
        "checkpoints": artifact_list(CHECKPOINT, job=job).order_by("-step", "-id"),
        "adapters": artifact_list(ADAPTER, job=job).order_by("-step", "-id"),
        "logs": job_logs_tail(job=job, limit=LOG_LINES_SHOWN),
        "sample_steps": steps,
        "spec_json": json.dumps(job.spec, indent=2),
        "page_data": {
            "job": header["job_data"],
            "stream_url": f"/api/v1/jobs/{job.public_id}/stream",
            "stream_after": stream_after,
            "metrics": initial["data"],
            "metric_names": names,
            "chart_metrics": list(CHART_METRICS),
            "eval_names": eval_names,
            "val_names": val_names,
            "ended_without_steps": ended_without_steps,
            "max_points": CHART_MAX_POINTS,
            "event_ids": [event.public_id for event in events],
            "sample_steps": steps,
        },
    }
    return _render(request, "dashboard/job.html", context, access=access)


@require_GET
@project_view
def job_header(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> HttpResponse:
    """The job page's status header alone (status, reason, queue position, progress, actions)."""
    job = _job(project, job_id)
    return _render(
        request, "dashboard/_job_header.html", {**_job_header_context(job), "project": project}, access=access
    )


@require_GET
@project_view
def job_checkpoints(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> HttpResponse:
    """The job page's checkpoints list alone."""
    job = _job(project, job_id)
    context = {"job": job, "project": project, "checkpoints": artifact_list(CHECKPOINT, job=job).order_by("-step", "-id")}
    return _render(request, "dashboard/_job_checkpoints.html", context, access=access)


@require_GET
@project_view
def job_adapters(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> HttpResponse:
    """The job page's adapters list alone."""
    job = _job(project, job_id)
    context = {"job": job, "project": project, "adapters": artifact_list(ADAPTER, job=job).order_by("-step", "-id")}
    return _render(request, "dashboard/_job_adapters.html", context, access=access)


#: The rollouts page's ``?keep=`` choices: which rollouts of the step to show.
ROLLOUT_FILTERS = {
    "reward>0": lambda sample: sample["reward"] > 0,
    "reward=0": lambda sample: sample["reward"] == 0,
    "advantage>0": lambda sample: sample["advantage"] > 0,
    "advantage<0": lambda sample: sample["advantage"] < 0,
    "advantage=0": lambda sample: sample["advantage"] == 0,
}


@require_GET
@project_view
def job_rollouts(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> HttpResponse:
    """The rollouts of one step (``?step=``, default the latest), grouped as GRPO groups, with a
    histogram of the step's rewards and advantages; ``?q=`` keeps those whose prompt or completion
    holds the text (case-insensitive), ``?keep=reward>0`` (``reward|advantage`` then ``>``, ``<``
    or ``=`` then ``0``) those whose value compares so, ``?sort=reward|-reward|advantage|-advantage``
    lists them in that order instead of by group. An unknown ``keep`` keeps every rollout."""
    job = _job(project, job_id)
    try:
        samples = job_samples(job=job, params={"step": request.GET.get("step") or "", "limit": "1000"})["data"]
    except LabError as error:
        return _render(request, "dashboard/_job_rollouts.html", {"problem": error.message}, access=access, status=400)
    step, stored = (samples[0]["step"] if samples else None), len(samples)
    histograms = [
        (name, histogram([sample[name] for sample in samples], ROLLOUT_HISTOGRAM_BINS)) for name in ("reward", "advantage")
    ]
    query = (request.GET.get("q") or "")[:200].strip().lower()
    if query:
        samples = [s for s in samples if query in str(s["prompt"]).lower() or query in str(s["completion"]).lower()]
    keep = ROLLOUT_FILTERS.get(request.GET.get("keep") or "")
    if keep is not None:
        samples = [sample for sample in samples if keep(sample)]
    sort = request.GET.get("sort") or ""
    context = {"step": step, "query": query, "sort": sort, "shown": len(samples), "stored": stored,
               "histograms": [(name, bins, max((b["count"] for b in bins), default=0)) for name, bins in histograms]}
    if sort.lstrip("-") in ("reward", "advantage"):
        context["ordered"] = True
        context["sorted"] = sorted(samples, key=lambda sample: sample[sort.lstrip("-")], reverse=sort.startswith("-"))
    else:
        groups: dict[int, list[dict]] = {}
        for sample in samples:
            groups.setdefault(sample["group"], []).append(sample)
        context["groups"] = sorted(groups.items())
    return _render(request, "dashboard/_job_rollouts.html", context, access=access)


def _selector_json(selector, request: HttpRequest, project: Project, job_id: str) -> JsonResponse:
    """Answer with ``selector(job=..., params=request.GET)``, the REST list body, for the session;
    a refused parameter is the API's error body."""
    job = _job(project, job_id)
    try:
        return JsonResponse(selector(job=job, params=request.GET))
    except LabError as error:
        return _api_error_json(error)


@require_GET
@project_view
def job_metrics_data(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> JsonResponse:
    """``GET /jobs/{id}/metrics`` for the session: same parameters, same list body."""
    return _selector_json(metric_points, request, project, job_id)


@require_GET
@project_view
def job_samples_data(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> JsonResponse:
    """``GET /jobs/{id}/samples`` for the session."""
    return _selector_json(job_samples, request, project, job_id)


@require_GET
@project_view
def job_logs_data(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> JsonResponse:
    """``GET /jobs/{id}/logs`` for the session."""
    return _selector_json(job_logs, request, project, job_id)


def _job_action(request, access, project, job_id, *, verb: str, act) -> HttpResponse:
    """Confirm (GET) then do (POST) ``act(job=..., actor=...)``; a refused action changes nothing."""
    job = _job(project, job_id)
    if request.method == "POST":
        try:
            act(job=job, actor=_actor(request))
        except LabError as error:
            messages.error(request, error.message)
        else:
            messages.success(request, f"{verb.capitalize()} requested for {job.name or job.public_id}.")
        return redirect("job", org_slug=access.organization.slug, project_slug=project.slug, job_id=job.public_id)
    context = {"project": project, "job": job, "job_data": job_to_dict(job), "verb": verb}
    return _render(request, "dashboard/job_confirm.html", context, access=access)


@require_http_methods(["GET", "POST"])
@project_view
def job_cancel_view(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> HttpResponse:
    """Confirm, then cancel the job (``jobs.services.job_cancel``)."""
    return _job_action(request, access, project, job_id, verb="cancel", act=job_cancel)


@require_http_methods(["GET", "POST"])
@project_view
def job_restart_view(request: HttpRequest, access: OrganizationAccess, project: Project, job_id: str) -> HttpResponse:
    """Confirm, then restart a failed or cancelled job (``jobs.services.job_restart``)."""
    return _job_action(request, access, project, job_id, verb="restart", act=job_restart)


def _artifact_download(request: HttpRequest, access: OrganizationAccess, project: Project, kind: ArtifactKind, artifact_id: str) -> HttpResponse:
    """Download a ready artifact of ``kind`` of the project (the archive, or a redirect to a signed
    URL); what is not ready or has changed goes back to its job's page with the reason."""
    artifact = get_owned(kind.model.objects.select_related("job"), project, artifact_id, kind.name, error=_no_such)
    try:
        return download_response(artifact, request=request)
    except LabError as error:
        if http_status(error) == 404:
            raise Http404(error.message) from None
        messages.error(request, error.message)
        return redirect("job", org_slug=access.organization.slug, project_slug=project.slug, job_id=artifact.job.public_id)


@require_GET
@project_view
def adapter_download(request: HttpRequest, access: OrganizationAccess, project: Project, adapter_id: str) -> HttpResponse:
    """Download a ready adapter of the project (``_artifact_download``)."""
    return _artifact_download(request, access, project, ADAPTER, adapter_id)


@require_GET
@project_view
def checkpoint_download(request: HttpRequest, access: OrganizationAccess, project: Project, checkpoint_id: str) -> HttpResponse:
    """Download a ready checkpoint of the project (``_artifact_download``)."""
    return _artifact_download(request, access, project, CHECKPOINT, checkpoint_id)


# --- compare -----------------------------------------------------------------------------------


@require_GET
@project_view
def job_compare(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """Overlay the reward curves of up to 8 of the project's jobs (``?job=job_a&job=job_b``).

    A job id that is not the project's is a 404, as on every page.
    """
    chosen_ids = list(dict.fromkeys(job_id[:64] for job_id in request.GET.getlist("job") if job_id))[:COMPARE_MAX_JOBS]
    chosen = {job.public_id: job for job in Job.objects.filter(project=project, public_id__in=chosen_ids)}
    if len(chosen) != len(chosen_ids):
        raise Http404("No such job.")
    metric = request.GET.get("metric") or "reward/mean"
    if len(metric) > 200:
        metric = "reward/mean"
    x_axis = request.GET.get("x") if request.GET.get("x") in COMPARE_X_AXES else "step"
    series = [
        {
            "id": job_id,
            "name": chosen[job_id].name or job_id,
            "status": chosen[job_id].status,
            "points": _compare_points(chosen[job_id], metric, x_axis),
        }
        for job_id in chosen_ids
    ]
    names = sorted({name for job in chosen.values() for name in metric_names(job=job)} | {metric})
    context = {
        "project": project,
        "recent_jobs": Job.objects.filter(project=project).order_by("-id")[:50],
        "chosen_ids": chosen_ids,
        "chosen_jobs": [chosen[job_id] for job_id in chosen_ids],
        "metric": metric,
        "metric_names": names,
        "x_axis": x_axis,
        "x_axes": COMPARE_X_AXES,
        "spec_differences": spec_differences([chosen[job_id].spec for job_id in chosen_ids]),
        "page_data": {"metric": metric, "series": series, "x": x_axis},
    }
    return _render(request, "dashboard/compare.html", context, access=access)


#: What the compare chart's x axis can be: the training step, wall time in minutes since the
#: job's first step (each job's own clock, so runs started at different times line up), or the
#: tokens trained on up to and including the step (the running sum of ``perf/tokens``).
COMPARE_X_AXES = {"step": "step", "time": "minutes since the first step", "tokens": "tokens trained on"}


def _compare_points(job: Job, metric: str, x_axis: str) -> list[list[float]]:
    """Return ``[x, value]`` of ``metric`` for each of ``job``'s steps that has it (on the tokens
    axis, only the steps whose token count is known: those with ``perf/tokens`` up to them)."""
    points = metric_points(job=job, params={"names": metric, "max_points": str(CHART_MAX_POINTS)})["data"]
    points = [point for point in points if metric in point["values"]]
    if x_axis == "step" or not points:
        return [[point["step"], point["values"][metric]] for point in points]
    if x_axis == "tokens":
        tokens_by_step = _cumulative_tokens(job)
        return [[tokens_by_step[point["step"]], point["values"][metric]] for point in points if point["step"] in tokens_by_step]
    start = datetime.fromisoformat(points[0]["time"].replace("Z", "+00:00"))
    return [
        [round((datetime.fromisoformat(point["time"].replace("Z", "+00:00")) - start).total_seconds() / 60, 3),
         point["values"][metric]]
        for point in points
    ]


def _cumulative_tokens(job: Job) -> dict[int, float]:
    """Return, per step, the tokens ``job`` trained on up to and including it (the running sum of
    every stored step's ``perf/tokens``; it stops at the first step without one, whose total is
    not known)."""
    totals, total = {}, 0.0
    rows = (
        MetricStep.objects.filter(job=job).order_by("step")
        .annotate(tokens=KeyTransform("perf/tokens", "values")).values_list("step", "tokens")
    )
    for expected, (step, tokens) in enumerate(rows, start=1):
        if step != expected or not isinstance(tokens, (int, float)):
            break
        total += tokens
        totals[step] = total
    return totals


def _flatten(value, prefix: str = "") -> dict[str, str]:
    """Return ``value``'s leaves by dotted path (list items by index), each as compact JSON."""
    if isinstance(value, dict):
        leaves: dict[str, str] = {}
        for key, item in value.items():
            leaves.update(_flatten(item, f"{prefix}{key}."))
        return leaves
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        leaves = {}
        for index, item in enumerate(value):
            leaves.update(_flatten(item, f"{prefix}{index}."))
        return leaves
    return {prefix.rstrip("."): json.dumps(value, ensure_ascii=False)}


def spec_differences(specs: list[dict]) -> list[tuple[str, list[str]]]:
    """Return ``(dotted key, [value in each spec])`` for every key whose value is not the same in
    all of ``specs`` (absent shows as ``–``), sorted by key; none for fewer than two specs."""
    if len(specs) < 2:
        return []
    flat = [_flatten(spec) for spec in specs]
    keys = sorted(set().union(*flat))
    rows = [(key, [leaves.get(key, "–") for leaves in flat]) for key in keys]
    return [(key, values) for key, values in rows if len(set(values)) > 1]
