"""Reads of evaluations: a project's list, one evaluation as the API shows it, its samples filtered
by environment and reward, one sample, an environment's reward histogram, the comparison of
several evaluations example by example, and an environment's evaluations (docs/evaluations.md)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Avg, Count, F, FloatField, Max, Min, Q, QuerySet, Sum, TextField, Value
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Floor, Least
from packaging.version import InvalidVersion, Version

from evaluations.models import Evaluation
from evaluations.results import SUCCESS_REWARD
from evaluations.serializers import Progress, evaluation_to_dict
from evaluations.services import evaluation_settle
from evaluations.specs import MAX_ENVIRONMENTS
from jobs.evaluation_samples import EvaluationSample
from jobs.models import JobStatus
from lab.errors import FieldError, LabError, not_found
from lab.models import Organization, Project


def evaluation_list(*, project: Project, status: str | None = None) -> QuerySet:
    """Return ``project``'s evaluations with their jobs, optionally of one job ``status``.
    Raises LabError ``invalid_request`` for an unknown status."""
    evaluations = Evaluation.objects.filter(project=project).select_related("job")
    if status:
        if status not in JobStatus.values:
            raise LabError(
                "invalid_request", f"Unknown status {status[:40]!r}; use one of {', '.join(JobStatus.values)}.",
                errors=[FieldError("status", "invalid_value", "unknown status")],
            )
        evaluations = evaluations.filter(job__status=status)
    return evaluations


def evaluations_to_dicts(evaluations: list[Evaluation]) -> list[dict[str, Any]]:
    """Return the Evaluation objects of ``evaluations`` (a page): their progress is read in one
    query, and an evaluation whose job has ended without its results counted yet is settled
    first (``evaluation_settle``: the task that does it after the end may not have run yet), so
    that an ended evaluation is never shown without its results."""
    for index, evaluation in enumerate(evaluations):
        job = evaluation.job
        if job.is_terminal and evaluation.results_for != job.finished_at:
            evaluations[index] = evaluation_settle(job_id=job.pk) or evaluation
    progress = {
        row["job"]: Progress(row["samples"], row["prompt_tokens"] or 0, row["completion_tokens"] or 0)
        for row in EvaluationSample.objects
        .filter(job__in=[evaluation.job_id for evaluation in evaluations])
        .values("job").annotate(samples=Count("id"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
        .order_by()
    }
    return [evaluation_to_dict(evaluation, progress.get(evaluation.job_id, Progress())) for evaluation in evaluations]


def _reward_bound(params: Mapping[str, str], name: str) -> float | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        message = f"{name} must be a number."
        raise LabError("invalid_request", message, errors=[FieldError(name, "invalid", message)])
    return value


def evaluation_samples(*, evaluation: Evaluation, params: Mapping[str, str]) -> QuerySet:
    """Return the evaluation's samples in the order they were stored, filtered by the query
    parameters ``environment`` (an environment id of the evaluation), ``min_reward`` and
    ``max_reward`` (inclusive bounds). Raises LabError ``invalid_request`` for a bound that is no
    number and for an environment the evaluation does not have."""
    samples = EvaluationSample.objects.filter(job=evaluation.job_id)
    environment = params.get("environment")
    if environment:
        ids = [item["id"] for item in evaluation.environments]
        if environment not in ids:
            message = f"This evaluation has no environment {environment[:100]!r}; it has {', '.join(ids)}."
            raise LabError("invalid_request", message, errors=[FieldError("environment", "invalid_value", message)])
        samples = samples.filter(environment=ids.index(environment))
    low, high = _reward_bound(params, "min_reward"), _reward_bound(params, "max_reward")
    if low is not None:
        samples = samples.filter(reward__gte=low)
    if high is not None:
        samples = samples.filter(reward__lte=high)
    return samples


def evaluation_sample_get(*, evaluation: Evaluation, sample_id: str) -> EvaluationSample:
    """Return the evaluation's sample ``sample_id`` (``evs_...``). Raises LabError ``not_found`` for
    a sample that is missing or another evaluation's (the same answer)."""
    sample = EvaluationSample.objects.filter(job=evaluation.job_id, public_id=sample_id[:64]).first()
    if sample is None:
        raise not_found("evaluation sample")
    return sample


