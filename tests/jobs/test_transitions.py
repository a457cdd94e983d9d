"""Job statuses change exactly as ALLOWED_TRANSITIONS says (docs/api.md "Statuses"), and a
refused change changes nothing."""

from __future__ import annotations

import pytest

from jobs.models import Job, JobEvent, JobStatus
from jobs.services import ALLOWED_TRANSITIONS, InvalidTransition, job_submit, job_transition
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

S = JobStatus


@pytest.mark.parametrize("before", list(S))
@pytest.mark.parametrize("to", list(S))
def test_a_transition_happens_exactly_when_the_table_allows_it(owner, spec, before, to):
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    Job.objects.unscoped().filter(pk=job.pk).update(status=before)
    events = JobEvent.objects.filter(job=job).count()
    job = Job.objects.unscoped().get(pk=job.pk)
    if to in ALLOWED_TRANSITIONS[before]:
        assert job_transition(job=job, to=to).status == to
        assert JobEvent.objects.filter(job=job).count() == events + 1
    else:
        with pytest.raises(InvalidTransition):
            job_transition(job=job, to=to)
        assert Job.objects.unscoped().get(pk=job.pk).status == before
        assert JobEvent.objects.filter(job=job).count() == events
