"""The exit-code table (docs/api.md "Engine exit codes"): what an attempt that ended means for its job.

``decide`` is pure (no database, no launcher): given what the launcher saw and what the job and
attempt say, it returns the ``Outcome`` to apply; ``jobs.pipeline.apply`` applies it under the
job's lock.

| exit | Lab |
|---|---|
| 0 | ``succeeded`` |
| 2 | ``failed`` with the engine's error (default ``invalid_spec``), never retried |
| 3 | a stop Lab asked for ends as asked (cancel → ``cancelled``, runtime → ``failed``
       ``max_runtime_exceeded``, credit → ``failed`` ``insufficient_credit``, the monthly
       spend limit → ``failed`` ``spend_limit_reached``); otherwise
       (preemption) ``queued`` again to resume, kept at its place in Kueue when Kueue keeps it |
| launcher failure | ``failed`` with the launcher's reason (``image_pull_failed``, ``unschedulable``,
       ``max_runtime_exceeded``), unless the job was being cancelled |
| 4, OOM | ``failed`` (``oom``) |
| other, killed, lost | ``cancelled`` when the job was being cancelled; else ``queued`` to resume,
       up to ``max_restarts``; then ``failed`` (``max_restarts_exceeded``) |

An evaluation job's 0 whose samples did not all arrive counts as a crash (``incomplete_evaluation``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.launchers.base import AttemptPhase, Observation
from jobs.models import ErrorCode, JobStatus, StatusReason, StopReason

S = JobStatus

#: Launcher reasons that end a job for good: a cluster that cannot run it (docs/api.md "Statuses": error codes).
LAUNCHER_FAILURES = frozenset({ErrorCode.IMAGE_PULL_FAILED, ErrorCode.UNSCHEDULABLE, ErrorCode.MAX_RUNTIME_EXCEEDED})
#: The exit code an engine's ``finish`` report stands for once its process is gone without one.
OUTCOME_EXIT_CODES = {"succeeded": 0, "failed": 2, "stopped": 3}


@dataclass(frozen=True)
class Outcome:
    """What to do with a job whose attempt ended: move it to ``to`` with these
    ``job_transition`` arguments (``reason``, ``error_code``, ``error_message``, ``message``),
    its event's data being ``{"attempt", "exit_code": exit_code}`` and ``data``.

    ``crashes``: the job's new crash count, to store first (a crash), else None. ``park``: keep
    what ran the attempt in the cluster's queue for the next one (a Kueue preemption). An
    ``error_code`` of ``spend_limit_reached`` with no ``error_message`` takes the organization's
    spend-limit message, which the applier reads."""

    to: str
    exit_code: int | None
    reason: str = ""
    error_code: str = ""
    error_message: str = ""
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    crashes: int | None = None
    park: bool = False


def implied_exit_code(observation: Observation, outcome: str) -> int | None:
    """Return the exit code an attempt that left none stands for: a preemption (a Kueue eviction,
    a disrupted pod) is a stop from outside (3); an attempt whose process is gone after its engine
    reported ``finish`` (``outcome``: a JobSet removed after it ended) ended as reported; else None."""
    if observation.reason == "preempted":
        return 3
    if observation.phase == AttemptPhase.LOST and outcome:
        return OUTCOME_EXIT_CODES.get(outcome)
    return None


def decide(
    observation: Observation,
    *,
    attempt_number: int,
    outcome: str = "",
    engine_error: dict[str, Any] | None = None,
    stop_reason: str = "",
    cancelling: bool = False,
    crash_count: int = 0,
    max_restarts: int = 0,
    max_runtime_minutes: float | None = None,
    job_id: str = "",
) -> Outcome:
    """Return what the exit-code table says of an attempt that ended (exited or lost).

    ``observation`` is what the launcher saw; ``outcome`` and ``engine_error`` what the engine
    reported in its ``finish`` (``JobAttempt.outcome``, ``outcome_error``), ``stop_reason`` the
    stop Lab asked of the attempt (``StopReason``, empty for none); ``cancelling`` whether the job
    is ``cancelling``; ``crash_count`` its crashes so far, ``max_restarts`` and
    ``max_runtime_minutes`` from its spec; ``job_id`` the job's public id, which a crash's
    message names for ``lab jobs logs``."""
    code = observation.exit_code if observation.exit_code is not None else implied_exit_code(observation, outcome)
    engine_error = engine_error or {}
    if code == 0:
        return Outcome(S.SUCCEEDED, code, message="Finished all steps.")
    if code == 2:
        return Outcome(
            S.FAILED, code, error_code=engine_error.get("code") or "invalid_spec",
            error_message=engine_error.get("message") or observation.detail[-2000:],
        )
    if code == 3 and (stop_reason or cancelling):
        return _asked_stop(stop_reason or StopReason.CANCEL, code, max_runtime_minutes)
    if code == 3 and observation.kept_in_queue:
        return Outcome(
            S.QUEUED, code, reason=StatusReason.REQUEUED_AFTER_PREEMPTION,
            message="Preempted; waiting in Kueue at its place to resume from the latest checkpoint.",
            data={"kept_in_queue": True}, park=True,
        )
    if code == 3:
        return Outcome(S.QUEUED, code, reason=StatusReason.REQUEUED_AFTER_PREEMPTION, message="Stopped from outside; requeued.")
    if observation.reason in LAUNCHER_FAILURES and not cancelling:
        return Outcome(S.FAILED, code, error_code=observation.reason, error_message=observation.detail[-2000:])
    if code == 4 or observation.oom_killed:
        return Outcome(S.FAILED, code, error_code=ErrorCode.OOM, error_message="The engine ran out of memory.")
    if cancelling:
        return Outcome(S.CANCELLED, code, message="Stopped, as requested.")
    return _crashed(
        code, crash_line(observation, engine_error), attempt_number=attempt_number, crash_count=crash_count,
        max_restarts=max_restarts, job_id=job_id,
    )


def crash_line(observation: Observation, engine_error: dict[str, Any]) -> str:
    """Return the one line that says why an attempt crashed: the exception line the engine
    reported in its ``finish`` (the last line of its traceback, ``KeyError: 'x'``), else the last
    line the launcher saw on its stderr (a process killed before it could report), else
    ``no output``; at most 500 characters."""
    reported = str(engine_error.get("message") or "").strip()
    if reported:
        return reported[:500]
    return (observation.detail.strip().splitlines()[-1:] or ["no output"])[0][:500]


def _crashed(
    code: int | None, what: str, *, attempt_number: int, crash_count: int, max_restarts: int, job_id: str = ""
) -> Outcome:
    """Return the outcome of one more crash (``what`` says how it ended): ``queued`` to resume,
    up to ``max_restarts``; then ``failed`` (``max_restarts_exceeded``), the message ending with
    the command that shows the job's log (``job_id``, its public id), where the whole traceback is."""
    crashes = crash_count + 1
    if crashes > max_restarts:
        logs = f"; the traceback: lab jobs logs {job_id}" if job_id else ""
        return Outcome(
            S.FAILED, code, error_code=ErrorCode.MAX_RESTARTS_EXCEEDED,
            error_message=f"The engine crashed {crashes} times (exit {code}): {what}{logs}", crashes=crashes,
        )
    return Outcome(
        S.QUEUED, code, reason=StatusReason.REQUEUED_AFTER_CRASH,
        message=f"Attempt {attempt_number} crashed (exit {code}); resuming from the latest checkpoint.",
        data={"crashes": crashes}, crashes=crashes,
    )