def evaluation_reward_histogram(*, evaluation: Evaluation, environment: int, bins: int = 10) -> list[dict[str, Any]]:
    """Return the rewards of the evaluation's samples of environment number ``environment`` (its
    index in ``evaluation.environments``) as ``bins`` equal-width bins ``{"low", "high", "count"}``
    over [min, max], each closed on the left and open on the right but the last (numpy's
    convention, as ``jobs.distributions.histogram``); one bin when every reward is the same, none
    without samples. Counted in the database: two queries however many samples there are."""
    samples = EvaluationSample.objects.filter(job=evaluation.job_id, environment=environment)
    bounds = samples.aggregate(low=Min("reward"), high=Max("reward"), count=Count("id"))
    low, high = bounds["low"], bounds["high"]
    if not bounds["count"]:
        return []
    if low == high:
        return [{"low": low, "high": high, "count": bounds["count"]}]
    width = (high - low) / bins
    position = Least(Floor((F("reward") - Value(low)) / Value(width)), Value(bins - 1.0), output_field=FloatField())
    counts = [0] * bins
    for row in samples.annotate(bin=position).values("bin").annotate(count=Count("id")).order_by():
        counts[int(row["bin"])] += row["count"]
    return [
        {"low": low + index * width, "high": high if index == bins - 1 else low + (index + 1) * width, "count": count}
        for index, count in enumerate(counts)
    ]


# --- comparing evaluations example by example ---------------------------------------------------

#: How many evaluations one comparison holds.
MIN_COMPARED, MAX_COMPARED = 2, 5
#: The share of an example's rollouts that must succeed (reward at least ``SUCCESS_REWARD``, the
#: success of pass@k) for a comparison to count the example solved: half, so that with one rollout
#: an example is solved when it succeeds, and with many a single lucky rollout does not solve it.
SOLVED_SHARE = 0.5


@dataclass(frozen=True)
class ExampleOutcome:
    """How one evaluation did on one example: its index in that evaluation's run, its rollouts
    stored, how many succeeded, and their mean reward."""

    example: int
    rollouts: int
    successes: int
    reward_mean: float

    @property
    def solved(self) -> bool:
        """Whether at least ``SOLVED_SHARE`` of the example's rollouts succeeded."""
        return self.rollouts > 0 and self.successes >= SOLVED_SHARE * self.rollouts


@dataclass
class Comparison:
    """Evaluations compared on one environment, example by example.

    ``environment`` is the environment's id without its version; ``environment_ids`` the exact id
    each evaluation ran (versions may differ) and ``environment_indexes`` its index in each
    evaluation's ``environments``; ``shared`` every environment (without version) all of them ran.
    Examples are matched by their prompt (the chat messages), not by their index, since another
    seed or other arguments sample other prompts: ``keys`` lists each distinct prompt once (the
    first evaluation's examples in order, then those only later ones have), ``outcomes[i]`` maps
    the keys evaluation ``i`` scored to its ``ExampleOutcome``.
    """

    evaluations: list[Evaluation]
    environment: str
    shared: list[str]
    environment_ids: list[str]
    environment_indexes: list[int]
    keys: list[str] = field(default_factory=list)
    outcomes: list[dict[str, ExampleOutcome]] = field(default_factory=list)

    def common(self) -> list[str]:
        """The keys every evaluation scored."""
        return [key for key in self.keys if all(key in outcomes for outcomes in self.outcomes)]

    def solved_not(self, first: int, second: int) -> int:
        """How many examples both scored that evaluation ``first`` solves and ``second`` does not."""
        return sum(
            1 for key in self.common() if self.outcomes[first][key].solved and not self.outcomes[second][key].solved
        )

    def row(self, key: str) -> list[ExampleOutcome | None]:
        """Each evaluation's outcome on the example ``key`` (None where it did not score it)."""
        return [outcomes.get(key) for outcomes in self.outcomes]

    def rows(self, show: str = "disagree") -> list[str]:
        """The keys to show, in order: ``disagree`` (solved by some of the evaluations that scored it
        and not by others), ``solved`` (by every one that scored it), ``unsolved`` (by none),
        ``only:<i>`` (solved by evaluation ``i`` alone), ``all``. Raises LabError
        ``invalid_request`` for anything else."""
        def verdicts(key: str) -> list[bool]:
            return [outcome.solved for outcome in self.row(key) if outcome is not None]

        if show == "all":
            return list(self.keys)
        if show == "disagree":
            return [key for key in self.keys if len(set(verdicts(key))) > 1]
        if show == "solved":
            return [key for key in self.keys if all(verdicts(key))]
        if show == "unsolved":
            return [key for key in self.keys if not any(verdicts(key))]
        which = show.removeprefix("only:")
        if which.isdigit() and int(which) < len(self.evaluations):
            index = int(which)
            return [
                key for key in self.keys
                if [outcome is not None and outcome.solved for outcome in self.row(key)]
                == [position == index for position in range(len(self.evaluations))]
            ]
        message = f"show must be all, disagree, solved, unsolved or only:<0..{len(self.evaluations) - 1}>."
        raise LabError("invalid_request", message, errors=[FieldError("show", "invalid_value", message)])


