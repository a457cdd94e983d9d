"""Kubernetes jobs submitted, opened and reloaded against the fake gateway."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from rest_framework.test import APIClient

from jobs.pipeline import launch
from jobs.models import Checkpoint, CheckpointStatus, Job, JobAttempt
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from tests.support.fake_gateway import FakeGateway

NAMESPACE = "lab-acme"


class Clock:
    """The launcher's clock: real time plus what a test moves it by."""

    def __init__(self):
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(timezone.utc) + self.offset


def submit(owner, spec) -> tuple[Job, JobAttempt]:
    """Submit, claim and launch a job's first attempt; return the job and the attempt."""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    launch.attempt_launch(attempt_id=attempt.pk)
    return reload(job), JobAttempt.objects.get(pk=attempt.pk)


def reload(job: Job) -> Job:
    return Job.objects.unscoped().get(pk=job.pk)


def secret_bootstrap_token(cluster: FakeGateway, name: str) -> str:
    """The bootstrap token the JobSet's pods get from its Secret (``LAB_JOB_BOOTSTRAP_TOKEN``)."""
    return cluster.objects[("Secret", NAMESPACE, name)]["stringData"]["LAB_JOB_BOOTSTRAP_TOKEN"]


def engine_pod(cluster: FakeGateway, name: str) -> dict:
    """The JobSet's engine pod (the trainer's, split) of its latest admission: the one that opens the attempt."""
    pods = [obj for (kind, _, _), obj in cluster.objects.items()
            if kind == "Pod" and obj["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
            and obj["metadata"]["labels"].get("lab.dev/role") in ("engine", "trainer")]
    return max(pods, key=lambda pod: pod["metadata"]["creationTimestamp"])


def open_attempt(cluster: FakeGateway, job: Job, name: str, *, pod: dict | None = None, token: str = ""):
    """What the engine does when its pod starts: POST /attempts with the Secret's bootstrap token."""
    pod = pod or engine_pod(cluster, name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token or secret_bootstrap_token(cluster, name)}")
    return client.post(f"/api/v1/ingest/jobs/{job.public_id}/attempts",
                       {"pod_uid": pod["metadata"]["uid"], "jobset": name}, format="json")


def ready_checkpoint(job: Job, *, step: int, attempt: int) -> Checkpoint:
    return Checkpoint.objects.create(job=job, step=step, attempt=attempt, status=CheckpointStatus.READY,
                                     format="peft-lora", storage_key=f"{job.public_id}/{step}.tar", size_bytes=1)
