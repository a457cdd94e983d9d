"""The exit-code table (``jobs.pipeline.outcomes.decide``), one test per row: pure, no database."""

from __future__ import annotations

from jobs.launchers.base import AttemptPhase, Observation
from jobs.models import ErrorCode, JobStatus, StatusReason, StopReason
from jobs.pipeline.outcomes import Outcome, decide, implied_exit_code

S = JobStatus


def exited(code: int | None, **fields) -> Observation:
    return Observation(phase=AttemptPhase.EXITED, exit_code=code, **fields)


def test_exit_0_succeeds():
    assert decide(exited(0), attempt_number=1) == Outcome(S.SUCCEEDED, 0, message="Finished all steps.")


def test_exit_2_fails_with_the_engines_error_never_retried():
    outcome = decide(exited(2), attempt_number=1, engine_error={"code": "invalid_environment", "message": "no such env"})
    assert outcome == Outcome(S.FAILED, 2, error_code="invalid_environment", error_message="no such env")


def test_exit_2_without_an_engine_error_fails_as_invalid_spec_with_the_output_tail():
    outcome = decide(exited(2, detail="x" * 3000 + "the end"), attempt_number=1)
    assert (outcome.to, outcome.error_code) == (S.FAILED, "invalid_spec")
    assert outcome.error_message.endswith("the end") and len(outcome.error_message) == 2000


def test_exit_3_after_a_cancel_is_cancelled():
    outcome = decide(exited(3), attempt_number=1, stop_reason=StopReason.CANCEL)
    assert outcome == Outcome(S.CANCELLED, 3, message="Stopped after a checkpoint, as requested.")
    assert decide(exited(3), attempt_number=1, cancelling=True) == outcome


def test_exit_3_after_the_runtime_stop_fails_as_max_runtime_exceeded():
    outcome = decide(exited(3), attempt_number=1, stop_reason=StopReason.RUNTIME, max_runtime_minutes=30)
    assert outcome == Outcome(
        S.FAILED, 3, error_code=ErrorCode.MAX_RUNTIME_EXCEEDED,
        error_message="The job ran longer than max_runtime_minutes (30).",
    )


def test_exit_3_after_the_spend_limit_stop_fails_as_spend_limit_reached_with_the_organizations_message():
    outcome = decide(exited(3), attempt_number=1, stop_reason=StopReason.SPEND_LIMIT)
    assert outcome == Outcome(S.FAILED, 3, error_code=ErrorCode.SPEND_LIMIT_REACHED)  # the applier reads the message


def test_exit_3_after_the_credit_stop_fails_as_insufficient_credit():
    outcome = decide(exited(3), attempt_number=1, stop_reason=StopReason.CREDIT)
    assert outcome == Outcome(S.FAILED, 3, error_code=ErrorCode.INSUFFICIENT_CREDIT, error_message="Out of credit.")


def test_exit_3_kept_in_kueue_is_queued_and_parked():
    outcome = decide(exited(3, kept_in_queue=True), attempt_number=1)
    assert outcome == Outcome(
        S.QUEUED, 3, reason=StatusReason.REQUEUED_AFTER_PREEMPTION,
        message="Preempted; waiting in Kueue at its place to resume from the latest checkpoint.",
        data={"kept_in_queue": True}, park=True,
    )


def test_exit_3_from_outside_is_requeued():
    outcome = decide(exited(3), attempt_number=1)
    assert outcome == Outcome(
        S.QUEUED, 3, reason=StatusReason.REQUEUED_AFTER_PREEMPTION, message="Stopped from outside; requeued."
    )


def test_a_launcher_failure_fails_with_its_reason_unless_cancelling():
    seen = Observation(phase=AttemptPhase.LOST, reason=ErrorCode.IMAGE_PULL_FAILED, detail="ErrImagePull")
    assert decide(seen, attempt_number=1) == Outcome(
        S.FAILED, None, error_code=ErrorCode.IMAGE_PULL_FAILED, error_message="ErrImagePull"
    )
    assert decide(seen, attempt_number=1, cancelling=True).to == S.CANCELLED


def test_exit_4_or_an_oom_kill_fails_as_oom():
    oom = Outcome(S.FAILED, 4, error_code=ErrorCode.OOM, error_message="The engine ran out of memory.")
    assert decide(exited(4), attempt_number=1) == oom
    assert decide(exited(137, oom_killed=True), attempt_number=1) == Outcome(
        S.FAILED, 137, error_code=ErrorCode.OOM, error_message="The engine ran out of memory."
    )


def test_any_other_end_of_a_cancelling_job_is_cancelled():
    assert decide(exited(-9), attempt_number=1, cancelling=True) == Outcome(S.CANCELLED, -9, message="Stopped, as requested.")


def test_a_crash_within_max_restarts_is_requeued_and_counted():
    outcome = decide(exited(1, detail="boom\n"), attempt_number=2, crash_count=0, max_restarts=3)
    assert outcome == Outcome(
        S.QUEUED, 1, reason=StatusReason.REQUEUED_AFTER_CRASH,
        message="Attempt 2 crashed (exit 1); resuming from the latest checkpoint.", data={"crashes": 1}, crashes=1,
    )


def test_a_crash_past_max_restarts_fails_as_max_restarts_exceeded():
    outcome = decide(exited(1, detail="line\nTraceback: last words"), attempt_number=4, crash_count=3, max_restarts=3)
    assert outcome == Outcome(
        S.FAILED, 1, error_code=ErrorCode.MAX_RESTARTS_EXCEEDED,
        error_message="The engine crashed 4 times (exit 1): Traceback: last words", crashes=4,
    )
    lost = decide(Observation(phase=AttemptPhase.LOST), attempt_number=1, max_restarts=0)
    assert lost.error_message == "The engine crashed 1 times (exit None): no output"


def test_a_crash_past_max_restarts_names_the_exception_the_engine_reported_and_the_logs_command():
    """The engine's stderr goes to the job's log, not to the launcher: the exception line comes
    from its finish report, and the message says where the whole traceback is."""
    outcome = decide(
        exited(1, detail=""), attempt_number=3, crash_count=2, max_restarts=2, job_id="job_abc",
        engine_error={"code": "internal_error", "message": "KeyError: 'data_plane_url'"},
    )
    assert outcome.error_message == (
        "The engine crashed 3 times (exit 1): KeyError: 'data_plane_url'; the traceback: lab jobs logs job_abc"
    )
    silent = decide(exited(1, detail=""), attempt_number=1, max_restarts=0, job_id="job_abc")
    assert silent.error_message == "The engine crashed 1 times (exit 1): no output; the traceback: lab jobs logs job_abc"


def test_an_attempt_that_left_no_exit_code_stands_for_a_preemption_or_its_finish_report():
    assert implied_exit_code(Observation(phase=AttemptPhase.LOST, reason="preempted"), "") == 3
    assert implied_exit_code(Observation(phase=AttemptPhase.LOST), "succeeded") == 0
    assert implied_exit_code(Observation(phase=AttemptPhase.LOST), "failed") == 2
    assert implied_exit_code(Observation(phase=AttemptPhase.LOST), "stopped") == 3
    assert implied_exit_code(Observation(phase=AttemptPhase.EXITED), "succeeded") is None
    assert implied_exit_code(Observation(phase=AttemptPhase.LOST), "") is None
    assert decide(Observation(phase=AttemptPhase.LOST), attempt_number=1, outcome="succeeded").to == S.SUCCEEDED