def incomplete_evaluation(
    succeeded: Outcome, missing: str, *, attempt_number: int, crash_count: int, max_restarts: int, job_id: str = ""
) -> Outcome:
    """Return what an evaluation attempt that exited 0 (``succeeded``) means when some of its
    samples never arrived (``missing``, ``jobs.evaluation_samples.missing_evaluation_samples``):
    a crash, since those samples are still owed (the next attempt samples the same prompts again
    and Lab stores each sample once), up to ``max_restarts``; then ``failed``. An evaluation never
    succeeds without all of its samples."""
    if not missing:
        return succeeded
    what = f"the evaluation ended without all of its samples ({missing[:400]})"
    return _crashed(
        succeeded.exit_code, what, attempt_number=attempt_number, crash_count=crash_count, max_restarts=max_restarts,
        job_id=job_id,
    )


def _asked_stop(reason: str, code: int, max_runtime_minutes: float | None) -> Outcome:
    """Return the outcome of a stop Lab asked for (``reason``, a ``StopReason``) that the engine obeyed."""
    if reason == StopReason.CANCEL:
        return Outcome(S.CANCELLED, code, message="Stopped after a checkpoint, as requested.")
    if reason == StopReason.RUNTIME:
        return Outcome(
            S.FAILED, code, error_code=ErrorCode.MAX_RUNTIME_EXCEEDED,
            error_message=f"The job ran longer than max_runtime_minutes ({max_runtime_minutes}).",
        )
    if reason == StopReason.SPEND_LIMIT:
        return Outcome(S.FAILED, code, error_code=ErrorCode.SPEND_LIMIT_REACHED)
    return Outcome(S.FAILED, code, error_code=ErrorCode.INSUFFICIENT_CREDIT, error_message="Out of credit.")
