"""Billing fixtures: billing on or off, a fake Stripe, a fake launcher for the reconciler, running jobs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from jobs.launchers import registry
from jobs.launchers.base import AttemptPhase, Observation
from jobs.models import Job, JobAttempt, JobStatus
from jobs.pipeline import launch
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from tests.support.fake_launcher import FakeLauncher
from tests.support.fake_stripe import FakeStripe

#: A fixed moment the launcher's times are measured from in these tests.
T0 = datetime(2026, 11, 3, 12, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def billing_on(settings, monkeypatch):
    """Billing on (a Stripe key set), interval 60 s, no grace; the meter-event task that closing
    an invoiced interval enqueues is not sent to a broker (tests call ``meter_events_send``)."""
    settings.STRIPE_API_KEY = "sk_test_lab"
    settings.LAB_USAGE_INTERVAL_S = 60
    monkeypatch.setattr("billing.ledger.enqueue_meter_events", lambda: None)
    return settings


#: The webhook signing secret of the fake Stripe's endpoint.
SECRET = "whsec_test_secret"


@pytest.fixture
def fake_stripe(billing_on, monkeypatch):
    """Billing on against a fake Stripe API on a local socket (``STRIPE_API_BASE``), with its
    webhook secret and metered price set."""
    with FakeStripe() as fake:
        billing_on.STRIPE_API_BASE = fake.base_url
        billing_on.STRIPE_WEBHOOK_SECRET = SECRET
        billing_on.STRIPE_METERED_PRICE_ID = "price_metered_gpu_seconds"
        monkeypatch.setattr("billing.ledger.enqueue_meter_events", lambda: None)
        yield fake


@pytest.fixture
def launcher(monkeypatch) -> FakeLauncher:
    fake = FakeLauncher()
    monkeypatch.setattr(registry, "get_launcher", lambda: fake)
    return fake


def start_job(tenant, spec, launcher: FakeLauncher) -> tuple[Job, JobAttempt]:
    """Submit ``spec`` for ``tenant``, claim and launch its first attempt, mark it running."""
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    launch.attempt_launch(attempt_id=attempt.pk)
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.RUNNING)
    return Job.objects.unscoped().get(pk=job.pk), JobAttempt.objects.get(pk=attempt.pk)


def observe(launcher: FakeLauncher, attempt: JobAttempt, *, started_at=T0, ended_at=None, exit_code=None) -> None:
    """Script what the launcher measures of ``attempt``: running since ``started_at``, or exited."""
    if ended_at is None:
        launcher.observations[attempt.handle["id"]] = Observation(AttemptPhase.RUNNING, started_at=started_at)
    else:
        launcher.observations[attempt.handle["id"]] = Observation(
            AttemptPhase.EXITED, exit_code=exit_code, started_at=started_at, ended_at=ended_at
        )


def at(seconds: float) -> datetime:
    """Return ``T0`` plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)
