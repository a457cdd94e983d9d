"""Prime's evaluation routes over Lab's evaluations (docs/prime-compat.md "Evaluations"): thin
adapters over ``evaluations.services``, ``evaluations.pushes`` and ``evaluations.selectors``.

What ``prime==0.18.0``'s ``prime eval`` and ``prime-evals==0.2.4``'s ``EvalsClient`` call:

- ``POST /hosted-evaluations`` (``prime eval run ENV --hosted``): a Lab evaluation of a catalogue
  model on the environments the hub lookup named; ``GET /hosted-evaluations/{id}/logs`` its job's
  log lines; ``PATCH /hosted-evaluations/{id}/cancel`` (``prime eval stop``).
- ``POST /evaluations/`` (``prime eval push``, ``create_evaluation``): a pushed evaluation;
  ``POST /evaluations/{id}/samples`` verifiers 0.3 ``results.jsonl`` rows;
  ``POST /evaluations/{id}/finalize``.
- ``GET /evaluations/``, ``GET /evaluations/{id}``, ``GET /evaluations/{id}/samples``: reads.
- ``GET /environmentshub/{owner}/{name}/@{version}``, ``POST /environmentshub/lookup`` and
  ``/resolve``: an environment Lab knows (a built-in, or one of the organization's packages) by
  Prime's references, answered with Lab's environment id.

Errors are Prime's ``{"detail": ...}`` (``jobs.api.prime.views.prime_exception_handler``); another
project's evaluation is the same ``404 No such evaluation.`` as a missing one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from django.db import transaction
from labsdk.vf_results import legacy_sample
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from engine.catalog import list_environments
from environments.builds import latest_build
from environments.services import EnvironmentRef, environment_catalogue, environment_get
from evaluations.models import Evaluation
from evaluations.prime.serializers import evaluation_to_prime, sample_to_prime, viewer_url
from evaluations.pushes import MAX_PUSH_BATCH, evaluation_push_create, evaluation_push_finalize, evaluation_push_samples
from evaluations.selectors import evaluation_list, evaluations_to_dicts
from evaluations.services import evaluation_cancel, evaluation_create
from jobs.api.prime.views import PrimeAPIView, invalid_run
from jobs.evaluation_samples import EvaluationSample
from jobs.selectors import job_logs_tail
from lab.api.errors import ApiError, FieldError
from lab.errors import LabError
from lab.ids import public_id
from lab.paging import int_param

_OPEN = ConfigDict(extra="forbid", strict=True)
Text = Annotated[str, StringConstraints(max_length=4096)]


def _problems(error: ValidationError) -> ApiError:
    """A body's validation ``error`` as the 422 Prime's clients print one problem a line."""
    return invalid_run([
        FieldError(".".join(str(part) for part in problem["loc"]) or None, problem["type"], problem["msg"])
        for problem in error.errors(include_url=False)
    ])


def _parse(model: type[BaseModel], data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise invalid_run([FieldError(None, "invalid_type", "the request body must be a JSON object")])
    try:
        return model.model_validate(dict(data))
    except ValidationError as error:
        raise _problems(error) from None


class _EvaluationRoute(PrimeAPIView):
    """An evaluation route: the key's project's evaluation by id (``No such evaluation.``) and
    Prime's object for it."""

    def evaluation(self, evaluation_id: str) -> Evaluation:
        return self.get_owned(Evaluation.objects.select_related("job", "project__organization"), evaluation_id, "evaluation")

    def prime_object(self, evaluation: Evaluation) -> dict[str, Any]:
        return evaluation_to_prime(evaluation, evaluations_to_dicts([evaluation])[0])


# --- the environment hub, read only ----------------------------------------------------------------


