"""The demo's usage check reads the billing ledger's figure for the job and finds the job's usage equal to it."""

from __future__ import annotations

import pytest
from django.utils import timezone
from labsdk.client import Lab

from demo.program import check_usage
from jobs.models import Job
from jobs.pipeline import reconciler
from tests.billing.conftest import at, observe, start_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "default_prices")]


def test_the_demo_shows_the_ledgers_figure(owner, spec, launcher, monkeypatch, wsgi_transport):
    job, attempt = start_job(owner, spec, launcher)
    Job.objects.unscoped().filter(pk=job.pk).update(created_at=at(-10))
    observe(launcher, attempt, ended_at=at(95), exit_code=0)
    monkeypatch.setattr(timezone, "now", lambda: at(100))
    reconciler.reconcile_job(job_id=job.pk)
    monkeypatch.undo()
    lab = Lab(api_key=owner.key, base_url="http://127.0.0.1", transport=wsgi_transport)

    check, line = check_usage(lab, lab.jobs.retrieve(job.public_id))

    assert check.passed, check
    assert line == "95.0 CPU-seconds in the billing ledger at the local rate of $0.10 per hour: $0.002639 (the job shows $0.002639)"
