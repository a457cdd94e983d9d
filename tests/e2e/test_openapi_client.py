"""A client generated from the live OpenAPI document works: openapi-python-client reads
``/api/v1/schema`` from the running server, writes a typed package into a temporary directory,
and that package creates and reads a job and a webhook endpoint, and reads an error body.

The generator's post hooks (ruff) are turned off, so nothing but the generator itself runs; it
must not warn about any part of the document (``--fail-on-warning``).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.models import Job
from tests.conftest import TINY_SPEC

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PACKAGE = "lab_api_client"
GENERATOR_CONFIG = {
    "package_name_override": PACKAGE,
    "post_hooks": [],
    # The checkpoint archive is a plain byte stream to a client.
    "content_type_overrides": {"application/x-tar": "application/octet-stream"},
}


@pytest.fixture
def generated_client(live_server, tmp_path: Path, monkeypatch):
    """Generate the client package from the live document and import it."""
    config = tmp_path / "generator.json"
    config.write_text(json.dumps(GENERATOR_CONFIG))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--url",
            f"{live_server.url}/api/v1/schema?format=json",
            "--meta",
            "none",
            "--config",
            str(config),
            "--output-path",
            str(tmp_path / PACKAGE),
            "--fail-on-warning",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(PACKAGE)
    for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_a_generated_client_creates_and_reads_a_job(generated_client, live_server, tenant):
    from lab_api_client.api.jobs import jobs_create, jobs_list, jobs_retrieve
    from lab_api_client.models import Error, JobCreate, JobList, JobStatus
    from lab_api_client.models import Job as JobModel

    client = generated_client.AuthenticatedClient(
        base_url=live_server.url, token=tenant.key, raise_on_unexpected_status=True
    )

    created = jobs_create.sync_detailed(client=client, body=JobCreate.from_dict(TINY_SPEC))

    assert created.status_code == 201, created.content
    job = created.parsed
    assert isinstance(job, JobModel)
    assert job.id.startswith("job_") and job.status == JobStatus.QUEUED
    assert Job.objects.unscoped().get(public_id=job.id).project == tenant.project
    read = jobs_retrieve.sync(job_id=job.id, client=client)
    assert isinstance(read, JobModel)
    assert (read.id, read.name, read.spec.model, read.spec.max_steps) == (
        job.id,
        "addition-tiny",
        "lab/tiny-random-llama",
        3,
    )
    assert read.spec.env[0].id == "lab/addition"
    assert read.metadata.to_dict() == {"team": "research"}
    assert read.created_at.tzinfo is not None
    listed = jobs_list.sync(client=client)
    assert isinstance(listed, JobList)
    assert [item.id for item in listed.data] == [job.id] and listed.has_more is False

    missing = jobs_retrieve.sync_detailed(job_id="job_missing", client=client)
    assert missing.status_code == 404
    assert isinstance(missing.parsed, Error)
    assert (missing.parsed.error.code, missing.parsed.error.type_.value) == ("not_found", "not_found_error")


def test_a_generated_client_creates_a_webhook_endpoint_and_sees_the_secret_once(generated_client, live_server, tenant):
    from lab_api_client.api.webhook_endpoints import webhook_endpoints_create, webhook_endpoints_retrieve
    from lab_api_client.models import WebhookEndpoint, WebhookEndpointCreate, WebhookEndpointWithSecret

    client = generated_client.AuthenticatedClient(base_url=live_server.url, token=tenant.key)

    created = webhook_endpoints_create.sync(
        client=client,
        body=WebhookEndpointCreate.from_dict({"url": "https://93.184.215.14/hooks", "events": ["job.failed"]}),
    )

    assert isinstance(created, WebhookEndpointWithSecret)
    assert created.secret.startswith("whsec_")
    assert [event.value for event in created.events] == ["job.failed"]
    shown = webhook_endpoints_retrieve.sync(endpoint_id=created.id, client=client)
    assert isinstance(shown, WebhookEndpoint)
    assert shown.id == created.id and "secret" not in shown.to_dict()