def _environment(project, reference: str) -> dict[str, Any] | None:
    """Lab's environment for a Prime reference (``owner/name``, ``owner/name@version``, an exact
    Lab id, or a bare name: a built-in ``lab/<name>`` or the organization's ``<org>/<name>``), as
    the hub's ``{"id", "owner", "name", "version"}``; None for one Lab does not know here."""
    built_in = {info.id: info for info in list_environments().values()}
    packages = environment_catalogue(organization=project.organization)
    candidates = [reference] if "/" in reference else [f"lab/{reference}", f"{project.organization.slug}/{reference}"]
    for candidate in candidates:
        base, _, version = candidate.partition("@")
        info = built_in.get(base) if version in ("", "latest") else None
        info = info or packages.get(candidate) or packages.get(base if version == "latest" else candidate)
        if info is not None:
            owner, _, name = info.id.partition("@")[0].partition("/")
            return {"id": info.id, "owner": owner, "name": name, "version": info.id.partition("@")[2] or "builtin"}
    return None


def _found(project, reference: str) -> dict[str, Any]:
    found = _environment(project, reference[:300])
    if found is None:
        raise ApiError(404, "not_found", f"No environment {reference[:100]!r} on this Lab: see GET /api/v1/environments.")
    return {"data": found}


class HubVersionView(PrimeAPIView):
    """``GET /environmentshub/{owner}/{name}/@{version}`` (also ``prime env info``): ``{"data":
    {"id", "owner", "name", "version"}}``; for one of the organization's packages also its
    ``metadata.description``, ``visibility`` (``PRIVATE``: the organization's only) and the
    ``build_status`` of its build."""

    required_scope = "read"

    def get(self, request: Request, owner: str, name: str, version: str) -> Response:
        found = _found(self.project, f"{owner}/{name}@{version}")
        if found["data"]["owner"] == self.project.organization.slug:
            package = environment_get(organization=self.project.organization, environment_id=found["data"]["id"])
            build = latest_build(package)
            found["data"] |= {
                "metadata": {"description": package.summary},
                "visibility": "PRIVATE",
                "build_status": build.status if build else None,
            }
        return Response(found)


class HubLookupView(PrimeAPIView):
    """``POST /environmentshub/lookup`` ``{"id"}`` and ``/resolve`` ``{"name"}``: find, never create."""

    required_scope = "read"
    key = "id"

    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, Mapping) else {}
        value = body.get(self.key)
        if not isinstance(value, str) or not value:
            raise invalid_run([FieldError(self.key, "missing", f"{self.key} is required")])
        return Response(_found(self.project, value))


class HubResolveView(HubLookupView):
    """``POST /environmentshub/resolve`` ``{"name"}``: Prime's get-or-create, which ``prime env
    push`` starts with and ``prime-evals`` resolves bare names by. A known environment answers
    ``{"data": {"id", "owner": {"name"}, "name", "version", "created": false}}``; a bare name
    the organization has not pushed yet answers ``created: true`` with the id ``<org>/<name>``
    its first push makes (nothing is stored until a wheel is finalized). A reference of another
    organization, or with a version, that Lab does not know is the 404."""

    key = "name"

    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, Mapping) else {}
        value = body.get(self.key)
        if not isinstance(value, str) or not value:
            raise invalid_run([FieldError(self.key, "missing", f"{self.key} is required")])
        found = _environment(self.project, value[:300])
        if found is None:
            ref = EnvironmentRef.parse(f"{self.project.organization.slug}/{value}")
            if "/" in value or ref is None or ref.version is not None:
                raise ApiError(404, "not_found", f"No environment {value[:100]!r} on this Lab: see GET /api/v1/environments.")
            found = {"id": f"{ref.organization}/{ref.name}", "owner": ref.organization, "name": ref.name, "version": None}
        return Response({"data": found | {"owner": {"name": found["owner"]}, "created": found["version"] is None}})


# --- hosted evaluations ----------------------------------------------------------------------------


class HostedEvalConfig(BaseModel):
    """``eval_config`` of ``POST /hosted-evaluations`` (``prime_cli ... _build_hosted_eval_config``)."""

    model_config = _OPEN
    num_examples: int
    rollouts_per_example: int
    env_args: dict[str, JsonValue] | None = None
    sampling_args: dict[str, JsonValue] | None = None
    allow_sandbox_access: bool = True
    allow_instances_access: bool = False
    allow_tunnel_access: bool = True
    max_concurrent: int | None = None
    verbose: bool = False
    #: What Lab cannot do for a hosted evaluation: refused, naming each (``_UNSUPPORTED_HOSTED``).
    timeout_minutes: int | None = None
    custom_secrets: dict[str, JsonValue] | None = None
    max_retries: int | None = None
    state_columns: list[JsonValue] | None = None
    independent_scoring: bool = False
    headers: list[JsonValue] | dict[str, JsonValue] | None = None
    extra_env_kwargs: dict[str, JsonValue] | None = None
    api_client_type: str | None = None
    api_base_url: str | None = None
    api_key_var: str | None = None