def evaluation_comparison(*, evaluations: list[Evaluation], environment: str | None = None) -> Comparison:
    """Compare ``evaluations`` (2 to 5, in the order given) on ``environment`` (an id, its version
    ignored), by default the first environment of the first evaluation that all of them ran.

    Raises LabError ``invalid_request`` for fewer than 2 or more than 5 evaluations, for
    evaluations that share no environment (naming what each ran), and for an ``environment`` they
    do not all have.
    """
    if not MIN_COMPARED <= len(evaluations) <= MAX_COMPARED:
        message = f"Compare {MIN_COMPARED} to {MAX_COMPARED} evaluations, not {len(evaluations)}."
        raise LabError("invalid_request", message, errors=[FieldError("evaluation", "invalid_value", message)])
    names = [[item["id"].partition("@")[0] for item in evaluation.environments] for evaluation in evaluations]
    shared = [name for name in names[0] if all(name in others for others in names[1:])]
    if not shared:
        ran = "; ".join(f"{evaluation.public_id} ran {', '.join(ids)}" for evaluation, ids in zip(evaluations, names))
        message = f"These evaluations share no environment, so there are no examples to compare: {ran}."
        raise LabError("invalid_request", message, errors=[FieldError("evaluation", "no_shared_environment", message)])
    chosen = (environment or shared[0]).partition("@")[0]
    if chosen not in shared:
        message = f"Not every one of these evaluations ran {chosen[:100]!r}; they all ran {', '.join(shared)}."
        raise LabError("invalid_request", message, errors=[FieldError("environment", "invalid_value", message)])
    indexes = [ids.index(chosen) for ids in names]
    comparison = Comparison(
        evaluations=list(evaluations), environment=chosen, shared=shared,
        environment_ids=[evaluation.environments[index]["id"] for evaluation, index in zip(evaluations, indexes)],
        environment_indexes=indexes,
    )
    seen: set[str] = set()
    for evaluation, index in zip(evaluations, indexes):
        outcomes = _example_outcomes(evaluation, index)
        comparison.outcomes.append(outcomes)
        for key in outcomes:
            if key not in seen:
                seen.add(key)
                comparison.keys.append(key)
    return comparison


