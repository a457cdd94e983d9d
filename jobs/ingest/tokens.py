"""Job tokens: ``ljt_<attempt id>.<signature>``, scoped to one job's ingest API.

A token is an HMAC signature (Django's signing, keyed by SECRET_KEY, with its own salt) over the
attempt's id and its random nonce, so Lab can hand the same token to a relaunch of the attempt
without storing it, and a token never works for another job. It is accepted until one hour after
the job ends, so a late flush of spooled data still lands.
"""

from __future__ import annotations

from datetime import timedelta

from django.core import signing
from django.utils import timezone

from jobs.models import JobAttempt

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


#: Job bootstrap tokens: ``ljb_<signature>`` over the job's public id (docs/ingest-api.md
#: "Opening an attempt"). Good for ``POST /attempts`` of that job only.
BOOTSTRAP_PREFIX = "ljb_"
_BOOTSTRAP_SALT = "lab.jobs.ingest.bootstrap"


def bootstrap_token(job_public_id: str) -> str:
    """Return the bootstrap token of job ``job_public_id``: what a Kubernetes engine pod holds in
    its JobSet's Secret (deterministic for the job, so a readmitted JobSet still holds a good
    one). It opens the job's next attempt and is accepted by nothing else."""
    signed = signing.Signer(salt=_BOOTSTRAP_SALT).sign(job_public_id)
    return BOOTSTRAP_PREFIX + signed[len(job_public_id) + 1 :]


def bootstrap_token_valid(token: str, *, job_public_id: str) -> bool:
    """Whether ``token`` is the bootstrap token of job ``job_public_id``."""
    if not token.startswith(BOOTSTRAP_PREFIX) or len(token) > 200:
        return False
    signature = token[len(BOOTSTRAP_PREFIX) :]
    try:
        signing.Signer(salt=_BOOTSTRAP_SALT).unsign(f"{job_public_id}:{signature}")
    except signing.BadSignature:
        return False
    return bool(signature)
