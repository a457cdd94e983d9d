"""Environment versions pushed through the API and waited on to finish."""

from __future__ import annotations

import httpx
from django.core.files.uploadedfile import SimpleUploadedFile
from labsdk import Lab

from lab import storage
from tests.support.stack import LabStack, wait_for


def push(tenant, wheel, key=None):
    filename, data = wheel
    return tenant.client(key).post(
        "/api/v1/environments", {"file": SimpleUploadedFile(filename, data, content_type="application/zip")}, format="multipart"
    )


def stored_keys() -> list[str]:
    return sorted(key for key, _ in storage.iter_objects())


def wait_finished(lab: Lab, stack: LabStack, job_id: str):
    try:
        return wait_for(
            lambda: (job := lab.jobs.retrieve(job_id)).status in {"succeeded", "failed", "cancelled"} and job,
            timeout=180,
            what=f"{job_id} finished",
        )
    except AssertionError as error:
        raise AssertionError(f"{error}: {lab.jobs.retrieve(job_id).to_dict()}\n{stack.logs()}") from None


def build_ended(url: str, headers: dict, *, timeout: float = 300) -> dict:
    """Wait until the build of the environment version at ``url`` (its API URL) is ``ready`` or
    ``failed``; return the build object."""
    name = url.rsplit("/", 1)[-1]
    return wait_for(
        lambda: (body := httpx.get(url, headers=headers).json()["build"])["status"] in {"ready", "failed"} and body,
        timeout=timeout, what=f"{name}'s build ended",
    )
