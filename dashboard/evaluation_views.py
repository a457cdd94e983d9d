"""Dashboard pages for evaluations (docs/evaluations.md): the project's list, an evaluation's page
(summary per environment, reward histograms, its samples), one sample, the comparison of two to
five evaluations example by example, the "Evaluate" form of a checkpoint, an adapter or a model,
and cancel, retry and delete.

Thin adapters over ``evaluations.services`` and ``evaluations.selectors``, shown through
``dashboard.evaluation_presenter``. Every evaluation is looked up *with* the project that
``dashboard.access`` resolved for the signed-in member, so another organization's evaluation (or
sample, checkpoint, adapter) is the same 404 as a missing one. Any member may start, cancel, retry
and delete the project's evaluations, as a read-write API key of the project may.

An evaluation that runs keeps its summary current by polling it (``evaluation_summary``, every
3 s until it ends): its samples arrive without a live-stream event each, so the stream of its job
would not move the progress.
"""

from __future__ import annotations

import json
import secrets

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods

from dashboard.access import OrganizationAccess, project_view, refusal_message
from dashboard.evaluation_forms import EvaluationForm
from dashboard.evaluation_presenter import (
    agreement_matrix,
    comparison_rows,
    completion_turns,
    environment_summaries,
    info_text,
    list_row,
    sample_text,
    target_label,
    turns,
)
from dashboard.views import _actor, _render
from evaluations.models import Evaluation
from evaluations.selectors import (
    MAX_COMPARED,
    MIN_COMPARED,
    evaluation_comparison,
    evaluation_list,
    evaluation_reward_histogram,
    evaluation_sample_get,
    evaluation_samples,
    evaluations_to_dicts,
    example_first_samples,
)
from evaluations.serializers import sample_to_dict
from evaluations.services import evaluation_cancel, evaluation_create, evaluation_delete, evaluation_retry
from jobs.api.environments import environment_objects
from jobs.artifacts.kinds import ADAPTER, CHECKPOINT
from jobs.models import JobStatus
from jobs.specs import installed_models
from lab.errors import LabError
from lab.idempotency import StoredAnswer, run_once
from lab.models import Project
from lab.tenancy import get_owned

EVALUATIONS_PAGE_SIZE = 25
SAMPLES_PAGE_SIZE = 50
COMPARED_EXAMPLES_PAGE_SIZE = 25
HISTOGRAM_BINS = 10
#: The evaluations the comparison's picker offers (the project's newest).
PICKER_EVALUATIONS = 50
#: The evaluation ids of a comparison's query that are read (more than ``MAX_COMPARED`` are refused).
COMPARE_IDS_READ = 20
#: What a comparison shows by default: the examples the evaluations disagree on.
COMPARE_SHOW_DEFAULT = "disagree"


def _no_such(what: str) -> Http404:
    return Http404(f"No such {what}.")


def _evaluation(project: Project, evaluation_id: str) -> Evaluation:
    """Return the project's evaluation ``evaluation_id``; Http404 for a missing or foreign one."""
    return get_owned(Evaluation.objects.select_related("job", "project"), project, evaluation_id, "evaluation", error=_no_such)


def _query_without(request: HttpRequest, *names: str) -> str:
    """The request's query string without ``names`` (to which a pager adds its page)."""
    query = request.GET.copy()
    for name in names:
        query.pop(name, None)
    return query.urlencode()


# --- the project's evaluations -----------------------------------------------------------------


