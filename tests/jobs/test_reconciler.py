"""The reconciler's rules on a fake launcher: every row of the exit-code table (docs/api.md),
launching without holding locks, batched observation, signals sent outside locks."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.models import UsageInterval
from jobs.launchers import registry
from jobs.pipeline import launch, reconciler
from jobs.launchers.base import AttemptPhase, Observation
from jobs.models import AttemptState, Job, JobAttempt, JobStatus, StopReason
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from tests.support.fake_launcher import FakeLauncher

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

S = JobStatus


@pytest.fixture
def launcher(monkeypatch) -> FakeLauncher:
    fake = FakeLauncher()
    monkeypatch.setattr(registry, "get_launcher", lambda: fake)
    return fake


def running(owner, spec, launcher: FakeLauncher, *, status: str = S.RUNNING) -> tuple[Job, JobAttempt]:
    """A job whose first attempt the fake launcher launched, in ``status``."""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    launch.attempt_launch(attempt_id=attempt.pk)
    if status != S.STARTING:
        job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=S.RUNNING)
    if status == S.CANCELLING:
        job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=S.CANCELLING)
    return Job.objects.unscoped().get(pk=job.pk), JobAttempt.objects.get(pk=attempt.pk)


EXIT_TABLE = [
    # (exit code, oom killed, stop reason, engine error, crashes before, status before) → status, reason, error code
    pytest.param(0, False, "", None, 0, S.RUNNING, S.SUCCEEDED, "", "", id="0 finished"),
    pytest.param(2, False, "", None, 0, S.RUNNING, S.FAILED, "", "invalid_spec", id="2 invalid spec"),
    pytest.param(2, False, "", {"code": "model_not_found", "message": "no such model"}, 0, S.RUNNING, S.FAILED, "", "model_not_found", id="2 engine error"),
    pytest.param(3, False, StopReason.CANCEL, None, 0, S.CANCELLING, S.CANCELLED, "", "", id="3 cancel"),
    pytest.param(3, False, StopReason.RUNTIME, None, 0, S.RUNNING, S.FAILED, "", "max_runtime_exceeded", id="3 runtime"),
    pytest.param(3, False, StopReason.CREDIT, None, 0, S.RUNNING, S.FAILED, "", "insufficient_credit", id="3 credit"),
    pytest.param(3, False, StopReason.SPEND_LIMIT, None, 0, S.RUNNING, S.FAILED, "", "spend_limit_reached", id="3 spend limit"),
    pytest.param(3, False, "", None, 0, S.RUNNING, S.QUEUED, "requeued_after_preemption", "", id="3 preempted"),
    pytest.param(4, False, "", None, 0, S.RUNNING, S.FAILED, "", "oom", id="4 oom"),
    pytest.param(-9, True, "", None, 0, S.RUNNING, S.FAILED, "", "oom", id="OOMKilled"),
    pytest.param(1, False, "", None, 0, S.RUNNING, S.QUEUED, "requeued_after_crash", "", id="crash"),
    pytest.param(-9, False, "", None, 2, S.RUNNING, S.FAILED, "", "max_restarts_exceeded", id="crash past max_restarts"),
    pytest.param(1, False, "", None, 0, S.CANCELLING, S.CANCELLED, "", "", id="crash while cancelling"),
]


@pytest.mark.parametrize("code, oom, stop, engine_error, crashes, before, status, reason, error_code", EXIT_TABLE)
def test_every_row_of_the_exit_code_table(owner, spec, launcher, code, oom, stop, engine_error, crashes, before, status, reason, error_code):
    spec["max_restarts"] = 2
    job, attempt = running(owner, spec, launcher, status=before)
    Job.objects.unscoped().filter(pk=job.pk).update(crash_count=crashes)
    JobAttempt.objects.filter(pk=attempt.pk).update(stop_reason=stop, outcome_error=engine_error)
    launcher.exit(attempt.handle, code, oom_killed=oom)

    reconciler.reconcile_job(job_id=job.pk)

    job = Job.objects.unscoped().get(pk=job.pk)
    assert (job.status, job.status_reason, job.error_code) == (status, reason, error_code)
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert (attempt.state, attempt.exit_code) == (AttemptState.ENDED, code)
    assert launcher.cleanups == [attempt.handle["id"]]
    if engine_error:
        assert job.error_message == "no such model"


def test_a_lost_attempt_counts_as_a_crash(owner, spec, launcher):
    job, attempt = running(owner, spec, launcher)
    launcher.observations[attempt.handle["id"]] = Observation(AttemptPhase.LOST, detail="the supervisor process was killed")
    reconciler.reconcile_job(job_id=job.pk)
    job = Job.objects.unscoped().get(pk=job.pk)
    assert (job.status, job.status_reason, job.crash_count) == (S.QUEUED, "requeued_after_crash", 1)


def locks_refused_while(launcher: FakeLauncher, *querysets) -> list[Exception]:
    """Make the launcher try, from another connection while it works, to lock the rows of
    ``querysets`` at once (NOWAIT); return the refusals it met (none: no row was locked)."""
    refused: list[Exception] = []

    def try_locks():
        def other_connection():
            try:
                with transaction.atomic():
                    for queryset in querysets:
                        list(queryset.select_for_update(nowait=True))
            except Exception as error:  # DatabaseError: could not obtain lock
                refused.append(error)
            finally:
                connection.close()

        thread = threading.Thread(target=other_connection)
        thread.start()
        thread.join()

    launcher.while_working = try_locks
    return refused


def test_launch_passes_a_typed_request_and_records_the_handle(owner, spec, launcher):
    spec["priority"] = "high"
    job, attempt = running(owner, spec, launcher, status=S.STARTING)
    (request,) = launcher.requests
    assert (request.job_id, request.attempt, request.organization, request.project) == (job.public_id, 1, "acme", "default")
    assert (request.priority, request.gpu_type, request.gpus, request.environments) == ("high", "cpu", 0, ("lab/addition",))
    assert (attempt.state, attempt.handle) == (AttemptState.LAUNCHED, {"id": 1})


@pytest.mark.django_db(transaction=True)  # another connection tries the locks
def test_a_launch_holds_no_lock_on_the_job_or_its_attempt(owner, spec, launcher):
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    locked_out = locks_refused_while(
        launcher, Job.objects.unscoped().filter(pk=job.pk), JobAttempt.objects.filter(pk=attempt.pk)
    )
    launch.attempt_launch(attempt_id=attempt.pk)
    assert locked_out == []
    assert JobAttempt.objects.get(pk=attempt.pk).state == AttemptState.LAUNCHED


def test_an_attempt_cancelled_while_it_was_launching_is_stopped_again(owner, spec, launcher):
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)

    def cancel_meanwhile():
        JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())

    launcher.while_working = cancel_meanwhile
    launch.attempt_launch(attempt_id=attempt.pk)
    assert launcher.cancels == [(1, True)] and launcher.cleanups == [1]


def test_a_failing_launcher_fails_the_job_with_internal_error(owner, spec, launcher):
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    launcher.fail_launch = RuntimeError("no nodes")
    launch.attempt_launch(attempt_id=attempt.pk)
    job = Job.objects.unscoped().get(pk=job.pk)
    assert (job.status, job.error_code, job.error_message) == (S.FAILED, "internal_error", "Launch failed: no nodes")
    assert JobAttempt.objects.get(pk=attempt.pk).state == AttemptState.ENDED


@pytest.mark.django_db(transaction=True)  # another connection tries the locks
def test_a_periodic_pass_observes_in_batches_with_no_job_locked(owner, spec, launcher, settings):
    settings.LAB_ORG_MAX_RUNNING_JOBS = 10
    jobs = [running(owner, spec, launcher)[0] for _ in range(5)]
    locked_out = locks_refused_while(launcher, Job.objects.unscoped().filter(pk__in=[job.pk for job in jobs]))
    launcher.exit({"id": 3}, 0)
    assert reconciler.reconcile_all(batch_size=2) == 5
    assert launcher.observe_calls == [2, 2, 1]
    assert locked_out == []
    assert [Job.objects.unscoped().get(pk=job.pk).status for job in jobs] == [S.RUNNING, S.RUNNING, S.SUCCEEDED, S.RUNNING, S.RUNNING]


@pytest.mark.django_db(transaction=True)  # checks that no transaction is open
def test_signals_are_sent_after_the_lock_is_released(owner, spec, launcher, settings):
    settings.LAB_HEARTBEAT_TIMEOUT_S = 0
    job, attempt = running(owner, spec, launcher)
    sent_while_locked = []

    def cancel(handle, *, force=False):
        sent_while_locked.append(connection.in_atomic_block)
        launcher.cancels.append((handle["id"], force))

    launcher.cancel = cancel
    reconciler.reconcile_job(job_id=job.pk)
    assert launcher.cancels == [(1, True)] and sent_while_locked == [False]


def _pass_queries() -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        reconciler.reconcile_all()
    return [query["sql"] for query in queries]


def test_a_pass_over_jobs_with_nothing_to_apply_locks_none_and_reads_per_batch(owner, spec, launcher, settings):
    settings.LAB_ORG_MAX_RUNNING_JOBS = 50
    for _ in range(2):
        running(owner, spec, launcher)
    reconciler.reconcile_all()  # the first pass closes nothing yet: each job's first interval is not due
    few = _pass_queries()
    for _ in range(8):
        running(owner, spec, launcher)
    reconciler.reconcile_all()
    many = _pass_queries()

    assert len(many) == len(few)
    assert not any("FOR UPDATE" in sql for sql in many)


def test_a_pass_still_applies_what_is_due_among_idle_jobs(owner, spec, launcher, settings):
    settings.LAB_ORG_MAX_RUNNING_JOBS = 50
    settings.LAB_USAGE_INTERVAL_S = 60
    idle, _ = running(owner, spec, launcher)
    due, due_attempt = running(owner, spec, launcher)
    stopping, stopping_attempt = running(owner, spec, launcher)
    long_ago = timezone.now() - timedelta(minutes=5)
    JobAttempt.objects.filter(pk=due_attempt.pk).update(launched_at=long_ago, last_heartbeat_at=timezone.now())
    JobAttempt.objects.filter(pk=stopping_attempt.pk).update(stop_requested_at=long_ago, stop_reason=StopReason.CANCEL)

    reconciler.reconcile_all()

    assert UsageInterval.objects.unscoped().filter(job_public_id=due.public_id).count() == 5  # five minutes closed
    assert Job.objects.unscoped().get(pk=due.pk).cpu_seconds == 300.0  # its totals follow while it runs
    assert not UsageInterval.objects.unscoped().filter(job_public_id=idle.public_id).exists()
    assert (stopping_attempt.handle["id"], False) in launcher.cancels  # its stop was escalated