_UNSUPPORTED_HOSTED = {
    "timeout_minutes": "Lab bounds an evaluation by its job's runtime limit, not a per-evaluation timeout",
    "custom_secrets": "an evaluation of a catalogue model takes no secrets here",
    "max_retries": "Lab retries an evaluation as a whole (prime eval has no retry; use lab evals retry)",
    "state_columns": "Lab keeps each sample's prompt, completion, scores and info, not extra state columns",
    "independent_scoring": "Lab scores each rollout with its environment's rubric as it runs",
    "headers": "Lab evaluates its catalogue models, not an endpoint that needs headers",
    "extra_env_kwargs": "pass environment arguments as env_args (--env-args)",
    "api_client_type": "Lab samples its catalogue models with its own engine",
    "api_base_url": "Lab evaluates its catalogue models and checkpoints, not an OpenAI-compatible endpoint",
    "api_key_var": "Lab evaluates its catalogue models and checkpoints, not an OpenAI-compatible endpoint",
}
_SAMPLING_KEYS = {"temperature", "top_p", "max_tokens", "seed"}


class HostedCreate(BaseModel):
    """The body of ``POST /hosted-evaluations`` (``prime_evals ... create_hosted_evaluation``)."""

    model_config = _OPEN
    environment_ids: Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=300)]], Field(min_length=1, max_length=16)]
    inference_model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    eval_config: HostedEvalConfig
    name: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    team_id: Text | None = None


def hosted_body(request: HostedCreate) -> dict[str, Any]:
    """The body of Lab's ``POST /evaluations`` for a hosted run. Raises the 422 naming every
    ``eval_config`` key Lab cannot honour and every sampling argument it does not take."""
    config = request.eval_config
    problems = [
        FieldError(f"eval_config.{key}", "unsupported", why)
        for key, why in _UNSUPPORTED_HOSTED.items()
        if getattr(config, key) not in (None, False)
    ]
    sampling = dict(config.sampling_args or {})
    problems += [
        FieldError(f"eval_config.sampling_args.{key}", "unsupported", "Lab takes temperature, top_p, max_tokens and seed")
        for key in sorted(set(sampling) - _SAMPLING_KEYS)
    ]
    if problems:
        raise invalid_run(problems)
    return {
        **({"name": request.name} if request.name else {}),
        "model": {"type": "model", "id": request.inference_model},
        "environments": [
            {
                "id": environment, "args": dict(config.env_args or {}),
                "num_examples": "all" if config.num_examples == -1 else config.num_examples,
                "rollouts_per_example": config.rollouts_per_example,
            }
            for environment in request.environment_ids
        ],
        "sampling": sampling,
        "metadata": {"source": "prime eval run --hosted"},
    }


class HostedEvaluationsView(_EvaluationRoute):
    """``POST /hosted-evaluations``: ``{"evaluation_id"}`` of a queued Lab evaluation; its refusals
    (an unknown model or environment, bad arguments) are a 422 listing each, as ``POST
    /evaluations`` words them."""

    def post(self, request: Request) -> Response:
        body = hosted_body(_parse(HostedCreate, request.data))
        try:
            evaluation = evaluation_create(project=self.project, actor=self.actor, data=body)
        except LabError as error:  # a refused body: the 422 Prime's CLI prints one problem a line
            if error.code == "invalid_request" and error.errors:
                raise invalid_run([FieldError(item.param, item.code, item.message) for item in error.errors]) from None
            raise
        return Response({"evaluation_id": evaluation.public_id, "viewer_url": viewer_url(evaluation)})


