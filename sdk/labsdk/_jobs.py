"""``client.jobs``: submit, follow and control training jobs (docs/api.md "Jobs")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from labsdk._common import list_data, paginate, parse, segment
from labsdk._http import HTTPClient, ServerSentEvent
from labsdk.display import job_progress
from labsdk.errors import (
    APIConnectionError,
    APIError,
    InvalidSpecError,
    JobCancelledError,
    JobFailedError,
    LabError,
    NotFoundError,
    ProblemDetail,
    WaitTimeoutError,
)
from labsdk.retry import exponential_backoff, is_retryable_status
from labsdk.spec import JobSpec, ParsedSpec, SpecError, parse_spec, read_spec_file
from labsdk.types import (
    Checkpoint,
    Distribution,
    Estimate,
    Job,
    JobEvent,
    LabObject,
    LogLine,
    MetricPoint,
    Sample,
    StreamEvent,
)

#: What ``jobs.create`` and ``jobs.estimate`` take as ``spec``: decoded JSON/TOML, or the model.
SpecLike = Mapping[str, Any] | JobSpec | ParsedSpec

#: The metric shown next to the progress bar of :meth:`Jobs.wait`.
PROGRESS_METRIC = "reward/mean"


def _invalid_spec(source: str, exc: SpecError) -> InvalidSpecError:
    problems = [ProblemDetail(problem.to_dict()) for problem in exc.errors]
    return InvalidSpecError(
        f"{source}{exc.errors[0].message}", code="invalid_spec", param=exc.param, errors=problems
    )


_STREAM_DATA_TYPES: dict[str, type[LabObject]] = {
    "status": Job,
    "metrics": MetricPoint,
    "sample": Sample,
    "checkpoint": Checkpoint,
    "log": LogLine,
    "event": JobEvent,
}


def _stream_event(raw: ServerSentEvent) -> StreamEvent:
    """Decode one server-sent event's JSON data into its type; unknown types stay JSON."""
    try:
        data = json.loads(raw.data)
    except ValueError:
        raise APIError(f"Lab sent a {raw.event} event whose data is not JSON", body=raw.data) from None
    model = _STREAM_DATA_TYPES.get(raw.event)
    return StreamEvent(event=raw.event, id=raw.id, data=parse(model, data) if model else data)


def _spec_body(spec: SpecLike | None, spec_file: str | Path | None, fields: dict[str, Any]) -> dict:
    """Merge a spec (mapping, ``JobSpec`` or ``ParsedSpec``) or a spec file with top-level
    ``fields`` (which win) into a request body.

    Lab validates specs; the SDK only refuses what it cannot send: an unreadable spec file,
    or a spec that is not JSON (NaN or infinity, which TOML allows), each as
    ``InvalidSpecError`` with every problem by path. ``ValueError`` for a call that gives
    both ``spec`` and ``spec_file`` or nothing at all.
    """
    if spec is not None and spec_file is not None:
        raise ValueError("give spec or spec_file, not both")
    if spec is None and spec_file is None and not fields:
        raise ValueError("give spec=, spec_file= or the spec's fields as keyword arguments")
    body: dict[str, Any] = {}
    source = f"{spec_file}: " if spec_file is not None else ""
    if spec_file is not None:
        try:
            data = read_spec_file(spec_file)
        except SpecError as exc:
            raise _invalid_spec(source, exc) from None
        if not isinstance(data, Mapping):
            raise InvalidSpecError(f"{source}a spec must be a table (a JSON object)", code="invalid_spec", param="")
        body.update(data)
    elif isinstance(spec, ParsedSpec):
        body.update(spec.to_dict())
    elif isinstance(spec, JobSpec):
        body.update(ParsedSpec(spec).to_dict())
    elif spec is not None:
        body.update(spec)
    body.update(fields)
    try:
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        try:
            parse_spec(body)
        except SpecError as problems:
            raise _invalid_spec(source, problems) from None
        raise InvalidSpecError(f"{source}the spec is not JSON: {exc}", code="invalid_spec") from None
    return body


