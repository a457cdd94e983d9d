"""Job tokens (``ljt_<attempt id>:<signature>``), scoped to one job's ingest API, and job bootstrap
tokens (``ljb_<attempt id>:<signature>``), which open a Kubernetes pod's attempt.

A job token is an HMAC signature (Django's signing, keyed by SECRET_KEY, with its own salt) over
the attempt's id and its random nonce, so Lab can hand the same token to a relaunch of the attempt
without storing it, and a token never works for another job. It is accepted until one hour after
the job ends, so a late flush of spooled data still lands. A bootstrap token is signed the same
way with a salt of its own (over the job's public id too) and is good while the JobSet it was
launched with may still run the job (``bootstrap_launch_for_token``).
"""

from __future__ import annotations

from datetime import timedelta

from django.core import signing
from django.utils import timezone

from jobs.models import AttemptState, JobAttempt, JobStatus, StatusReason

PREFIX = "ljt_"
_SALT = "lab.jobs.ingest.token"
#: How long after the job ends its tokens keep working.
GRACE_AFTER_END = timedelta(hours=1)


def job_token(attempt: JobAttempt) -> str:
    """Return the job token of ``attempt`` (deterministic for the attempt)."""
    signer = signing.Signer(salt=_SALT)
    return PREFIX + signer.sign(f"{attempt.pk}:{attempt.token_nonce}").replace(f":{attempt.token_nonce}", "", 1)


def attempt_for_token(token: str, *, job_public_id: str) -> JobAttempt | None:
    """Return the attempt a valid, unexpired token of job ``job_public_id`` belongs to, else None."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    body = token[len(PREFIX) :]
    attempt_id, _, signature = body.partition(":")
    if not attempt_id.isdigit() or not signature:
        return None
    attempt = (
        JobAttempt.objects.select_related("job", "job__project").filter(pk=int(attempt_id)).first()
    )
    if attempt is None or attempt.job.public_id != job_public_id:
        return None
    signer = signing.Signer(salt=_SALT)
    try:
        signer.unsign(f"{attempt.pk}:{attempt.token_nonce}:{signature}")
    except signing.BadSignature:
        return None
    finished = attempt.job.finished_at
    if finished is not None and timezone.now() > finished + GRACE_AFTER_END:
        return None
    return attempt


#: Job bootstrap tokens: ``ljb_<attempt id>:<signature>`` (docs/ingest-api.md "Opening an
#: attempt"). Good for ``POST /attempts`` of that job only, while the JobSet it was launched with
#: may still run the job (``bootstrap_launch_for_token``).
BOOTSTRAP_PREFIX = "ljb_"
_BOOTSTRAP_SALT = "lab.jobs.ingest.bootstrap"


def _bootstrap_value(job_public_id: str, attempt: JobAttempt) -> str:
    return f"{job_public_id}:{attempt.pk}:{attempt.token_nonce}"


def bootstrap_token(attempt: JobAttempt) -> str:
    """Return the bootstrap token of the launch of ``attempt`` (its job loaded): what the JobSet
    launched for it holds in its Secret, ``LAB_JOB_BOOTSTRAP_TOKEN``. An HMAC over the job's public
    id, the attempt's id and its random nonce, with a salt of its own, so it is deterministic for
    the launch and never works as a job token or for another job or launch."""
    value = _bootstrap_value(attempt.job.public_id, attempt)
    signature = signing.Signer(salt=_BOOTSTRAP_SALT).sign(value)[len(value) + 1 :]
    return f"{BOOTSTRAP_PREFIX}{attempt.pk}:{signature}"


def _still_runs_the_job(launch: JobAttempt) -> bool:
    """Whether the JobSet launched for ``launch`` (its job loaded) may still run its job: the job
    has not ended, and its current attempt is ``launch`` or one that Kueue readmitted the same
    JobSet for, and that attempt has not ended, unless it ended parked for Kueue to readmit it
    (``jobs.readmission``)."""
    job = launch.job
    if job.is_terminal:
        return False
    current = launch if launch.number == job.attempt else JobAttempt.objects.filter(job=job, number=job.attempt).first()
    if current is None:
        return False
    if current.pk != launch.pk and (not launch.handle.get("jobset") or current.handle.get("jobset") != launch.handle["jobset"]):
        return False
    if current.state != AttemptState.ENDED:
        return True
    return bool(
        current.handle.get("parked")
        and job.status == JobStatus.QUEUED
        and job.status_reason == StatusReason.REQUEUED_AFTER_PREEMPTION
    )


def bootstrap_launch_for_token(token: str, *, job_public_id: str) -> JobAttempt | None:
    """Return the attempt whose launch the bootstrap ``token`` of job ``job_public_id`` was made
    for (with its job), while the token is good; else None.

    A bootstrap token has no fixed lifetime: a JobSet Kueue holds after a preemption may wait for
    its place for days, and its pods then still need it. It expires with its JobSet's claim on
    the job instead: when the job ends, when a restart or a new launch gives the job another
    JobSet, or when Lab stops waiting for Kueue to readmit it (``_still_runs_the_job``).
    """
    if not token.startswith(BOOTSTRAP_PREFIX) or len(token) > 200:
        return None
    attempt_id, _, signature = token[len(BOOTSTRAP_PREFIX) :].partition(":")
    if not attempt_id.isdigit() or not signature:
        return None
    launch = JobAttempt.objects.select_related("job").filter(pk=int(attempt_id)).first()
    if launch is None or launch.job.public_id != job_public_id:
        return None
    try:
        signing.Signer(salt=_BOOTSTRAP_SALT).unsign(f"{_bootstrap_value(job_public_id, launch)}:{signature}")
    except signing.BadSignature:
        return None
    return launch if _still_runs_the_job(launch) else None


#: Job sandbox keys: ``lsk_<attempt id>:<signature>`` (docs/sandboxes.md "Sandboxes of a job"), what
#: an environment of the attempt calls Prime's sandbox API on Lab with (``PRIME_API_KEY``). Signed
#: as job tokens are, with a salt of its own, so it is deterministic for the attempt, never works
#: as a job token or an API key, and another attempt's key never opens this one's sandboxes.
SANDBOX_KEY_PREFIX = "lsk_"
_SANDBOX_KEY_SALT = "lab.jobs.sandbox-key"


def sandbox_key(attempt: JobAttempt) -> str:
    """Return the sandbox key of ``attempt`` (deterministic for the attempt)."""
    value = f"{attempt.pk}:{attempt.token_nonce}"
    signature = signing.Signer(salt=_SANDBOX_KEY_SALT).sign(value)[len(value) + 1 :]
    return f"{SANDBOX_KEY_PREFIX}{attempt.pk}:{signature}"


def attempt_for_sandbox_key(key: str) -> JobAttempt | None:
    """Return the attempt (its job and project loaded) whose sandbox key ``key`` is, else None.
    Whether the attempt may still make sandboxes is the caller's to check."""
    if not key.startswith(SANDBOX_KEY_PREFIX) or len(key) > 200:
        return None
    attempt_id, _, signature = key[len(SANDBOX_KEY_PREFIX) :].partition(":")
    if not attempt_id.isdigit() or not signature:
        return None
    attempt = JobAttempt.objects.select_related("job__project__organization").filter(pk=int(attempt_id)).first()
    if attempt is None:
        return None
    try:
        signing.Signer(salt=_SANDBOX_KEY_SALT).unsign(f"{attempt.pk}:{attempt.token_nonce}:{signature}")
    except signing.BadSignature:
        return None
    return attempt
