"""``LAB_LAUNCHER=kubernetes`` through the real reconciler against the gateway fake: the same
lifecycles as the local launcher (succeed, cancel, preempt-and-resume, crash-and-fail, OOM),
a preempted job kept at its Kueue place and resumed in the same JobSet (jobs.readmission), the
cluster's own failures (image pull, unschedulable, Kueue pending), a JobSet deleted by hand
or gone after its engine finished, and an API outage in which nothing is launched twice."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.utils import timezone as django_timezone
from rest_framework.test import APIClient

from jobs.pipeline import launch, reconciler
from jobs.admission import admission_pass
from jobs.ingest.tokens import bootstrap_token, job_token
from jobs.launchers.base import AttemptPhase
from jobs.launchers.kubernetes.launcher import KubernetesLauncher
from jobs.launchers.kubernetes.objects import jobset_name
from jobs.models import AttemptState, Job, JobAttempt, JobStatus
from jobs.serializers import job_to_dict
from jobs.services import job_cancel, job_claim_for_start, job_restart, job_submit, job_transition
from lab.audit import Actor
from tests.support.fake_gateway import FakeGateway, kubernetes_pool
from tests.support.k8s import (
    NAMESPACE,
    Clock,
    engine_pod,
    open_attempt,
    ready_checkpoint,
    reload,
    secret_bootstrap_token,
    submit,
)


@pytest.fixture
def cluster() -> FakeGateway:
    return FakeGateway()


pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

S = JobStatus


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def launcher(monkeypatch, settings, cluster, clock) -> KubernetesLauncher:
    return kubernetes_pool(
        settings, monkeypatch, cluster, nodes=[{"gpu_type": "H100", "gpus": 8, "count": 2}, {"gpu_type": "cpu", "gpus": 0, "count": 4}],
        clock=clock, engine_image="lab-engine-gpu:test", shared_pvc="lab-shared",
    )


@pytest.fixture
def gpu_spec(spec) -> dict:
    spec["resources"] = {"gpu_type": "H100", "gpus": 2}
    return spec


def running(owner, spec, cluster) -> tuple[Job, JobAttempt, str]:
    """A job whose attempt Kueue admitted and whose engine runs (it opened its attempt and sent a heartbeat)."""
    job, attempt = submit(owner, spec)
    name = attempt.handle["jobset"]
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)
    assert open_attempt(cluster, job, name).json()["attempt"] == attempt.number  # the engine's pod starts
    JobAttempt.objects.filter(pk=attempt.pk).update(last_heartbeat_at=django_timezone.now())
    job_transition(job=reload(job), to=S.RUNNING)  # the engine's first heartbeat says running
    reconciler.reconcile_job(job_id=job.pk)
    return reload(job), JobAttempt.objects.get(pk=attempt.pk), name


def jobsets(cluster: FakeGateway) -> list[str]:
    return sorted(name for kind, _, name in cluster.objects if kind == "JobSet")


def test_it_launches_the_namespace_queue_jobset_and_secret_and_succeeds(owner, gpu_spec, launcher, cluster):
    job, attempt = submit(owner, gpu_spec)
    name = jobset_name(job.public_id, 1)

    assert attempt.state == AttemptState.LAUNCHED
    assert attempt.handle["namespace"] == NAMESPACE and attempt.handle["jobset"] == name
    assert {key for key in cluster.objects if key[0] in ("Namespace", "LocalQueue", "JobSet", "Secret")} == {
        ("Namespace", "", NAMESPACE), ("LocalQueue", NAMESPACE, "lab"), ("JobSet", NAMESPACE, name), ("Secret", NAMESPACE, name)}
    assert cluster.jobset(NAMESPACE, name)["spec"]["suspend"] is True

    reconciler.reconcile_job(job_id=job.pk)
    assert (reload(job).status, reload(job).status_reason) == (S.STARTING, "kueue_pending")  # waiting in Kueue
    assert launcher.observe(attempt.handle).reason == "kueue_pending"
    assert job_to_dict(reload(job))["status_reason"] == "kueue_pending"

    cluster.admit(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)
    assert (reload(job).status, reload(job).status_reason) == (S.STARTING, "")  # admitted: its pods start
    cluster.run(NAMESPACE, name)
    assert launcher.observe(attempt.handle).phase == AttemptPhase.RUNNING
    cluster.exit(NAMESPACE, name, 0)
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.error_code) == (S.SUCCEEDED, "")
    assert JobAttempt.objects.get(pk=attempt.pk).exit_code == 0
    assert jobsets(cluster) == [] and ("Secret", NAMESPACE, name) not in cluster.objects  # cleaned up with its Secret


def test_a_cancel_stops_the_pods_and_ends_cancelled(owner, spec, launcher, cluster, settings):
    settings.LAB_STOP_GRACE_S = 0
    job, attempt, name = running(owner, spec, cluster)

    job_cancel(job=job, actor=Actor(user=owner.user))
    reconciler.reconcile_job(job_id=job.pk)  # the grace is over: SIGTERM, i.e. the pods are deleted
    assert [delete for delete in cluster.deletes if delete[0] == "Pod"] == [("Pod", f"{name}-engine-0-pod", None)]
    assert reload(job).status == S.CANCELLING

    cluster.exit(NAMESPACE, name, 3, delete_pods=True)  # the engine checkpointed and exited 3
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert job.status == S.CANCELLED
    assert JobAttempt.objects.get(pk=attempt.pk).exit_code == 3
    assert jobsets(cluster) == []


def test_a_job_cancelled_while_kueue_holds_it_deletes_the_jobset(owner, spec, launcher, cluster, settings):
    settings.LAB_STOP_GRACE_S = 0
    job, attempt = submit(owner, spec)

    job_cancel(job=job, actor=Actor(user=owner.user))
    reconciler.reconcile_job(job_id=job.pk)
    assert jobsets(cluster) == []
    reconciler.reconcile_job(job_id=job.pk)

    assert reload(job).status == S.CANCELLED


def heartbeat(job: Job, token: str, attempt: int):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client.post(f"/api/v1/ingest/jobs/{job.public_id}/status",
                       {"attempt": attempt, "phase": "running", "step": 3}, format="json")


def test_the_first_pod_opens_the_launched_attempt_and_gets_its_token(owner, gpu_spec, launcher, cluster):
    job, attempt = submit(owner, gpu_spec)
    name = attempt.handle["jobset"]
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)

    answer = open_attempt(cluster, job, name)

    assert answer.status_code == 200, answer.content
    assert answer.json() == {"attempt": 1, "token": job_token(attempt), "resume_from": None, "environment_packages": []}
    assert JobAttempt.objects.get(pk=attempt.pk).handle["pod_uid"] == engine_pod(cluster, name)["metadata"]["uid"]
    assert open_attempt(cluster, job, name).json() == answer.json()  # a retried call: the same attempt
    assert heartbeat(job, answer.json()["token"], 1).json() == {"action": "continue"}
    assert reload(job).status == S.RUNNING


def test_a_kueue_eviction_keeps_the_jobset_in_its_queue_place_and_the_readmitted_pod_resumes_as_the_next_attempt(
        owner, gpu_spec, launcher, cluster, no_broker):
    job, attempt = submit(owner, gpu_spec)
    name = attempt.handle["jobset"]
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)
    first = open_attempt(cluster, job, name).json()
    heartbeat(job, first["token"], 1)
    checkpoint = ready_checkpoint(reload(job), step=2, attempt=1)

    cluster.evict(NAMESPACE, name)  # Kueue preempts: the JobSet is suspended again, its pods go
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.status_reason, job.crash_count, job.attempt) == (S.QUEUED, "requeued_after_preemption", 0, 1)
    ended = JobAttempt.objects.get(pk=attempt.pk)
    assert ended.state == AttemptState.ENDED and ended.handle["parked"] is True
    assert jobsets(cluster) == [name] and cluster.jobset(NAMESPACE, name)["spec"]["suspend"] is True
    assert ("Secret", NAMESPACE, name) in cluster.objects
    assert [delete for delete in cluster.deletes if delete[0] == "JobSet"] == []

    assert admission_pass().started == []  # Kueue, not Lab, starts it again
    reconciler.reconcile_all()  # the parked JobSet is neither an orphan nor ended
    assert (reload(job).status, reload(job).attempt, jobsets(cluster)) == (S.QUEUED, 1, [name])

    cluster.admit(NAMESPACE, name)  # Kueue readmits the same Workload; a new pod starts
    cluster.run(NAMESPACE, name, started_at="2026-12-01T13:00:00Z")
    second = open_attempt(cluster, job, name)

    assert second.status_code == 200, second.content
    assert second.json()["attempt"] == 2 and second.json()["resume_from"] == checkpoint.public_id
    assert second.json()["token"] != first["token"]
    assert open_attempt(cluster, job, name).json() == second.json()  # idempotent by pod uid
    job = reload(job)
    assert (job.status, job.attempt, job.step) == (S.STARTING, 2, 2)
    new = JobAttempt.objects.get(job=job, number=2)
    assert (new.state, new.handle["jobset"], new.resume_from_id) == (AttemptState.LAUNCHED, name, checkpoint.pk)
    assert heartbeat(job, first["token"], 1).json() == {"action": "stop"}  # the old attempt's token is stale
    assert heartbeat(job, second.json()["token"], 2).json() == {"action": "continue"}
    reconciler.reconcile_all()
    assert reload(job).status == S.RUNNING
    assert launcher.observe(new.handle).started_at == datetime(2026, 12, 1, 13, 0, tzinfo=timezone.utc)

    cluster.exit(NAMESPACE, name, 0)
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.attempt) == (S.SUCCEEDED, 2)
    assert JobAttempt.objects.get(pk=new.pk).exit_code == 0
    assert jobsets(cluster) == []  # never a second JobSet; this one cleaned up at the end
    assert ("launch", new.pk) not in no_broker


def test_a_pod_readmitted_before_lab_saw_the_eviction_waits_until_the_previous_attempt_ends(owner, spec, launcher, cluster):
    job, attempt = submit(owner, spec)
    name = attempt.handle["jobset"]
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)
    open_attempt(cluster, job, name)
    cluster.evict(NAMESPACE, name)
    cluster.admit(NAMESPACE, name)  # readmitted at once
    cluster.run(NAMESPACE, name)

    early = open_attempt(cluster, job, name)
    assert (early.status_code, early.json()["error"]["code"], early["Retry-After"]) == (409, "attempt_not_ready", "5")
    assert reload(job).attempt == 1

    reconciler.reconcile_job(job_id=job.pk)  # the attempt's pod was replaced: it ended, kept in the queue
    assert (reload(job).status, reload(job).status_reason) == (S.QUEUED, "requeued_after_preemption")
    later = open_attempt(cluster, job, name)

    assert later.status_code == 200 and later.json()["attempt"] == 2
    reconciler.reconcile_job(job_id=job.pk)
    assert (reload(job).status, jobsets(cluster)) == (S.STARTING, [name])


def test_a_parked_jobset_that_goes_away_lets_lab_start_the_job_anew(owner, spec, launcher, cluster, clock):
    job, attempt, name = running(owner, spec, cluster)
    cluster.evict(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)
    cluster.delete(cluster_kind("JobSet"), name, NAMESPACE)  # by hand, while it waits in Kueue

    reconciler.reconcile_all()

    assert JobAttempt.objects.get(pk=attempt.pk).handle["parked"] is False
    assert [job.pk for job in [reload(job)] if job.status == S.QUEUED] == [job.pk]
    assert admission_pass().started == [job.pk]
    second = JobAttempt.objects.get(job=job, number=2)
    launch.attempt_launch(attempt_id=second.pk)
    assert jobsets(cluster) == [jobset_name(job.public_id, 2)]


def test_a_parked_jobset_whose_pods_fail_before_opening_an_attempt_is_replaced(owner, spec, launcher, cluster):
    job, attempt, name = running(owner, spec, cluster)
    cluster.evict(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)
    cluster.exit(NAMESPACE, name, 1)  # crashed before it asked Lab for its attempt

    reconciler.reconcile_all()

    assert JobAttempt.objects.get(pk=attempt.pk).handle["parked"] is False
    assert jobsets(cluster) == []
    assert admission_pass().started == [job.pk]


def test_no_attempt_opens_for_an_ended_job_or_another_jobset(owner, spec, launcher, cluster):
    job, attempt, name = running(owner, spec, cluster)
    other = open_attempt(cluster, job, name, pod={"metadata": {"uid": "uid-stranger"}})
    assert (other.status_code, other.json()["error"]["code"]) == (409, "attempt_not_ready")  # the attempt has its pod

    job_transition(job=reload(job), to=S.FAILED, error_code="internal_error")
    ended = open_attempt(cluster, job, name)  # the job's end expired the JobSet's bootstrap token

    assert (ended.status_code, ended.json()["error"]["code"]) == (401, "invalid_api_key")
    assert JobAttempt.objects.filter(job=job).count() == 1


def test_a_disrupted_pod_reads_as_a_preemption(owner, spec, launcher, cluster):
    job, attempt, name = running(owner, spec, cluster)
    pod = cluster.objects[("Pod", NAMESPACE, f"{name}-engine-0-pod")]
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"})
    cluster._store(cluster_kind("Pod"), pod, "MODIFIED")
    cluster.exit(NAMESPACE, name, 143)

    reconciler.reconcile_job(job_id=job.pk)

    assert (reload(job).status, reload(job).status_reason) == (S.QUEUED, "requeued_after_preemption")


def cluster_kind(name: str):
    from jobs.launchers.kubernetes.kinds import KINDS

    return KINDS[name]


def test_crashes_resume_until_max_restarts_then_fail(owner, spec, launcher, cluster):
    spec["max_restarts"] = 1
    job, attempt, name = running(owner, spec, cluster)

    cluster.exit(NAMESPACE, name, 1)
    reconciler.reconcile_job(job_id=job.pk)
    assert (reload(job).status, reload(job).status_reason) == (S.QUEUED, "requeued_after_crash")

    second = job_claim_for_start(job_id=job.pk)
    launch.attempt_launch(attempt_id=second.pk)
    name = jobset_name(job.public_id, 2)
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)
    cluster.exit(NAMESPACE, name, 1)
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.error_code, job.crash_count) == (S.FAILED, "max_restarts_exceeded", 2)


def test_an_oom_killed_engine_fails_with_oom(owner, spec, launcher, cluster):
    job, attempt, name = running(owner, spec, cluster)

    cluster.oom(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.error_code) == (S.FAILED, "oom")
    assert JobAttempt.objects.get(pk=attempt.pk).exit_code == 137


def test_exit_2_fails_with_the_engines_error_never_retried(owner, spec, launcher, cluster):
    job, attempt, name = running(owner, spec, cluster)
    JobAttempt.objects.filter(pk=attempt.pk).update(outcome="failed", outcome_error={"code": "environment_error", "message": "no module"})

    cluster.exit(NAMESPACE, name, 2, delete_pods=True)  # the exit code read back from the Job's failure message
    reconciler.reconcile_job(job_id=job.pk)

    assert (reload(job).status, reload(job).error_code) == (S.FAILED, "environment_error")


def test_an_image_that_cannot_be_pulled_fails_the_job(owner, spec, launcher, cluster):
    job, attempt = submit(owner, spec)
    cluster.admit(NAMESPACE, attempt.handle["jobset"])
    cluster.image_pull_error(NAMESPACE, attempt.handle["jobset"], reason="ErrImagePull")
    reconciler.reconcile_job(job_id=job.pk)
    assert reload(job).status == S.STARTING  # the first pull error may pass

    cluster.image_pull_error(NAMESPACE, attempt.handle["jobset"])
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.error_code) == (S.FAILED, "image_pull_failed")
    assert "ImagePullBackOff" in job.error_message


def test_pods_unschedulable_for_ten_minutes_fail_the_job(owner, spec, launcher, cluster, clock):
    job, attempt = submit(owner, spec)
    cluster.admit(NAMESPACE, attempt.handle["jobset"])
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.unschedulable(NAMESPACE, attempt.handle["jobset"], since=since)
    reconciler.reconcile_job(job_id=job.pk)
    assert reload(job).status == S.STARTING
    assert launcher.observe(attempt.handle).reason == "unschedulable"

    clock.offset = timedelta(minutes=11)
    reconciler.reconcile_job(job_id=job.pk)

    assert (reload(job).status, reload(job).error_code) == (S.FAILED, "unschedulable")


def test_kueue_says_when_a_workload_is_inadmissible(owner, spec, launcher, cluster):
    job, attempt = submit(owner, spec)

    cluster.mark_inadmissible(NAMESPACE, attempt.handle["jobset"])
    reconciler.reconcile_job(job_id=job.pk)

    observation = launcher.observe(attempt.handle)
    assert (observation.reason, observation.detail) == ("kueue_inadmissible", "Inadmissible")
    assert (reload(job).status, reload(job).status_reason) == (S.STARTING, "kueue_inadmissible")


def test_a_jobset_deleted_by_hand_is_a_crash_and_resumes(owner, spec, launcher, cluster, clock):
    job, attempt, name = running(owner, spec, cluster)

    cluster.delete(cluster_kind("JobSet"), name, NAMESPACE)
    clock.offset = timedelta(minutes=3)  # past the grace for a JobSet not yet seen
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.status_reason, job.crash_count) == (S.QUEUED, "requeued_after_crash", 1)


def test_a_jobset_gone_after_the_engine_reported_finish_is_a_finished_attempt(owner, spec, launcher, cluster, clock):
    job, attempt, name = running(owner, spec, cluster)
    JobAttempt.objects.filter(pk=attempt.pk).update(outcome="succeeded")

    cluster.delete(cluster_kind("JobSet"), name, NAMESPACE)  # e.g. ttlSecondsAfterFinished during an outage
    clock.offset = timedelta(minutes=3)
    reconciler.reconcile_job(job_id=job.pk)

    assert reload(job).status == S.SUCCEEDED


def test_an_api_outage_leaves_jobs_as_they_are_and_launches_nothing_twice(owner, spec, launcher, cluster, no_broker):
    job, attempt, name = running(owner, spec, cluster)
    other = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    other_attempt = job_claim_for_start(job_id=other.pk)
    cluster.fail("apply", 503, times=1)
    cluster.fail("watch", 0, times=4)

    launch.attempt_launch(attempt_id=other_attempt.pk)  # the API does not answer: postponed
    reconciler.reconcile_all()  # nor while observing: nothing changes

    assert JobAttempt.objects.get(pk=other_attempt.pk).state == AttemptState.PENDING
    assert (reload(job).status, reload(other).status) == (S.RUNNING, S.STARTING)
    assert launcher.cache.errors["Workload"] is not None

    # The API answers again; the launch is retried, once the Secret create failed after the JobSet's.
    cluster.fail("apply", 500, times=0)
    original_apply = cluster.apply
    calls = []

    def apply_then_fail_on_the_secret(obj):
        calls.append(obj["kind"])
        if obj["kind"] == "Secret" and calls.count("Secret") == 1:
            raise cluster_unavailable()
        return original_apply(obj)

    cluster.apply = apply_then_fail_on_the_secret
    launch.attempt_launch(attempt_id=other_attempt.pk)
    launch.attempt_launch(attempt_id=other_attempt.pk)
    reconciler.reconcile_all()

    assert jobsets(cluster) == sorted([name, jobset_name(other.public_id, 1)])
    assert cluster.conflicts >= 1  # the second launch found the first one's JobSet
    assert JobAttempt.objects.get(pk=other_attempt.pk).state == AttemptState.LAUNCHED
    assert (reload(job).status, reload(other).status) == (S.RUNNING, S.STARTING)
    assert launcher.cache.synced


def cluster_unavailable():
    from jobs.launchers.kubernetes.gateway import ClusterUnavailable

    return ClusterUnavailable(503, "injected")


def test_a_watch_compacted_away_is_listed_again(owner, spec, launcher, cluster):
    job, attempt, name = running(owner, spec, cluster)
    lists = launcher.cache.lists
    cluster.exit(NAMESPACE, name, 0)
    for kind in ("Workload", "Job", "Pod", "JobSet"):
        cluster.compact(cluster_kind(kind))

    reconciler.reconcile_job(job_id=job.pk)

    assert launcher.cache.lists == lists + 4
    assert reload(job).status == S.SUCCEEDED


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_heartbeat_clock_starts_with_the_pods_not_the_launch(owner, spec, launcher, cluster, settings):
    settings.LAB_HEARTBEAT_TIMEOUT_S = 120
    job, attempt = submit(owner, spec)
    name = attempt.handle["jobset"]
    JobAttempt.objects.filter(pk=attempt.pk).update(launched_at=django_timezone.now() - timedelta(hours=3))  # hours in Kueue
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name, started_at=iso(datetime.now(timezone.utc) - timedelta(seconds=30)))

    reconciler.reconcile_job(job_id=job.pk)
    assert [delete for delete in cluster.deletes if delete[0] == "Pod"] == []  # still loading, not lost

    cluster.run(NAMESPACE, name, started_at=iso(datetime.now(timezone.utc) - timedelta(minutes=5)))
    reconciler.reconcile_job(job_id=job.pk)
    assert [delete for delete in cluster.deletes if delete[0] == "Pod"] == [("Pod", f"{name}-engine-0-pod", 0)]  # killed


def test_queue_positions_come_from_kueues_visibility_api_one_call_per_pass(owner, spec, gpu_spec, launcher, cluster):
    first, first_attempt = submit(owner, gpu_spec)
    high = {**spec, "priority": "high"}
    second, second_attempt = submit(owner, high)
    waiting = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)  # not launched by Lab yet
    calls = len([call for call in cluster.calls if call[0] == "pending_workloads"])

    reconciler.reconcile_all()

    assert len([call for call in cluster.calls if call[0] == "pending_workloads"]) == calls + 1
    assert [job_to_dict(reload(job))["queue_position"] for job in (second, first, waiting)] == [1, 2, 3]
    assert (reload(first).status, reload(first).status_reason) == (S.STARTING, "kueue_pending")

    cluster.admit(NAMESPACE, second_attempt.handle["jobset"])
    reconciler.reconcile_all()
    assert [job_to_dict(reload(job))["queue_position"] for job in (second, first, waiting)] == [None, 1, 2]

    cluster.visibility = False  # Kueue's VisibilityOnDemand off: Lab's own estimate
    reconciler.reconcile_all()
    assert [job_to_dict(reload(job))["queue_position"] for job in (first, waiting)] == [None, 1]


def test_a_job_that_started_after_kueues_places_were_read_has_no_place(owner, spec, launcher, cluster):
    job, attempt = submit(owner, spec)
    later, _ = submit(owner, spec)
    reconciler.reconcile_all()  # both wait in Kueue: the places are read and kept for a minute
    assert [job_to_dict(reload(each))["queue_position"] for each in (job, later)] == [1, 2]

    Job.objects.unscoped().filter(pk=job.pk).update(status=S.RUNNING)  # started since, the places not read again

    assert job_to_dict(reload(job))["queue_position"] is None
    assert job_to_dict(reload(later))["queue_position"] == 2  # Kueue's reading stands until the next pass


def test_a_parked_job_keeps_its_kueue_place(owner, spec, launcher, cluster):
    job, attempt, name = running(owner, spec, cluster)
    later, _ = submit(owner, spec)  # waits in Kueue behind it (created after it)
    cluster.evict(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)

    reconciler.reconcile_all()

    assert reload(job).status == S.QUEUED
    assert [job_to_dict(reload(each))["queue_position"] for each in (job, later)] == [1, 2]


def test_a_parked_job_cancelled_while_it_waits_has_its_jobset_swept(owner, spec, launcher, cluster, clock):
    job, attempt, name = running(owner, spec, cluster)
    cluster.evict(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)
    reconciler.reconcile_all()
    assert jobsets(cluster) == [name]  # parked: not an orphan

    job_cancel(job=reload(job), actor=Actor(user=owner.user))  # queued: cancelled at once
    clock.offset = timedelta(hours=1)  # the JobSet is older than ORPHAN_AFTER whatever the time of day
    reconciler.reconcile_all()

    assert (reload(job).status, jobsets(cluster)) == (S.CANCELLED, [])
    # A pod of it that started before the sweep is refused: the job's end expired its JobSet's token.
    late = open_attempt(cluster, job, name, pod={"metadata": {"uid": "uid-late"}}, token=bootstrap_token(attempt))
    assert (late.status_code, late.json()["error"]["code"]) == (401, "invalid_api_key")


def test_a_restarted_job_refuses_the_bootstrap_token_of_its_earlier_jobset(owner, spec, launcher, cluster):
    """A bootstrap token is its JobSet's: once the job ends it opens nothing, and after a restart
    it does not open the attempt launched in the new JobSet (whose pod, not the holder of the old
    Secret, gets the attempt's job token)."""
    job, _, name = running(owner, spec, cluster)
    old_token = secret_bootstrap_token(cluster, name)
    cluster.exit(NAMESPACE, name, 4)  # out of memory: failed, and worth restarting (an invalid spec is not)
    reconciler.reconcile_job(job_id=job.pk)
    assert reload(job).status == S.FAILED
    late = {"metadata": {"uid": "uid-late"}}
    assert open_attempt(cluster, job, name, pod=late, token=old_token).status_code == 401

    job_restart(job=reload(job), actor=Actor(user=owner.user))
    assert open_attempt(cluster, job, name, pod=late, token=old_token).status_code == 401  # queued again
    second = job_claim_for_start(job_id=job.pk)
    launch.attempt_launch(attempt_id=second.pk)
    new_name = JobAttempt.objects.get(pk=second.pk).handle["jobset"]
    cluster.admit(NAMESPACE, new_name)
    cluster.run(NAMESPACE, new_name)

    stolen = open_attempt(cluster, job, new_name, token=old_token)

    assert (stolen.status_code, stolen.json()["error"]["code"]) == (401, "invalid_api_key")
    assert "pod_uid" not in JobAttempt.objects.get(pk=second.pk).handle  # nothing opened
    assert secret_bootstrap_token(cluster, new_name) != old_token
    opened = open_attempt(cluster, job, new_name)
    assert opened.status_code == 200 and opened.json()["attempt"] == 2


def test_a_replaced_parked_jobsets_token_opens_nothing(owner, spec, launcher, cluster):
    """Kueue readmits a parked JobSet with the Secret it had, so its token keeps opening the job's
    next attempts; once Lab gives up on it and launches another JobSet, the old token is refused."""
    job, _, name = running(owner, spec, cluster)
    old_token = secret_bootstrap_token(cluster, name)
    cluster.evict(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)
    cluster.exit(NAMESPACE, name, 1)  # crashed before it asked Lab for its attempt
    reconciler.reconcile_all()
    assert admission_pass().started == [job.pk]
    second = JobAttempt.objects.get(job=job, number=2)
    launch.attempt_launch(attempt_id=second.pk)
    new_name = JobAttempt.objects.get(pk=second.pk).handle["jobset"]
    cluster.admit(NAMESPACE, new_name)
    cluster.run(NAMESPACE, new_name)

    for jobset in (name, new_name):
        refused = open_attempt(cluster, job, jobset, pod={"metadata": {"uid": "uid-stale"}}, token=old_token)
        assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_api_key")
    assert "pod_uid" not in JobAttempt.objects.get(pk=second.pk).handle
    assert open_attempt(cluster, job, new_name).json()["attempt"] == 2