class HostedLogsView(_EvaluationRoute):
    """``GET /hosted-evaluations/{id}/logs``: ``{"logs"}``, the job's last 1,000 log lines."""

    required_scope = "read"

    def get(self, request: Request, evaluation_id: str) -> Response:
        evaluation = self.evaluation(evaluation_id)
        lines = job_logs_tail(job=evaluation.job, limit=1000)
        return Response({"logs": "\n".join(f"{line['time']} {line['line']}" for line in lines)})


class HostedCancelView(_EvaluationRoute):
    """``PATCH /hosted-evaluations/{id}/cancel``: ``{"message"}`` (``evaluation_cancel``)."""

    def patch(self, request: Request, evaluation_id: str) -> Response:
        evaluation = evaluation_cancel(evaluation=self.evaluation(evaluation_id), actor=self.actor)
        return Response({"message": f"Evaluation {evaluation.public_id} is {evaluation.job.status}.", "evaluation_id": evaluation.public_id})


# --- pushed evaluations and reads ------------------------------------------------------------------


class PrimeEnvironmentRef(BaseModel):
    model_config = _OPEN
    id: Annotated[str, StringConstraints(min_length=1, max_length=300)]
    version_id: Text | None = None


class PrimeCreate(BaseModel):
    """The body of ``POST /evaluations/`` (``prime_evals ... create_evaluation``)."""

    model_config = _OPEN
    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    environments: Annotated[list[PrimeEnvironmentRef], Field(min_length=1, max_length=1)] | None = None
    suite_id: None = None
    run_id: None = None
    model_name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    dataset: Text | None = None
    framework: Text | None = None
    task_type: Text | None = None
    description: Text | None = None
    tags: Annotated[list[Text], Field(max_length=64)] = Field(default_factory=list)
    metadata: dict[str, JsonValue] | None = None
    metrics: dict[str, JsonValue] | None = None
    team_id: Text | None = None
    is_public: Literal[False] | None = None


class EvaluationsView(_EvaluationRoute):
    """``GET /evaluations/?skip&limit&environment_name``: ``{"evaluations", "total"}``, newest
    first; ``POST /evaluations/``: a pushed evaluation, ``{"evaluation_id", ...}``."""

    def get(self, request: Request) -> Response:
        params = request.query_params
        skip = int_param(params, "skip", minimum=0, maximum=10**7, default=0)
        limit = int_param(params, "limit", minimum=1, maximum=100, default=50)
        evaluations = evaluation_list(project=self.project).select_related("project__organization").order_by("-pk")
        environment = params.get("environment_name")
        if environment:
            evaluations = [item for item in evaluations if any(
                env["id"] == environment or env["id"].partition("@")[0] in (environment, f"lab/{environment}")
                or env["id"].partition("@")[0].endswith(f"/{environment}") for env in item.environments
            )]
        page = list(evaluations[skip : skip + limit])
        total = len(evaluations) if isinstance(evaluations, list) else evaluations.count()
        lab = evaluations_to_dicts(page)
        return Response({
            "evaluations": [evaluation_to_prime(item, body) for item, body in zip(page, lab)],
            "total": total, "skip": skip, "limit": limit,
        })

    def post(self, request: Request) -> Response:
        data = request.data if isinstance(request.data, Mapping) else None
        for key, why in (("run_id", "Lab evaluates runs' checkpoints itself (lab checkpoints eval)"),
                         ("suite_id", "Lab has no evaluation suites")):
            if isinstance(data, Mapping) and data.get(key) is not None:
                raise invalid_run([FieldError(key, "unsupported", why)])
        create = _parse(PrimeCreate, request.data)
        if not create.environments:
            raise invalid_run([FieldError("environments", "missing", "name the one environment these results are of")])
        metadata = dict(create.metadata or {})
        sampling = metadata.get("sampling_args") if isinstance(metadata.get("sampling_args"), dict) else {}
        body = {
            "push_id": f"prime-{public_id('push')}", "name": create.name, "model": create.model_name,
            "environment": {"id": create.environments[0].id, "args": metadata.get("env_args") if isinstance(metadata.get("env_args"), dict) else {}},
            "sampling": {key: sampling[key] for key in ("temperature", "top_p", "max_tokens") if isinstance(sampling.get(key), int | float)},
            "details": {
                "format": "prime-evals", "framework": create.framework, "task_type": create.task_type, "tags": create.tags,
                "description": create.description, "metadata": metadata, "metrics": create.metrics or {},
            },
        }
        evaluation, _ = evaluation_push_create(project=self.project, actor=self.actor, data=body)
        return Response(self.prime_object(evaluation))