def _example_outcomes(evaluation: Evaluation, environment: int) -> dict[str, ExampleOutcome]:
    """The evaluation's outcome on each example of environment number ``environment`` that has its
    first rollout stored, keyed by its prompt (``_prompt_key``), in example order. Rollouts are
    counted in the database; prompts are read once per example, never kept."""
    samples = EvaluationSample.objects.filter(job=evaluation.job_id, environment=environment)
    totals = {
        row["example"]: row
        for row in samples.values("example").annotate(
            rollouts=Count("id"), successes=Count("id", filter=Q(reward__gte=SUCCESS_REWARD)),
            reward_mean=Avg("reward"),
        ).order_by()
    }
    outcomes: dict[str, ExampleOutcome] = {}
    firsts = samples.filter(rollout=0).order_by("example").values_list("example", "prompt")
    for example, prompt in firsts.iterator(chunk_size=2000):
        digest = _prompt_key(prompt)
        key, occurrence = digest, 1
        while key in outcomes:  # a prompt the split holds twice: its n-th time matches the n-th elsewhere
            occurrence += 1
            key = f"{digest}#{occurrence}"
        total = totals[example]
        outcomes[key] = ExampleOutcome(example, total["rollouts"], total["successes"], total["reward_mean"])
    return outcomes


def _prompt_key(prompt: Any) -> str:
    """A short digest of a sample's prompt (its chat messages as canonical JSON)."""
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def example_first_samples(
    *, evaluation: Evaluation, environment: int, examples: list[int]
) -> dict[int, EvaluationSample]:
    """Return the first rollout's sample of each of ``examples`` (example indexes) of environment
    number ``environment`` of the evaluation, by example (those not stored are left out)."""
    samples = EvaluationSample.objects.filter(
        job=evaluation.job_id, environment=environment, example__in=examples, rollout=0
    )
    return {sample.example: sample for sample in samples}


# --- an environment's evaluations ------------------------------------------------------------------

#: The newest evaluations of an environment its page reads (over every version).
ENVIRONMENT_EVALUATIONS_READ = 500


@dataclass(frozen=True)
class VersionEvaluations:
    """The evaluations that ran one version of an environment (``environment_id``, exact, as the
    evaluations store it), best first, each with its Evaluation object."""

    environment_id: str
    evaluations: list[tuple[Evaluation, dict[str, Any]]]


def environment_evaluations(
    *, organization: Organization, environment: str, limit: int = ENVIRONMENT_EVALUATIONS_READ
) -> list[VersionEvaluations]:
    """Return the evaluations of ``organization``'s projects that ran the environment
    ``environment`` (``owner/name``, without version), grouped by the exact id each ran (its
    version), the newest version first (PEP 440 order). Within a version the best come first:
    by reward mean on it, highest first, then those without results (not ended), newest first.
    At most ``limit`` evaluations, the newest, are read. An evaluation that ended is counted
    first, as ``evaluations_to_dicts`` does."""
    evaluations = Evaluation.objects.filter(project__in=Project.objects.filter(organization=organization))
    matches = Q()
    for index in range(MAX_ENVIRONMENTS):
        alias = f"environment_id_{index}"
        ran = Cast(KeyTextTransform("id", KeyTransform(str(index), "environments")), output_field=TextField())
        evaluations = evaluations.alias(**{alias: ran})
        matches |= Q(**{alias: environment}) | Q(**{f"{alias}__startswith": f"{environment}@"})
    found = list(evaluations.filter(matches).select_related("job", "project").order_by("-id")[:limit])
    groups: dict[str, list[tuple[Evaluation, dict[str, Any]]]] = {}
    for evaluation, shown in zip(found, evaluations_to_dicts(found)):
        exact = next(
            item["id"] for item in evaluation.environments
            if item["id"] == environment or item["id"].startswith(f"{environment}@")
        )
        groups.setdefault(exact, []).append((evaluation, shown))

    def best_first(pair: tuple[Evaluation, dict[str, Any]], exact: str) -> tuple:
        result = ((pair[1]["results"] or {}).get(exact) or {}).get("reward_mean")
        return (result is None, -(result or 0.0), -pair[0].pk)

    return [
        VersionEvaluations(exact, sorted(pairs, key=lambda pair, exact=exact: best_first(pair, exact)))
        for exact, pairs in sorted(groups.items(), key=lambda item: _version_order(item[0]), reverse=True)
    ]


def _version_order(environment_id: str) -> tuple:
    """A sort key of an environment id's version: PEP 440 order, an unparsable version after, by text."""
    version = environment_id.partition("@")[2]
    try:
        return (1, Version(version), "")
    except InvalidVersion:
        return (0, Version("0"), version)
