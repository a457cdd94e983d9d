"""``POST /api/v1/ingest/jobs/{id}/attempts`` refuses what it must (docs/ingest-api.md "Opening an
attempt"): only the job's own bootstrap token opens it, that token opens nothing else, and a bad
body is a 400 that changes nothing. The lifecycle through it is in test_lifecycle.py."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs.environment_packages import launch_packages
from jobs.ingest.tokens import bootstrap_token, job_token
from jobs.models import JobAttempt
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from tests.conftest import make_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


def client(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


@pytest.fixture
def launched(owner, spec, settings):
    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL_CONFIGURED = True
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(state="launched", handle={"namespace": "lab-acme", "jobset": "js-1"})
    return job, JobAttempt.objects.get(pk=attempt.pk)


BODY = {"pod_uid": "uid-1", "jobset": "js-1"}


def test_it_opens_the_attempt_with_the_jobs_bootstrap_token(launched):
    job, attempt = launched
    answer = client(bootstrap_token(attempt)).post(f"/api/v1/ingest/jobs/{job.public_id}/attempts", BODY, format="json")
    assert answer.status_code == 200
    assert answer.json() == {"attempt": 1, "token": job_token(attempt), "resume_from": None, "environment_packages": []}


def test_the_answer_names_the_jobs_uploaded_environments_with_download_urls_made_now(owner, spec, settings, tmp_path):
    """The URLs in the JobSet's Secret were made at launch; a pod Kueue admits or readmits later
    installs its environments from the ones in this answer."""
    from tests.support.environments import push
    from tests.support.wheelbuilder import build_wheel

    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL_CONFIGURED = True
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    assert push(owner, build_wheel("my-env", "0.1.0")).status_code == 201
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data={**spec, "env": [{"id": "acme/my-env"}]})
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(state="launched", handle={"namespace": "lab-acme", "jobset": "js-1"})
    answer = client(bootstrap_token(attempt)).post(f"/api/v1/ingest/jobs/{job.public_id}/attempts", BODY, format="json")
    assert answer.status_code == 200, answer.content
    (package,) = answer.json()["environment_packages"]
    assert package["id"] == "acme/my-env@0.1.0" and package["filename"] == "my_env-0.1.0-py3-none-any.whl"
    assert list(launch_packages(job)) == [package]  # what the launcher gives, made again for this answer


@pytest.mark.parametrize("which", ["job token", "other job's bootstrap token", "api key", "garbage"])
def test_it_refuses_any_other_credential_and_changes_nothing(launched, owner, which):
    job, attempt = launched
    outsider = make_tenant("outsider@evil.test", "Evil")
    foreign = job_submit(project=outsider.project, actor=Actor(user=outsider.user), data={**job.spec})
    foreign_attempt = job_claim_for_start(job_id=foreign.pk)
    token = {
        "job token": job_token(attempt),
        "other job's bootstrap token": bootstrap_token(foreign_attempt),
        "api key": owner.key,
        "garbage": "ljb_not-a-signature",
    }[which]
    answer = client(token).post(f"/api/v1/ingest/jobs/{job.public_id}/attempts", BODY, format="json")
    assert answer.status_code == 401
    assert JobAttempt.objects.get(pk=attempt.pk).handle == {"namespace": "lab-acme", "jobset": "js-1"}


def test_the_bootstrap_token_opens_no_other_ingest_endpoint(launched):
    job, attempt = launched
    answer = client(bootstrap_token(attempt)).post(
        f"/api/v1/ingest/jobs/{job.public_id}/status", {"attempt": 1, "phase": "running", "step": 1}, format="json")
    assert answer.status_code == 401


@pytest.mark.parametrize("body", [{}, {"pod_uid": "", "jobset": "js-1"}, {"pod_uid": 7, "jobset": "js-1"},
                                  {"pod_uid": "uid-1", "jobset": "js-1", "attempt": 3}, {"pod_uid": "u" * 65, "jobset": "js-1"}])
def test_a_bad_body_is_400_and_changes_nothing(launched, body):
    job, attempt = launched
    answer = client(bootstrap_token(attempt)).post(f"/api/v1/ingest/jobs/{job.public_id}/attempts", body, format="json")
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request")
    assert "pod_uid" not in JobAttempt.objects.get(pk=attempt.pk).handle


def test_a_pod_of_another_jobset_is_refused_for_good(launched):
    job, attempt = launched
    answer = client(bootstrap_token(attempt)).post(
        f"/api/v1/ingest/jobs/{job.public_id}/attempts", {"pod_uid": "uid-1", "jobset": "js-other"}, format="json")
    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "invalid_state")
    assert "pod_uid" not in JobAttempt.objects.get(pk=attempt.pk).handle


def test_a_readmitted_jobset_waits_for_its_organizations_cap(launched, owner, spec, settings):
    """Kueue readmitting a parked JobSet does not let the organization run more than its cap:
    the pod is told to ask again until one of the organization's jobs ends."""
    from jobs.models import Job, JobStatus, StatusReason

    job, attempt = launched
    JobAttempt.objects.filter(pk=attempt.pk).update(state="ended", handle={**attempt.handle, "parked": True})
    Job.objects.unscoped().filter(pk=job.pk).update(status=JobStatus.QUEUED, status_reason=StatusReason.REQUEUED_AFTER_PREEMPTION)
    other = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    Job.objects.unscoped().filter(pk=other.pk).update(status=JobStatus.RUNNING)
    settings.LAB_ORG_MAX_RUNNING_JOBS = 1
    url = f"/api/v1/ingest/jobs/{job.public_id}/attempts"

    waiting = client(bootstrap_token(attempt)).post(url, BODY, format="json")
    assert (waiting.status_code, waiting.json()["error"]["code"], waiting["Retry-After"]) == (409, "attempt_not_ready", "5")
    assert "its cap" in waiting.json()["error"]["message"]
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED and job.attempts.count() == 1  # nothing opened

    Job.objects.unscoped().filter(pk=other.pk).update(status=JobStatus.SUCCEEDED)
    opened = client(bootstrap_token(attempt)).post(url, BODY, format="json")
    assert opened.status_code == 200, opened.content
    assert opened.json()["attempt"] == 2
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.STARTING


def test_a_readmitted_jobset_waits_while_billing_refuses_its_organization(launched, settings, monkeypatch):
    from billing.accounts import account_for
    from billing.models import BillingAccount
    from jobs.models import Job, JobStatus, StatusReason

    job, attempt = launched
    JobAttempt.objects.filter(pk=attempt.pk).update(state="ended", handle={**attempt.handle, "parked": True})
    Job.objects.unscoped().filter(pk=job.pk).update(status=JobStatus.QUEUED, status_reason=StatusReason.REQUEUED_AFTER_PREEMPTION)
    settings.STRIPE_API_KEY = "sk_test_lab"  # billing on
    account = account_for(job.project.organization_id)
    BillingAccount.objects.filter(pk=account.pk).update(balance_micro_usd=0)
    url = f"/api/v1/ingest/jobs/{job.public_id}/attempts"

    waiting = client(bootstrap_token(attempt)).post(url, BODY, format="json")
    assert (waiting.status_code, waiting.json()["error"]["code"]) == (409, "attempt_not_ready")
    assert "insufficient_credit" in waiting.json()["error"]["message"]
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED

    BillingAccount.objects.filter(pk=account.pk).update(balance_micro_usd=100_000_000)  # a top-up
    assert client(bootstrap_token(attempt)).post(url, BODY, format="json").json()["attempt"] == 2