class EvaluationDetailView(_EvaluationRoute):
    """``GET /evaluations/{id}``: Prime's evaluation object. ``PUT`` (``prime eval push --eval-id``,
    ``update_evaluation``) is refused: a pushed evaluation's fields stay as pushed."""

    def get(self, request: Request, evaluation_id: str) -> Response:
        return Response(self.prime_object(self.evaluation(evaluation_id)))

    def put(self, request: Request, evaluation_id: str) -> Response:
        self.evaluation(evaluation_id)
        raise ApiError(
            409, "invalid_state",
            "Lab does not change an evaluation's fields or samples after the fact: push the run as a new evaluation.",
        )


class EvaluationSamplesView(_EvaluationRoute):
    """``GET /evaluations/{id}/samples?page&limit``: ``{"samples", "total", "page", "limit",
    "has_more"}`` in example and rollout order; ``POST``: ``{"samples": [results.jsonl rows]}``,
    each its example's next rollout (``evaluation_push_samples``)."""

    def get(self, request: Request, evaluation_id: str) -> Response:
        evaluation = self.evaluation(evaluation_id)
        page = int_param(request.query_params, "page", minimum=1, maximum=10**6, default=1)
        limit = int_param(request.query_params, "limit", minimum=1, maximum=1000, default=100)
        samples = EvaluationSample.objects.filter(job=evaluation.job_id).order_by("environment", "example", "rollout")
        total = samples.count()
        ids = [environment["id"] for environment in evaluation.environments]
        rows = [sample_to_prime(sample, ids) for sample in samples[(page - 1) * limit : page * limit]]
        return Response({"samples": rows, "total": total, "page": page, "limit": limit, "has_more": page * limit < total})

    def post(self, request: Request, evaluation_id: str) -> Response:
        evaluation = self.evaluation(evaluation_id)
        rows = request.data.get("samples") if isinstance(request.data, Mapping) else None
        if not isinstance(rows, list) or not rows:
            raise invalid_run([FieldError("samples", "invalid_type", "samples must be a non-empty list of results.jsonl rows")])
        problems, samples = [], []
        for index, row in enumerate(rows):
            example = row.get("example_id", row.get("id")) if isinstance(row, Mapping) else None
            if not isinstance(example, int) or isinstance(example, bool) or example < 0:
                problems.append(FieldError(f"samples.{index}.example_id", "invalid_type", "example_id must be a whole number of at least 0"))
                continue
            samples.append(legacy_sample(dict(row), example=example, rollout=None))
        if problems:
            raise invalid_run(problems)
        accepted = duplicates = 0
        with transaction.atomic():  # Prime batches by bytes; Lab stores 1,000 samples a call, all or none
            for start in range(0, len(samples), MAX_PUSH_BATCH):
                counts = evaluation_push_samples(evaluation=evaluation, data={"samples": samples[start : start + MAX_PUSH_BATCH]})
                accepted, duplicates = accepted + counts["accepted"], duplicates + counts["duplicates"]
        return Response({"samples_pushed": accepted, "duplicates": duplicates})


class EvaluationFinalizeView(_EvaluationRoute):
    """``POST /evaluations/{id}/finalize``: Prime's evaluation object, ``COMPLETED`` with Lab's
    results and its ``viewer_url`` (``evaluation_push_finalize``). Prime's ``metrics`` in the body
    are not taken: Lab counts its own from the samples."""

    def post(self, request: Request, evaluation_id: str) -> Response:
        evaluation = evaluation_push_finalize(evaluation=self.evaluation(evaluation_id), actor=self.actor)
        return Response(self.prime_object(evaluation))
