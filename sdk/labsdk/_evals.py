"""``lab.evals``: evaluations of a catalogue model, a checkpoint, an adapter, a deployment or an
OpenAI-compatible endpoint on environments, every sample kept (docs/evaluations.md).

An evaluation runs as a job of its own kind (queued, started, billed and cancelled as jobs are),
samples every example of each environment ``rollouts_per_example`` times and ends with results per
environment: the reward's mean and standard error, each reward function's mean, pass@k, errors,
timeouts and tokens. Creating, cancelling and deleting need an API key with the ``write`` scope.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import Field
from tqdm.auto import tqdm

from labsdk._common import paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.errors import JobCancelledError, JobFailedError, WaitTimeoutError
from labsdk.types import JobError, LabObject
from labsdk.vf_results import read_vf_eval_run

__all__ = ["Evals", "Evaluation", "EvaluationSample"]

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class Evaluation(LabObject):
    """An evaluation (``eval_...``): ``status`` is its job's (``job_id``); ``model`` is
    ``{"type": "model" | "checkpoint" | "adapter" | "deployment" | "endpoint", "id"}`` (an
    endpoint's id is its model; ``details["endpoint"]`` its ``base_url`` and ``api_key_secret``); ``environments`` as run, each with ``id``,
    ``args``, ``num_examples`` (a count or ``"all"``) and ``rollouts_per_example``; ``progress``
    the samples stored (and ``expected_samples`` when known); ``results`` by environment id once it
    has ended (None before). ``source`` is ``lab`` (run by Lab) or ``pushed`` (run elsewhere, its
    samples pushed: ``push``), ``details`` what a pushed run's own files said of it."""

    id: str
    object: str = "evaluation"
    name: str = ""
    source: str | None = None
    status: str | None = None
    status_reason: str | None = None
    job_id: str | None = None
    model: dict[str, Any] = Field(default_factory=dict)
    base_model: str | None = None
    environments: list[dict[str, Any]] = Field(default_factory=list)
    sampling: dict[str, Any] = Field(default_factory=dict)
    progress: dict[str, Any] = Field(default_factory=dict)
    results: dict[str, dict[str, Any]] | None = None
    error: JobError | None = None
    usage: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether the evaluation has ended (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES


class EvaluationSample(LabObject):
    """One scored rollout: example ``example`` (0-based) of ``environment``'s eval split, rollout
    ``rollout``; ``prompt`` its chat messages, ``completion`` the reply, ``functions`` each reward
    function's score, ``tokens`` ``{"prompt", "completion"}``, ``latency_s`` the seconds of the
    batched call that made it, ``error`` the environment's failure (reward 0) or None."""

    id: str
    environment: str | None = None
    example: int
    rollout: int
    prompt: list[dict[str, Any]] = Field(default_factory=list)
    completion: str = ""
    answer: str = ""
    reward: float
    functions: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)
    tokens: dict[str, int] = Field(default_factory=dict)
    latency_s: float | None = None
    truncated: bool = False
    timed_out: bool = False
    error: str | None = None
    attempt: int | None = None
    created_at: datetime | None = None


def _environments(environments: Sequence[str | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Environments as the API takes them: an id alone, or ``{"id", "args", "num_examples",
    "rollouts_per_example"}``."""
    return [{"id": item} if isinstance(item, str) else dict(item) for item in environments]


#: What one push request carries at most: samples, and bytes of JSON (half Lab's 1 MB request limit).
_PUSH_BATCH_SAMPLES = 1000
_PUSH_BATCH_BYTES = 512 * 1024


def _batches(samples: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """``samples`` in batches of at most ``_PUSH_BATCH_SAMPLES`` and about ``_PUSH_BATCH_BYTES``
    (a sample larger than that goes alone)."""
    batch: list[dict[str, Any]] = []
    size = 0
    for sample in samples:
        length = len(json.dumps(sample, separators=(",", ":"))) + 1
        if batch and (len(batch) >= _PUSH_BATCH_SAMPLES or size + length > _PUSH_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(sample)
        size += length
    if batch:
        yield batch


class Evals:
    """``/evaluations``: create, list, retrieve, cancel, retry, delete and wait for evaluations,
    and read their samples. Errors are Lab's: 400 ``invalid_request`` naming the field
    (``environments.0.args.max_operand``), 404 for an evaluation or checkpoint outside the
    project, 409 ``invalid_state`` for an action its status does not allow."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def create(
        self,
        *,
        environments: Sequence[str | Mapping[str, Any]],
        model: str | None = None,
        checkpoint: str | None = None,
        adapter: str | None = None,
        deployment: str | None = None,
        endpoint: Mapping[str, str] | None = None,
        api_key_secret: str | None = None,
        secrets: Mapping[str, str] | None = None,
        sampling: Mapping[str, Any] | None = None,
        name: str | None = None,
        metadata: Mapping[str, str] | None = None,
        resources: Mapping[str, Any] | None = None,
    ) -> Evaluation:
        """Queue an evaluation of exactly one of: a catalogue ``model``, a ready ``checkpoint``
        (``ckpt_...``) or ``adapter`` (``adp_...``) of the project, a ``deployment`` of the
        project (``dep_...``, through Lab's OpenAI-compatible API) or an OpenAI-compatible
        ``endpoint`` (``{"base_url": "https://host/v1", "model": "<its model id>"}``); the last
        two take ``api_key_secret``, the name of one of ``secrets`` (name: value, given to the
        evaluation's job alone) holding the API key (for a deployment, a Lab API key of the
        project). ``environments`` are ids, or dicts with ``args``, ``num_examples`` (a count or
        ``"all"``, default 32) and ``rollouts_per_example`` (default 1); ``sampling`` may set
        ``temperature`` (default 1.0), ``top_p`` (1.0), ``max_tokens`` (128) and ``seed`` (0).
        Raises ValueError unless exactly one target is given."""
        targets = {
            "model": model, "checkpoint": checkpoint, "adapter": adapter, "deployment": deployment, "endpoint": endpoint,
        }
        given = [kind for kind, value in targets.items() if value is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of model=, checkpoint=, adapter=, deployment= and endpoint=")
        kind = given[0]
        target: dict[str, Any] = dict(endpoint) if kind == "endpoint" else {"id": targets[kind]}
        target = {"type": kind, **target}
        if api_key_secret is not None:
            target["api_key_secret"] = api_key_secret
        body: dict[str, Any] = {"model": target, "environments": _environments(environments)}
        for key, value in (
            ("sampling", sampling), ("name", name), ("metadata", metadata), ("resources", resources), ("secrets", secrets),
        ):
            if value is not None:
                body[key] = dict(value) if isinstance(value, Mapping) else value
        return parse(Evaluation, self._http.request("POST", "evaluations", json_body=body))

    def push(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        environment: str | None = None,
        progress: bool = False,
    ) -> Evaluation:
        """Push the results of a local verifiers ``vf-eval`` run in folder ``path`` (verifiers 0.3's
        ``metadata.json`` and ``results.jsonl``, or 0.4's ``traces.jsonl`` and
        ``configs/resolved/eval.json``: ``labsdk.vf_results``) as an evaluation that ran
        elsewhere, and return it finalized with its results. ``name`` names it; ``environment``
        replaces the run's environment id. The push is keyed by the files' digest: pushing the same
        run again (or again after a failure part-way) returns the one evaluation, every sample
        stored once. Raises ``VfResultsError`` for a folder holding no run, Lab's errors otherwise."""
        run = read_vf_eval_run(path)
        evaluation = parse(
            Evaluation,
            self._http.request("POST", "evaluations/push", json_body=run.create_body(name=name, environment=environment)),
        )
        if evaluation.is_terminal:  # pushed and finalized before
            return evaluation
        bar = tqdm(total=len(run.samples), unit="sample", disable=None if progress else True, desc=f"push {evaluation.id}")
        for batch in _batches(run.samples):
            self._http.request("POST", f"evaluations/{segment(evaluation.id)}/samples", json_body={"samples": batch})
            bar.update(len(batch))
        bar.close()
        return parse(Evaluation, self._http.request("POST", f"evaluations/{segment(evaluation.id)}/finalize"))

    def list(self, *, status: str | None = None, limit: int = 100) -> list[Evaluation]:
        """Return the project's evaluations, newest first; those of one ``status`` when given."""
        params: dict[str, Any] = {"limit": limit} | ({"status": status} if status else {})
        return [*paginate(self._http, "evaluations", Evaluation, params)]

    def retrieve(self, evaluation_id: str) -> Evaluation:
        """Return one evaluation."""
        return parse(Evaluation, self._http.request("GET", f"evaluations/{segment(evaluation_id)}"))

    get = retrieve

    def cancel(self, evaluation_id: str) -> Evaluation:
        """Cancel an evaluation (``cancelled`` at once while queued, else ``cancelling``); the
        samples stored so far stay."""
        return parse(Evaluation, self._http.request("POST", f"evaluations/{segment(evaluation_id)}/cancel"))

    def retry(self, evaluation_id: str) -> Evaluation:
        """Run a failed or cancelled evaluation again; what it stored stays, once."""
        return parse(Evaluation, self._http.request("POST", f"evaluations/{segment(evaluation_id)}/retry"))

    def delete(self, evaluation_id: str) -> None:
        """Delete a finished evaluation with its job and samples."""
        self._http.request("DELETE", f"evaluations/{segment(evaluation_id)}")

    def iter_samples(
        self,
        evaluation_id: str,
        *,
        environment: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        page_size: int = 100,
    ) -> Iterator[EvaluationSample]:
        """Yield the evaluation's samples in the order they were stored, page by page: of one
        ``environment`` (its id), with a reward from ``min_reward`` to ``max_reward`` (inclusive)."""
        params: dict[str, Any] = {"limit": page_size}
        for key, value in (("environment", environment), ("min_reward", min_reward), ("max_reward", max_reward)):
            if value is not None:
                params[key] = value
        yield from paginate(self._http, f"evaluations/{segment(evaluation_id)}/samples", EvaluationSample, params)

    def samples(
        self,
        evaluation_id: str,
        *,
        environment: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        limit: int | None = None,
    ) -> list[EvaluationSample]:
        """Return the evaluation's samples (``iter_samples``' filters), at most ``limit`` (None: all)."""
        samples = []
        for sample in self.iter_samples(
            evaluation_id, environment=environment, min_reward=min_reward, max_reward=max_reward,
            page_size=min(100, limit) if limit else 100,
        ):
            if limit is not None and len(samples) >= limit:
                break
            samples.append(sample)
        return samples

    def wait(
        self,
        evaluation_id: str,
        *,
        timeout: float | None = None,
        progress: bool = True,
        poll_interval: float = 2.0,
    ) -> Evaluation:
        """Poll an evaluation until it ends and return it (with its results) when it succeeded.

        ``timeout`` and ``poll_interval`` are seconds (``None``: no limit); with ``progress`` and
        stderr a terminal a tqdm bar counts the samples stored. Raises ``JobFailedError`` or
        ``JobCancelledError`` (``.job`` is the evaluation) when it ends otherwise, and
        ``WaitTimeoutError`` (with the last one seen) when time runs out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        evaluation = self.retrieve(evaluation_id)
        bar = tqdm(desc=evaluation_id, unit="sample", disable=None if progress else True, dynamic_ncols=True)
        try:
            while True:
                bar.total = evaluation.progress.get("expected_samples")
                bar.n = evaluation.progress.get("samples") or 0
                bar.set_postfix({"status": evaluation.status}, refresh=True)
                if evaluation.is_terminal:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeoutError(evaluation, timeout)
                pause = poll_interval if deadline is None else max(0.0, min(poll_interval, deadline - time.monotonic()))
                time.sleep(pause)
                evaluation = self.retrieve(evaluation_id)
        finally:
            bar.close()
        if evaluation.status == "failed":
            raise JobFailedError(evaluation)
        if evaluation.status == "cancelled":
            raise JobCancelledError(evaluation)
        return evaluation
