"""The SDK against Lab's real ASGI server (uvicorn on ``lab.asgi:application``), as deployed.

pytest-django's ``live_server`` is a WSGI thread; production and the live stream run on ASGI,
so the jobs API is also driven through a uvicorn subprocess on the test database.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from django.conf import settings
from labsdk import Lab

from jobs.models import Job
from tests.conftest import TINY_SPEC

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def asgi_url(django_db_setup, tmp_path_factory) -> str:
    """Start uvicorn on the test database and return its base URL; stop it after the module."""
    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the uvicorn subprocess needs a shared PostgreSQL test database")
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
        "LAB_DATA_DIR": str(tmp_path_factory.mktemp("asgi-data")),
    }
    log = (tmp_path_factory.mktemp("asgi-log") / "uvicorn.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"uvicorn did not start (exit {server.poll()})")
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def test_the_sdk_drives_jobs_through_uvicorn(asgi_url, tenant):
    with Lab(api_key=tenant.key, base_url=asgi_url, max_retries=0) as client:
        job = client.jobs.create(TINY_SPEC)
        listed = [found.id for found in client.jobs.list(metadata={"team": "research"})]
        cancelled = client.jobs.cancel(job.id)
        events = [event.type for event in client.jobs.events(job.id)]

    assert Job.objects.unscoped().get().public_id == job.id
    assert listed == [job.id]
    assert cancelled.status == "cancelled"
    assert events == ["job.queued", "job.cancelled"]


def _chunks(body: bytes, size: int = 65536):
    for start in range(0, len(body), size):
        yield body[start : start + size]


def test_a_chunked_spec_is_read_not_taken_for_an_empty_one(asgi_url, tenant):
    response = httpx.post(
        f"{asgi_url}/api/v1/jobs",
        content=_chunks(json.dumps(TINY_SPEC).encode()),
        headers={"Authorization": f"Bearer {tenant.key}", "Content-Type": "application/json"},
        timeout=30,
    )

    assert response.status_code in (201, 411), response.text


def test_a_chunked_body_over_one_megabyte_is_413(asgi_url, tenant):
    body = json.dumps({**TINY_SPEC, "name": "x" * 5_000_000}).encode()

    response = httpx.post(
        f"{asgi_url}/api/v1/jobs",
        content=_chunks(body),
        headers={"Authorization": f"Bearer {tenant.key}", "Content-Type": "application/json"},
        timeout=30,
    )

    assert response.status_code in (411, 413), response.text
    assert not Job.objects.unscoped().exists()


def test_odd_ids_and_cursors_are_404_over_uvicorn(asgi_url, tenant):
    headers = {"Authorization": f"Bearer {tenant.key}"}

    long_id = httpx.get(f"{asgi_url}/api/v1/jobs/{'a' * 5000}", headers=headers)
    long_cursor = httpx.get(f"{asgi_url}/api/v1/jobs", params={"after": "a" * 5000}, headers=headers)
    bad_utf8 = httpx.get(f"{asgi_url}/api/v1/jobs/%ff%fe", headers=headers)

    assert [long_id.status_code, long_cursor.status_code, bad_utf8.status_code] == [404, 404, 404]
    assert long_id.json()["error"]["code"] == "not_found"