#: How long :meth:`Jobs.stream` keeps reconnecting a broken stream by default, in seconds: long
#: enough for a web server to restart (a deploy, a crash) without the caller noticing.
STREAM_RECONNECT_S = 60.0
#: The longest pause between two reconnections of a stream, in seconds.
STREAM_BACKOFF_CAP_S = 4.0
#: A stream that stayed open this long before it broke was working: its outage starts anew.
STREAM_STABLE_S = 30.0


class Jobs:
    """Training jobs of the client's project: create, read, list, cancel, wait.

    ``stream_reconnect_s`` is how long :meth:`stream` keeps reconnecting a broken stream
    (seconds; 0 gives up at the first break)."""

    def __init__(self, http: HTTPClient, *, stream_reconnect_s: float = STREAM_RECONNECT_S):
        self._http = http
        self.stream_reconnect_s = stream_reconnect_s

    def create(
        self,
        spec: SpecLike | None = None,
        *,
        spec_file: str | Path | None = None,
        idempotency_key: str | None = None,
        secrets: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> Job:
        """Submit a job (``POST /jobs``) and return it, ``queued``.

        The spec comes from ``spec`` (a mapping as in docs/spec.md, or a
        :class:`~labsdk.spec.JobSpec`), or ``spec_file`` (TOML, or JSON by its ``.json``
        suffix), or keyword arguments alone; keyword arguments override top-level keys of
        either (``name="run-2"``). Lab validates it; the returned Job's ``warnings`` list ignored Prime Intellect keys.
        One ``Idempotency-Key`` (``idempotency_key``, else a new uuid4) is sent on every
        retry of this call, so a lost answer never creates a second job.

        Raises ``InvalidSpecError`` (``.param``, ``.errors``), ``PermissionDeniedError``
        for a read-only key, ``PaymentRequiredError``, and the other ``LabError`` classes;
        ``OSError`` when ``spec_file`` cannot be read. ``secrets`` (``{"NAME": "value"}``, e.g. from
        :func:`labsdk.secrets.collect_secrets`) go beside the spec, write-only: Lab stores them
        encrypted and gives them to the job's engine process as environment variables, and never
        answers them back.
        """
        body = _spec_body(spec, spec_file, fields)
        if secrets:
            body["secrets"] = dict(secrets)
        return parse(Job, self._http.request("POST", "jobs", json_body=body, idempotency_key=idempotency_key))

    def retrieve(self, job_id: str) -> Job:
        """Return the job ``job_id`` (``GET /jobs/{id}``); ``NotFoundError`` when it is not
        in this project."""
        return parse(Job, self._http.request("GET", f"jobs/{segment(job_id)}"))

    def list(
        self,
        *,
        status: str | None = None,
        metadata: Mapping[str, str] | None = None,
        kind: str | None = None,
        limit: int = 20,
    ) -> Iterator[Job]:
        """Iterate over the project's jobs, newest first (``GET /jobs``), fetching pages of
        ``limit`` (1-100) as the iteration goes. ``kind`` is ``training`` (Lab's default) or
        ``evaluation`` (the jobs of evaluations); ``status`` keeps one status; ``metadata``
        keeps jobs whose metadata has every given pair."""
        params: dict[str, Any] = {"kind": kind, "status": status, "limit": limit}
        for key, value in (metadata or {}).items():
            params[f"metadata[{key}]"] = value
        return paginate(self._http, "jobs", Job, params)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job (``POST /jobs/{id}/cancel``): a queued job is ``cancelled`` at once,
        a running one ``cancelling``. ``ConflictError`` when it has already finished."""
        return parse(Job, self._http.request("POST", f"jobs/{segment(job_id)}/cancel"))

    def restart(self, job_id: str) -> Job:
        """Run a failed or cancelled job again as a new attempt from its latest ready
        checkpoint (``POST /jobs/{id}/restart``); ``ConflictError`` in any other status,
        ``BadRequestError`` for an evaluation's job (retry the evaluation: ``lab.evals.retry``)."""
        return parse(Job, self._http.request("POST", f"jobs/{segment(job_id)}/restart"))

    def delete(self, job_id: str) -> None:
        """Delete a finished job and its data: metrics, samples, logs, checkpoint objects
        (``DELETE /jobs/{id}``); ``ConflictError`` while it is not finished."""
        self._http.request("DELETE", f"jobs/{segment(job_id)}")

    def events(self, job_id: str, *, limit: int = 100) -> Iterator[JobEvent]:
        """Iterate over a job's events, oldest first (``GET /jobs/{id}/events``)."""
        return paginate(self._http, f"jobs/{segment(job_id)}/events", JobEvent, {"limit": limit})

    def metrics(
        self,
        job_id: str,
        *,
        names: list[str] | None = None,
        after_step: int | None = None,
        limit: int = 1000,
    ) -> Iterator[MetricPoint]:
        """Iterate over a job's per-step metrics after ``after_step`` in step order
        (``GET /jobs/{id}/metrics``), only ``names`` when given (e.g. ``["reward/mean"]``)."""
        params: dict[str, Any] = {"limit": limit, "names": ",".join(names) if names else None}
        return paginate(
            self._http, f"jobs/{segment(job_id)}/metrics", MetricPoint, params,
            cursor_param="after_step", cursor_field="step", cursor=after_step,
        )

    def logs(self, job_id: str, *, after: int | None = None, limit: int = 100) -> Iterator[LogLine]:
        """Iterate over a job's log lines after sequence number ``after``
        (``GET /jobs/{id}/logs``)."""
        return paginate(
            self._http, f"jobs/{segment(job_id)}/logs", LogLine, {"limit": limit},
            cursor_field="seq", cursor=after,
        )

    def samples(self, job_id: str, *, step: int | None = None, limit: int = 100) -> list[Sample]:
        """Return up to ``limit`` rollout samples of a job, of one ``step`` when given
        (``GET /jobs/{id}/samples``)."""
        page = self._http.request("GET", f"jobs/{segment(job_id)}/samples", params={"step": step, "limit": limit})
        return [parse(Sample, item) for item in list_data(page, "samples")]

    def distribution(
        self, job_id: str, *, step: int | None = None, type: str = "reward", bins: int = 10
    ) -> Distribution:
        """Return a histogram of one step's stored rollout ``type`` values (``reward`` or
        ``advantage``) in ``bins`` equal-width bins, of the latest step with samples unless
        ``step`` is given (``GET /jobs/{id}/distributions``)."""
        params = {"step": step, "type": type, "bins": bins}
        return parse(Distribution, self._http.request("GET", f"jobs/{segment(job_id)}/distributions", params=params))

    def checkpoints(self, job_id: str, *, limit: int = 100) -> Iterator[Checkpoint]:
        """Iterate over a job's checkpoints (``GET /jobs/{id}/checkpoints``)."""
        return paginate(self._http, f"jobs/{segment(job_id)}/checkpoints", Checkpoint, {"limit": limit})

    def stream(
        self, job_id: str, *, last_event_id: str | None = None, from_now: bool = False, reconnect_s: float | None = None
    ) -> Iterator[StreamEvent]:
        """Follow a job live (``GET /jobs/{id}/stream``): yield typed :class:`StreamEvent` objects
        until Lab ends the stream after the ``status`` event of a finished job (a finished job's
        whole history comes first), then stop.

        Without ``last_event_id`` the stream replays from the job's start (``from_now``:
        only what happens next); with it, everything after that event. A broken connection
        (dropped, refused, timed out, or answered 429 or 5xx) is reopened from the last event id
        seen, as ``Last-Event-ID``, with capped exponential backoff (at most
        :data:`STREAM_BACKOFF_CAP_S` seconds between tries) for up to ``reconnect_s`` seconds
        (default the client's ``stream_reconnect_s``, 60), counted from the first break since
        the last new event or since a connection that worked for :data:`STREAM_STABLE_S`
        seconds: long enough for Lab's web server to restart. Then ``APIConnectionError`` (or
        the last 429/5xx answer's error); any other error answer is raised at once.
        """
        path = f"jobs/{segment(job_id)}/stream"
        window = self.stream_reconnect_s if reconnect_s is None else reconnect_s
        last_id = last_event_id
        finished = False
        broken_since: float | None = None  # monotonic time of the first break of this outage
        waited = 0.0  # seconds paused in this outage
        tries = 0
        while True:
            params = {"from": "now"} if from_now and last_id is None else None
            opened = time.monotonic()
            try:
                for raw in self._http.iter_events(path, params=params, last_event_id=last_id):
                    event = _stream_event(raw)
                    if raw.id is not None:
                        # Only a new event is progress: every connection opens with a snapshot.
                        last_id = raw.id
                        broken_since = None
                    if event.event == "status" and isinstance(event.data, Job):
                        finished = event.data.is_terminal
                    yield event
                # Lab ends the stream after the history and the status of a finished job; an
                # end before that is a dropped connection.
                if finished:
                    return
                broken: LabError = APIConnectionError(f"the stream of {job_id} ended before the job finished")
            except APIConnectionError as exc:
                broken = exc
            except LabError as exc:
                if exc.status_code is None or not is_retryable_status(exc.status_code):
                    raise
                broken = exc
            now = time.monotonic()
            if broken_since is None or now - opened >= STREAM_STABLE_S:
                broken_since, waited, tries = now, 0.0, 0
            spent = max(waited, now - broken_since)
            if spent >= window:
                raise broken
            delay = exponential_backoff(tries, base=self._http.backoff_base, cap=STREAM_BACKOFF_CAP_S, jitter=True)
            delay = min(delay, window - spent)
            time.sleep(delay)
            waited += delay
            tries += 1

    def estimate(
        self,
        spec: SpecLike | None = None,
        *,
        spec_file: str | Path | None = None,
        secrets: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> Estimate:
        """Validate a spec fully on the server without creating a job (``POST
        /jobs/estimate``): GPU/CPU-seconds, cost in USD, queue position, whether it could
        start now, warnings. Takes the spec and ``secrets`` as :meth:`create` does (secrets are
        checked, not stored); raises
        ``InvalidSpecError`` listing every problem (catalogue and pool checks included)."""
        body = _spec_body(spec, spec_file, fields)
        if secrets:
            body["secrets"] = dict(secrets)
        return parse(Estimate, self._http.request("POST", "jobs/estimate", json_body=body))

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        progress: bool = True,
        poll_interval: float = 2.0,
    ) -> Job:
        """Poll a job until it finishes and return it when it ``succeeded``.

        ``timeout`` and ``poll_interval`` are seconds (``None``: no limit). With
        ``progress`` and stderr a terminal (no bar into a pipe or a file) a tqdm bar shows
        step/max_steps, the status (a queued job's queue place and reason, a running one's engine
        phase: :func:`labsdk.display.job_progress`) and the latest ``reward/mean``. Raises ``JobFailedError`` or ``JobCancelledError`` (with ``.job``)
        when the job ends otherwise, ``WaitTimeoutError`` (with the last ``.job`` seen)
        when time runs out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.retrieve(job_id)
        bar = tqdm(total=job.max_steps, desc=job_id, unit="step", disable=None if progress else True, dynamic_ncols=True)
        reward: float | None = None
        show_reward = True
        metrics_after: int | None = None
        try:
            while True:
                if not bar.disable:  # a bar is shown only on a terminal (tqdm: disable=None)
                    if show_reward:
                        try:
                            for point in self.metrics(job_id, names=[PROGRESS_METRIC], after_step=metrics_after):
                                metrics_after = point.step
                                if point.values.get(PROGRESS_METRIC) is not None:
                                    reward = point.values[PROGRESS_METRIC]
                        except NotFoundError:
                            # The job was just read, so a 404 here means a Lab without the
                            # metrics endpoint: show steps only rather than fail the wait.
                            show_reward = False
                    self._show(bar, job, reward)
                if job.is_terminal:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeoutError(job, timeout)
                pause = poll_interval
                if deadline is not None:
                    pause = max(0.0, min(pause, deadline - time.monotonic()))
                time.sleep(pause)
                job = self.retrieve(job_id)
        finally:
            bar.close()
        if job.status == "failed":
            raise JobFailedError(job)
        if job.status == "cancelled":
            raise JobCancelledError(job)
        return job

    @staticmethod
    def _show(bar: tqdm, job: Job, reward: float | None) -> None:
        if job.max_steps is not None and bar.total != job.max_steps:
            bar.total = job.max_steps
        bar.n = job.step or 0
        postfix = job_progress(job)
        if reward is not None:
            postfix[PROGRESS_METRIC] = f"{reward:.3f}"
        bar.set_postfix(postfix, refresh=False)
        bar.refresh()
