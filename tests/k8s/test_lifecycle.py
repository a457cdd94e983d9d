"""``LAB_LAUNCHER=kubernetes`` through the real reconciler against the gateway fake: the same
lifecycles as the local launcher (succeed, cancel, preempt-and-resume, crash-and-fail, OOM),
the cluster's own failures (image pull, unschedulable, Kueue pending), a JobSet deleted by hand
or gone after its engine finished, and an API outage in which nothing is launched twice."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.utils import timezone as django_timezone

from jobs import reconciler
from jobs.launchers.base import AttemptPhase
from jobs.launchers.kubernetes.launcher import KubernetesLauncher
from jobs.launchers.kubernetes.objects import PoolSettings, jobset_name
from jobs.models import AttemptState, Job, JobAttempt, JobStatus
from jobs.services import job_cancel, job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from tests.k8s.fake_gateway import FakeGateway

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]

S = JobStatus
NAMESPACE = "lab-acme"


class Clock:
    """The launcher's clock: real time plus what a test moves it by."""

    def __init__(self):
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(timezone.utc) + self.offset


@pytest.fixture
def cluster() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def launcher(monkeypatch, settings, cluster, clock) -> KubernetesLauncher:
    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 2}, {"gpu_type": "cpu", "gpus": 0, "count": 4}]}
    launcher = KubernetesLauncher(gateway=cluster, settings=PoolSettings(engine_image="lab-engine-gpu:test"),
                                  background=False, clock=clock)
    monkeypatch.setattr(reconciler, "get_launcher", lambda: launcher)
    return launcher


@pytest.fixture
def gpu_spec(spec) -> dict:
    spec["resources"] = {"gpu_type": "H100", "gpus": 2}
    return spec


def submit(owner, spec) -> tuple[Job, JobAttempt]:
    """Submit, claim and launch a job's first attempt; return the job and the attempt."""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    reconciler.attempt_launch(attempt_id=attempt.pk)
    return reload(job), JobAttempt.objects.get(pk=attempt.pk)


def reload(job: Job) -> Job:
    return Job.objects.unscoped().get(pk=job.pk)


def running(owner, spec, cluster) -> tuple[Job, JobAttempt, str]:
    """A job whose attempt Kueue admitted and whose engine runs (and has sent a heartbeat)."""
    job, attempt = submit(owner, spec)
    name = attempt.handle["jobset"]
    cluster.admit(NAMESPACE, name)
    cluster.run(NAMESPACE, name)
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
    assert reload(job).status == S.STARTING  # waiting in Kueue
    assert launcher.observe(attempt.handle).reason == "kueue_pending"

    cluster.admit(NAMESPACE, name)
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


def test_a_kueue_eviction_requeues_after_preemption_and_the_next_attempt_is_a_new_jobset(owner, gpu_spec, launcher, cluster):
    job, attempt, name = running(owner, gpu_spec, cluster)

    cluster.evict(NAMESPACE, name)
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.status_reason, job.crash_count) == (S.QUEUED, "requeued_after_preemption", 0)
    assert jobsets(cluster) == []
    second = job_claim_for_start(job_id=job.pk)
    reconciler.attempt_launch(attempt_id=second.pk)
    assert jobsets(cluster) == [jobset_name(job.public_id, 2)]
    assert cluster.jobset(NAMESPACE, jobset_name(job.public_id, 2))["metadata"]["labels"]["lab.dev/attempt"] == "2"


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
    reconciler.attempt_launch(attempt_id=second.pk)
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

    assert launcher.observe(attempt.handle).reason == "kueue_inadmissible"


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

    reconciler.attempt_launch(attempt_id=other_attempt.pk)  # the API does not answer: postponed
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
    reconciler.attempt_launch(attempt_id=other_attempt.pk)
    reconciler.attempt_launch(attempt_id=other_attempt.pk)
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