@require_GET
@project_view
def evaluation_list_view(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """The project's evaluations, newest first (``?status=``; an unknown one shows all, with a
    notice): name, what is scored, environments, status, reward mean per environment, created."""
    status = request.GET.get("status") or ""
    problem = f"Unknown status {status[:40]!r}; showing every evaluation." if status and status not in JobStatus.values else ""
    evaluations = evaluation_list(project=project, status=None if problem else status or None).order_by("-id")
    page = Paginator(evaluations, EVALUATIONS_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "project": project,
        "page": page,
        "rows": [list_row(shown) for shown in evaluations_to_dicts(list(page))],
        "status": "" if problem else status,
        "status_problem": problem,
        "statuses": JobStatus.values,
    }
    return _render(request, "dashboard/evaluations.html", context, access=access)


# --- one evaluation ----------------------------------------------------------------------------


def _summary_context(evaluation: Evaluation) -> dict:
    """The evaluation's header and summary: the Evaluation object, each environment's results and
    reward histogram, and whether it still runs (the page polls the summary until it ends)."""
    shown = evaluations_to_dicts([evaluation])[0]
    histograms = [
        evaluation_reward_histogram(evaluation=evaluation, environment=index, bins=HISTOGRAM_BINS)
        for index in range(len(evaluation.environments))
    ]
    return {
        "evaluation": evaluation,
        "shown": shown,
        "target": target_label(shown),
        "summaries": environment_summaries(shown, histograms),
        "running": shown["status"] not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED),
    }


@require_GET
@project_view
def evaluation_detail(request: HttpRequest, access: OrganizationAccess, project: Project, evaluation_id: str) -> HttpResponse:
    """An evaluation's page: its status and summary per environment (reward mean ± standard error,
    pass@k, each reward function's mean, errors, timeouts, tokens), reward histograms, and its
    samples, filtered by ``?environment=`` (an id), ``?min_reward=`` and ``?max_reward=`` and paged
    by ``?page=``. A filter the API would refuse is shown with the API's message, as a 400."""
    evaluation = _evaluation(project, evaluation_id)
    context = {"project": project, **_summary_context(evaluation)}
    filters = {name: (request.GET.get(name) or "")[:300] for name in ("environment", "min_reward", "max_reward")}
    context.update(filters=filters, samples_query=_query_without(request, "page"), status=200)
    try:
        samples = evaluation_samples(evaluation=evaluation, params=filters).order_by("id")
    except LabError as error:
        context.update(samples_problem=error.message, status=400)
    else:
        page = Paginator(samples, SAMPLES_PAGE_SIZE).get_page(request.GET.get("page"))
        ids = [environment["id"] for environment in evaluation.environments]
        context.update(samples_page=page, samples=[sample_to_dict(sample, ids) for sample in page])
    return _render(request, "dashboard/evaluation.html", context, access=access, status=context["status"])


@require_GET
@project_view
def evaluation_summary(request: HttpRequest, access: OrganizationAccess, project: Project, evaluation_id: str) -> HttpResponse:
    """The evaluation page's header and summary alone, which the page polls while it runs."""
    evaluation = _evaluation(project, evaluation_id)
    context = {"project": project, **_summary_context(evaluation)}
    return _render(request, "dashboard/_evaluation_summary.html", context, access=access)


@require_GET
@project_view
def evaluation_sample(
    request: HttpRequest, access: OrganizationAccess, project: Project, evaluation_id: str, sample_id: str
) -> HttpResponse:
    """One sample: its prompt and completion as turns, its answer, reward and each reward
    function's score, its ``info`` and tokens, and the same as plain text laid out alike for every
    sample (``?format=text`` answers that text alone, to ``diff`` two samples)."""
    evaluation = _evaluation(project, evaluation_id)
    try:
        sample = evaluation_sample_get(evaluation=evaluation, sample_id=sample_id)
    except LabError:
        raise _no_such("sample") from None
    shown = sample_to_dict(sample, [environment["id"] for environment in evaluation.environments])
    text = sample_text(shown, evaluation.public_id)
    if request.GET.get("format") == "text":
        return HttpResponse(text, content_type="text/plain; charset=utf-8")
    context = {
        "project": project,
        "evaluation": evaluation,
        "sample": shown,
        "prompt_turns": turns(shown["prompt"]),
        "completion_turns": completion_turns(shown["completion"]),
        "functions": sorted(shown["functions"].items()),
        "info": info_text(shown["info"]),
        "text": text,
    }
    return _render(request, "dashboard/evaluation_sample.html", context, access=access)


