"""``lab jobs restart`` of a job that would fail the same way again prints Lab's refusal, which
says to edit the spec and resubmit it, and exits 1 (a subprocess against a live Lab)."""

from __future__ import annotations

import pytest

from jobs.models import ErrorCode, Job, JobStatus
from tests.support.cli import lab_cli

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_jobs_restart_prints_why_the_job_is_not_restarted(live_server, tenant, tiny_toml):
    created = lab_cli("jobs", "create", "-f", str(tiny_toml), key=tenant.key, base_url=live_server.url)
    assert created.returncode == 0, created.stderr
    job_id = created.stdout.strip()
    Job.objects.unscoped().filter(public_id=job_id).update(
        status=JobStatus.FAILED, error_code=ErrorCode.INVALID_SPEC, error_message="takes no argument 'max_digit'",
    )

    result = lab_cli("jobs", "restart", job_id, key=tenant.key, base_url=live_server.url)

    assert result.returncode == 1 and result.stdout == ""
    assert f"{job_id} failed with invalid_spec before it trained" in result.stderr
    assert "edit the spec and submit it as a new job" in result.stderr and "(invalid_state)" in result.stderr
    assert "Traceback" not in result.stderr
    assert Job.objects.unscoped().get(public_id=job_id).status == JobStatus.FAILED
