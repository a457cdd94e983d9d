"""Environment versions pushed through the API and waited on to finish."""

from __future__ import annotations

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