# --- compare -----------------------------------------------------------------------------------


@require_GET
@project_view
def evaluation_compare(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """Compare 2 to 5 of the project's evaluations (``?evaluation=eval_a&evaluation=eval_b``) on
    an environment they all ran (``?environment=``, by default the first): how many examples
    each solves that another does not, and the examples side by side (``?show=disagree`` by
    default, or ``all``, ``solved``, ``unsolved``, ``only:<i>``), paged by ``?page=``.

    An evaluation id that is not the project's is a 404, as on every page; evaluations that
    share no environment, or a choice the comparison cannot make, are a 400 saying why.
    """
    chosen_ids = list(dict.fromkeys(value[:64] for value in request.GET.getlist("evaluation") if value))[:COMPARE_IDS_READ]
    chosen = {
        evaluation.public_id: evaluation
        for evaluation in Evaluation.objects.filter(project=project, public_id__in=chosen_ids).select_related("job")
    }
    if len(chosen) != len(chosen_ids):
        raise _no_such("evaluation")
    evaluations = [chosen[evaluation_id] for evaluation_id in chosen_ids]
    show = request.GET.get("show") or COMPARE_SHOW_DEFAULT
    recent = list(Evaluation.objects.filter(project=project).select_related("job").order_by("-id")[:PICKER_EVALUATIONS])
    recent += [evaluation for evaluation in evaluations if evaluation not in recent]  # an older pick stays offered
    context = {
        "project": project,
        "recent": recent,
        "chosen_ids": chosen_ids,
        "show": show,
        "max_compared": MAX_COMPARED,
        "query": _query_without(request, "page"),
        "status": 200,
    }
    if len(evaluations) >= MIN_COMPARED:
        try:
            comparison = evaluation_comparison(evaluations=evaluations, environment=request.GET.get("environment") or None)
            keys = comparison.rows(show)
        except LabError as error:
            context.update(problem=error.message, status=400)
        else:
            context.update(_comparison_context(comparison, keys, request.GET.get("page")))
    return _render(request, "dashboard/evaluation_compare.html", context, access=access, status=context["status"])


def _comparison_context(comparison, keys: list[str], page_number: str | None) -> dict:
    """What the comparison page shows of ``comparison``: one column per evaluation (with its
    results on the environment), the agreement matrix, and a page of the example rows ``keys``."""
    page = Paginator(keys, COMPARED_EXAMPLES_PAGE_SIZE).get_page(page_number)
    first_samples = [
        example_first_samples(
            evaluation=evaluation, environment=index,
            examples=[outcome.example for outcome in (outcomes.get(key) for key in page) if outcome is not None],
        )
        for evaluation, index, outcomes in zip(comparison.evaluations, comparison.environment_indexes, comparison.outcomes)
    ]
    common = comparison.common()
    shown = evaluations_to_dicts(list(comparison.evaluations))
    columns = [
        {
            "evaluation": evaluation,
            "shown": item,
            "target": target_label(item),
            "environment_id": environment_id,
            "result": (item["results"] or {}).get(environment_id),
            "scored": len(outcomes),
            "solved": sum(1 for key in common if outcomes[key].solved),
            "only": f"only:{index}",
        }
        for index, (evaluation, item, environment_id, outcomes) in enumerate(zip(
            comparison.evaluations, shown, comparison.environment_ids, comparison.outcomes
        ))
    ]
    return {
        "comparison": comparison,
        "columns": columns,
        "common": len(common),
        "matrix": list(zip(columns, agreement_matrix(comparison))),
        "rows_page": page,
        "rows": comparison_rows(comparison, list(page), first_samples),
        "row_count": len(keys),
    }


# --- starting one ------------------------------------------------------------------------------


def _target_from_query(request: HttpRequest, project: Project) -> tuple[str, str, dict]:
    """What the form evaluates, from ``?checkpoint=`` or ``?adapter=`` (the project's, else a 404)
    or ``?model=``, with the initial values its job suggests (the environments and arguments it
    trained on, its max tokens and resources, a name saying what it is)."""
    for kind in (CHECKPOINT, ADAPTER):
        artifact_id = (request.GET.get(kind.name) or "")[:64]
        if artifact_id:
            artifact = get_owned(kind.model.objects.select_related("job"), project, artifact_id, kind.name, error=_no_such)
            job = artifact.job
            blocks = [block for block in job.spec.get("env") or [] if isinstance(block, dict) and block.get("id")]
            initial = {
                "name": f"{job.name or job.public_id} step {artifact.step}",
                "environments": [block["id"] for block in blocks],
                "args": _arguments_text(blocks),
                "max_tokens": (job.spec.get("sampling") or {}).get("max_tokens", 128),
                "gpu_type": (job.spec.get("resources") or {}).get("gpu_type", "cpu"),
                "gpus": (job.spec.get("resources") or {}).get("gpus"),
            }
            return kind.name, artifact.public_id, initial
    return "model", (request.GET.get("model") or "")[:256], {}


def _arguments_text(blocks: list[dict]) -> str:
    """The arguments of the job's environment blocks as the form's JSON (empty when none has any)."""
    arguments = {block["id"]: block["args"] for block in blocks if block.get("args")}
    return json.dumps(arguments) if arguments else ""


@require_http_methods(["GET", "POST"])
@project_view
def evaluation_new(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """"Evaluate": a small form that starts an evaluation of a checkpoint (``?checkpoint=``), an
    adapter (``?adapter=``) or a catalogue model (``?model=``, or picked here) on environments the
    organization may use, through ``evaluations.services.evaluation_create``, what ``POST
    /evaluations`` does. A form posted twice (a double click, a resend) starts one evaluation:
    its one-time token is the project's idempotency key ``dashboard-new-evaluation:<token>``."""
    source = request.POST if request.method == "POST" else request.GET
    target_type, target_id, initial = _target_from_source(request, project, source)
    environment_ids = [item["id"] for item in environment_objects(project.organization)]
    for extra in initial.get("environments", []):
        if extra not in environment_ids:
            environment_ids.append(extra)
    status = 200
    if request.method == "POST":
        submission = request.POST.get("submission") or secrets.token_urlsafe(24)
        form = EvaluationForm(request.POST, environment_ids=environment_ids)
        if form.is_valid():
            body = form.body()
            try:
                evaluation, first_time = _create_once(request, project, body, token=form.cleaned_data["submission"])
            except LabError as error:
                if error.code == "not_found":
                    raise _no_such(target_type) from None
                if error.code == "idempotency_conflict":
                    # This form's token started an evaluation of other values already: sending
                    # these values again is a deliberate new one, which gets a token of its own.
                    messages.warning(request, "This form already started an evaluation with other values; "
                                              "submit it again to start another one.")
                    submission = secrets.token_urlsafe(24)
                else:
                    form.add_problems(error)
                status = 400
            else:
                if evaluation is None:
                    messages.info(request, "This evaluation was already started.")
                    return redirect("evaluations", org_slug=access.organization.slug, project_slug=project.slug)
                (messages.success if first_time else messages.info)(
                    request, f"{'Started' if first_time else 'Already started:'} {evaluation.name or evaluation.public_id}."
                )
                return redirect(
                    "evaluation", org_slug=access.organization.slug, project_slug=project.slug,
                    evaluation_id=evaluation.public_id,
                )
        else:
            status = 400
    else:
        submission = secrets.token_urlsafe(24)
        form = EvaluationForm(
            initial={**initial, "target_type": target_type, "target_id": target_id, "submission": submission},
            environment_ids=environment_ids,
        )
    context = {
        "project": project,
        "form": form,
        "target_type": target_type,
        "target_id": target_id,
        "models": sorted(installed_models(project.organization)) if target_type == "model" else [],
        "submission": submission,
    }
    return _render(request, "dashboard/evaluation_new.html", context, access=access, status=status)


def _target_from_source(request: HttpRequest, project: Project, source) -> tuple[str, str, dict]:
    """The target of the form: on a POST its hidden fields (a checkpoint or adapter looked up
    in the project, else a 404), on a GET the query (``_target_from_query``)."""
    if request.method == "POST":
        kind = {CHECKPOINT.name: CHECKPOINT, ADAPTER.name: ADAPTER}.get(source.get("target_type") or "")
        target_id = (source.get("target_id") or "")[:256]
        if kind is not None:
            get_owned(kind.model.objects, project, target_id, kind.name, error=_no_such)
            return kind.name, target_id, {}
        return "model", target_id, {}
    return _target_from_query(request, project)


def _create_once(request: HttpRequest, project: Project, body: dict, *, token: str) -> tuple[Evaluation | None, bool]:
    """Create the evaluation of ``body`` once per submission token (issued with the form).

    Returns ``(evaluation, True)`` when created now, ``(evaluation, False)`` when the token was
    used already (``None`` if that evaluation has since been deleted). The same token with
    another body is refused (``idempotency_conflict``). Without a token, it just creates.
    """
    def create() -> Evaluation:
        return evaluation_create(project=project, actor=_actor(request), data=body)

    if not token:
        return create(), True
    result = run_once(
        project=project, key=f"dashboard-new-evaluation:{token}", request_hash=EvaluationForm.digest(body),
        work=create, answer=lambda evaluation: StoredAnswer(201, {"id": evaluation.public_id}), param="submission",
    )
    if isinstance(result, StoredAnswer):
        evaluation_id = (result.body or {}).get("id") or ""
        return Evaluation.objects.filter(project=project, public_id=evaluation_id).first(), False
    return result, True


# --- cancel, retry, delete ---------------------------------------------------------------------


def _evaluation_action(request, access, project, evaluation_id, *, verb: str, act) -> HttpResponse:
    """Confirm (GET) then do (POST) ``act(evaluation=..., actor=...)``; a refused action changes
    nothing and says why on the evaluation's page. After a delete, the list."""
    evaluation = _evaluation(project, evaluation_id)
    label = evaluation.name or evaluation.public_id
    if request.method == "POST":
        try:
            act(evaluation=evaluation, actor=_actor(request))
        except LabError as error:
            messages.error(request, refusal_message(error))
        else:
            messages.success(request, f"{'Deleted' if verb == 'delete' else verb.capitalize() + ' requested for'} {label}.")
            if verb == "delete":
                return redirect("evaluations", org_slug=access.organization.slug, project_slug=project.slug)
        return redirect("evaluation", org_slug=access.organization.slug, project_slug=project.slug, evaluation_id=evaluation.public_id)
    shown = evaluations_to_dicts([evaluation])[0]
    context = {"project": project, "evaluation": evaluation, "shown": shown, "verb": verb}
    return _render(request, "dashboard/evaluation_confirm.html", context, access=access)


@require_http_methods(["GET", "POST"])
@project_view
def evaluation_cancel_view(request: HttpRequest, access: OrganizationAccess, project: Project, evaluation_id: str) -> HttpResponse:
    """Confirm, then cancel the evaluation (``evaluations.services.evaluation_cancel``)."""
    return _evaluation_action(request, access, project, evaluation_id, verb="cancel", act=evaluation_cancel)


@require_http_methods(["GET", "POST"])
@project_view
def evaluation_retry_view(request: HttpRequest, access: OrganizationAccess, project: Project, evaluation_id: str) -> HttpResponse:
    """Confirm, then run a failed or cancelled evaluation again (``evaluation_retry``)."""
    return _evaluation_action(request, access, project, evaluation_id, verb="retry", act=evaluation_retry)


@require_http_methods(["GET", "POST"])
@project_view
def evaluation_delete_view(request: HttpRequest, access: OrganizationAccess, project: Project, evaluation_id: str) -> HttpResponse:
    """Confirm, then delete an ended evaluation with its samples (``evaluation_delete``)."""
    return _evaluation_action(request, access, project, evaluation_id, verb="delete", act=evaluation_delete)
