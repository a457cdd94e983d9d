"""A periodic reconciler pass (``reconcile_all``) on the Kubernetes launcher finishes the jobs
whose attempts ended together, in one transaction: each outcome is applied as a job on its
own would have it (one transition, one webhook message per event, uploads of the ended attempt
failed, missing data named, usage closed), one job that fails (the batch is applied again
without it) leaves the others applied, and it is applied at the next pass."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone as django_timezone

from billing.ledger import job_usage_totals
from billing.models import UsageInterval
from jobs.pipeline import apply, reconciler
from jobs.launchers.kubernetes.launcher import KubernetesLauncher
from jobs.models import AttemptState, Checkpoint, CheckpointStatus, Job, JobAttempt, JobEvent, JobStatus, MetricStep
from jobs.webhooks.models import WebhookEndpoint, WebhookMessage
from tests.support.fake_gateway import FakeGateway, kubernetes_pool
from tests.support.k8s import NAMESPACE, Clock, open_attempt, ready_checkpoint, reload, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

S = JobStatus
TRANSITIONS = ("job.succeeded", "job.failed", "job.requeued", "job.cancelled")


@pytest.fixture
def cluster() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def launcher(monkeypatch, settings, cluster) -> KubernetesLauncher:
    return kubernetes_pool(settings, monkeypatch, cluster, nodes=[{"gpu_type": "cpu", "gpus": 0, "count": 4}], clock=Clock())


def running_since(owner, spec, cluster, minutes: int) -> tuple[Job, JobAttempt, str]:
    """A job whose engine has run for ``minutes`` (its pods' start time) and reported a heartbeat."""
    job, attempt = submit(owner, spec)
    name = attempt.handle["jobset"]
    cluster.admit(NAMESPACE, name)
    started = django_timezone.now() - timedelta(minutes=minutes)
    cluster.run(NAMESPACE, name, started_at=started.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert open_attempt(cluster, job, name).json()["attempt"] == attempt.number
    JobAttempt.objects.filter(pk=attempt.pk).update(last_heartbeat_at=django_timezone.now())
    Job.objects.unscoped().filter(pk=job.pk).update(status=S.RUNNING, started_at=started)
    return reload(job), JobAttempt.objects.get(pk=attempt.pk), name


def end(cluster, name: str, exit_code: int) -> None:
    """The engine of JobSet ``name`` exits now with ``exit_code``."""
    cluster.exit(NAMESPACE, name, exit_code, finished_at=django_timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ"))


def transitions(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job=job, type__in=TRANSITIONS).order_by("pk").values_list("type", flat=True))


@pytest.fixture
def endpoint(owner) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(project=owner.project, url="http://127.0.0.1:9/x", secret="whsec_x",
                                          events=["job.succeeded", "job.requeued", "job.failed", "job.data_incomplete"])


def test_the_jobs_that_ended_are_finished_together_each_as_on_its_own(owner, spec, launcher, cluster, endpoint, caplog):
    spec["max_restarts"] = 2
    complete, complete_attempt, complete_name = running_since(owner, spec, cluster, 3)
    partial, partial_attempt, partial_name = running_since(owner, spec, cluster, 3)
    crashed, crashed_attempt, crashed_name = running_since(owner, spec, cluster, 3)
    still, _, _ = running_since(owner, spec, cluster, 3)
    now = django_timezone.now()
    for step in (1, 2, 3):
        MetricStep.objects.create(job=complete, step=step, attempt=1, time=now, values={"reward/mean": 0.5})
    ready_checkpoint(complete, step=3, attempt=1)
    MetricStep.objects.create(job=partial, step=2, attempt=1, time=now, values={"reward/mean": 0.5})
    uploading = Checkpoint.objects.create(job=partial, step=2, attempt=1, status=CheckpointStatus.UPLOADING,
                                          format="peft-lora", storage_key=f"{partial.public_id}/2.tar", size_bytes=1)
    end(cluster, complete_name, 0)
    end(cluster, partial_name, 0)
    end(cluster, crashed_name, 1)

    with caplog.at_level(logging.WARNING, logger="jobs.pipeline"):
        assert reconciler.reconcile_all() == 4
        reconciler.reconcile_all()  # a second pass changes nothing more

    # Applied by the batch itself, not by each job's own turn after the batch failed.
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []

    assert (reload(complete).status, reload(partial).status, reload(still).status) == (S.SUCCEEDED, S.SUCCEEDED, S.RUNNING)
    assert (reload(crashed).status, reload(crashed).status_reason, reload(crashed).crash_count) == (
        S.QUEUED, "requeued_after_crash", 1)
    assert (transitions(complete), transitions(partial), transitions(crashed)) == (
        ["job.succeeded"], ["job.succeeded"], ["job.requeued"])
    for attempt in (complete_attempt, partial_attempt, crashed_attempt):
        attempt.refresh_from_db()
        assert attempt.state == AttemptState.ENDED and attempt.exit_code in (0, 1)
    # The data of the partial job is named once; the complete one has no warning.
    assert not JobEvent.objects.filter(job=complete, type="job.data_incomplete").exists()
    warning = JobEvent.objects.get(job=partial, type="job.data_incomplete")
    assert warning.data["missing_metric_steps"] == "1, 3" and warning.data["final_checkpoint"] is None
    uploading.refresh_from_db()
    assert uploading.status == CheckpointStatus.FAILED
    # One webhook message per event, each event once.
    events = JobEvent.objects.filter(job__in=[complete, partial, crashed], type__in=endpoint.events)
    assert events.count() == 4
    assert sorted(WebhookMessage.objects.filter(job_event__in=events).values_list("job_event_id", flat=True)) == sorted(
        events.values_list("pk", flat=True))
    # Usage closed up to the pods' end, and the jobs' totals are the ledger's.
    for job in (complete, partial, crashed):
        assert UsageInterval.objects.unscoped().filter(job_public_id=job.public_id).exists()
        totals = job_usage_totals(job.public_id)
        job = reload(job)
        assert (job.gpu_seconds, job.cpu_seconds) == (
            pytest.approx(float(totals.gpu_seconds)), pytest.approx(float(totals.cpu_seconds)))
        assert job.gpu_seconds + job.cpu_seconds >= 170  # the pods ran three minutes


def test_a_job_that_fails_to_finish_leaves_the_others_finished_and_finishes_at_the_next_pass(
        owner, spec, launcher, cluster, endpoint, monkeypatch):
    first, first_attempt, first_name = running_since(owner, spec, cluster, 2)
    second, _, second_name = running_since(owner, spec, cluster, 2)
    end(cluster, first_name, 0)
    end(cluster, second_name, 0)
    real = apply.job_transition

    def broken_for_first(*, job, **kwargs):
        if job.pk == first.pk:
            raise RuntimeError("the database went away")
        return real(job=job, **kwargs)

    monkeypatch.setattr(apply, "job_transition", broken_for_first)
    reconciler.reconcile_all()

    assert (reload(first).status, reload(second).status) == (S.RUNNING, S.SUCCEEDED)
    first_attempt.refresh_from_db()
    assert first_attempt.state == AttemptState.LAUNCHED  # nothing of its finish was kept
    assert not JobEvent.objects.filter(job=first, type="job.data_incomplete").exists()

    monkeypatch.setattr(apply, "job_transition", real)
    reconciler.reconcile_all()

    assert reload(first).status == S.SUCCEEDED
    assert (transitions(first), transitions(second)) == (["job.succeeded"], ["job.succeeded"])
    assert JobEvent.objects.filter(job=first, type="job.data_incomplete").count() == 1
    assert WebhookMessage.objects.filter(job_event__job=first).count() == 2  # succeeded, data_incomplete


def test_finishing_ended_jobs_takes_as_many_queries_for_six_as_for_two_plus_their_own_writes(
        owner, spec, launcher, cluster, monkeypatch):
    """What finishing reads is read once per pass; per job only its own writes remain."""
    real, counted = reconciler.finish_ended, []

    def counting(job_ids, seen, launcher):
        with CaptureQueriesContext(connection) as captured:
            left = real(job_ids, seen, launcher)
        counted.append(len(captured))
        return left

    monkeypatch.setattr(reconciler, "finish_ended", counting)

    def finish_queries(count: int) -> int:
        names = [running_since(owner, spec, cluster, 2)[2] for _ in range(count)]
        for name in names:
            end(cluster, name, 0)
        counted.clear()
        reconciler.reconcile_all()
        assert Job.objects.unscoped().filter(status=S.SUCCEEDED).count() == count + (2 if count == 6 else 0)
        assert len(counted) == 1  # one batch
        return counted[0]

    two = finish_queries(2)
    six = finish_queries(6)
    # Per job: the UPDATE of its row (attempts are ended in one statement, events with their
    # stream numbers stored together; webhook endpoints and latest checkpoints are read once
    # for all).
    per_job = (six - two) / 4
    assert per_job <= 1, (two, six, per_job)  # 25 when each job was locked and read on its own, then 9


def test_the_records_of_jobs_finished_together_are_numbered_in_the_order_they_were_made(owner, spec, launcher, cluster):
    """Events stored together at the end of the batch keep their place in each job's stream,
    also between the checkpoint changes numbered on the way (two failed uploads, each change
    followed by its event), every number once."""
    from jobs.stream.records import read_after

    partial, _, partial_name = running_since(owner, spec, cluster, 3)
    other, _, other_name = running_since(owner, spec, cluster, 3)
    for step in (1, 2):
        Checkpoint.objects.create(job=partial, step=step, attempt=1, status=CheckpointStatus.UPLOADING,
                                  format="peft-lora", storage_key=f"{partial.public_id}/{step}.tar", size_bytes=1)
    end(cluster, partial_name, 0)
    end(cluster, other_name, 0)

    reconciler.reconcile_all()

    for job, finish in (
        (partial, [("checkpoint", "failed"), ("event", "checkpoint.failed")] * 2 + [
            ("event", "job.data_incomplete"), ("event", "job.succeeded"), ("status", "succeeded")]),
        (other, [("event", "job.data_incomplete"), ("event", "job.succeeded"), ("status", "succeeded")]),
    ):
        records, complete = read_after(job.pk, 0)
        assert complete
        assert [record.seq for record in records] == list(range(1, reload(job).stream_seq + 1))
        tail = [(record.event, json.loads(record.data).get("type") or json.loads(record.data)["status"])
                for record in records[-len(finish):]]
        assert tail == finish
