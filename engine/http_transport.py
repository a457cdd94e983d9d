"""The HTTP transport of the reporter (engine/reporter.py): the ingest API over labsdk's HTTP
client, through the egress relay in a sandbox (engine/egress.py), and the attempt opening of a pod
on the Kubernetes pool (docs/ingest-api.md "Opening an attempt")."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from labsdk._http import ARCHIVE_CORRUPTED, HTTPClient
from labsdk.errors import LabError
from labsdk.retry import is_retryable_status

from engine import egress
from engine.reporter import IngestError, copy_atomically, require_archive


class HttpTransport:
    """The ingest API over HTTP with the job token, through labsdk's HTTP layer.

    Retries are the reporter's job (it spools), so the client makes one attempt per call.
    """

    def __init__(self, lab_url: str, job_id: str, token: str, *, timeout: float = 15.0):
        self.transport = egress.transport()
        self.client = HTTPClient(
            base_url=f"{lab_url.rstrip('/')}/api/v1/ingest/jobs/{job_id}",
            token=token,
            timeout=timeout,
            max_retries=0,
            user_agent="lab-engine",
            transport=self.transport,
        )
        self.timeout = timeout

    def post(self, path: str, body: dict, *, idempotency_key: str | None = None) -> dict:
        try:
            return self.client.request("POST", path, json_body=body, idempotency_key=idempotency_key) or {}
        except LabError as error:
            status = error.status_code
            raise IngestError(
                f"POST {path}: {error}", retryable=is_retryable_status(status), status_code=status
            ) from error

    def upload(self, upload: dict, archive: pathlib.Path) -> None:
        require_archive(archive)
        method = upload.get("method")
        try:
            if method == "local":
                copy_atomically(archive, pathlib.Path(upload["path"]))
            elif method == "put":
                with open(archive, "rb") as handle, httpx.Client(
                    timeout=max(self.timeout, 300.0), follow_redirects=False, transport=self.transport
                ) as storage:
                    response = storage.put(
                        upload["url"],
                        content=handle,
                        headers={"Content-Length": str(archive.stat().st_size), **(upload.get("headers") or {})},
                    )
                if response.status_code >= 400:
                    raise IngestError(
                        f"checkpoint upload answered {response.status_code}",
                        retryable=is_retryable_status(response.status_code),
                        status_code=response.status_code,
                    )
            else:
                raise IngestError(f"unknown upload method {method!r}", retryable=False)
        except (OSError, httpx.HTTPError) as error:
            raise IngestError(f"checkpoint upload failed: {error}", retryable=True) from error

    def download_checkpoint(self, checkpoint_id: str, destination: pathlib.Path) -> pathlib.Path:
        """GET `checkpoints/{id}/download` with the job token: the tar itself (filesystem
        storage) or, after a redirect, from the signed storage URL without the token. Bytes that
        differ from the SHA-256 Lab recorded for it are an IngestError no retry helps."""
        try:
            return self.client.download(f"checkpoints/{checkpoint_id}/download", destination)
        except LabError as error:
            status = error.status_code
            retryable = is_retryable_status(status) and error.code != ARCHIVE_CORRUPTED
            raise IngestError(f"checkpoint {checkpoint_id}: {error}", retryable=retryable, status_code=status) from error

    def download_adapter(self, adapter_id: str, destination: pathlib.Path) -> pathlib.Path:
        """GET `adapters/{id}/download` with the job token (an evaluation job's `[eval] adapter`),
        as `download_checkpoint` does."""
        try:
            return self.client.download(f"adapters/{adapter_id}/download", destination)
        except LabError as error:
            status = error.status_code
            retryable = is_retryable_status(status) and error.code != ARCHIVE_CORRUPTED
            raise IngestError(f"adapter {adapter_id}: {error}", retryable=retryable, status_code=status) from error

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class AttemptGrant:
    """The attempt Lab opened for this pod: its number, its job token, the checkpoint to resume
    from, the environment packages to install (None when Lab's answer names none) and the stored
    model to fetch (`LAB_JOB_MODEL`'s object, engine.model_store; None for a model Lab does not store)."""

    attempt: int
    token: str
    resume_from: str | None
    environment_packages: list | None = None
    model: dict | None = None


class AttemptRefused(Exception):
    """Lab will run no attempt in this pod (the job has ended, or this JobSet does not run it)."""


def open_attempt(
    lab_url: str,
    job_id: str,
    bootstrap_token: str,
    *,
    pod_uid: str,
    jobset: str,
    wait_s: float = 300.0,
    sleep: Callable[[float], None] = time.sleep,
    transport: HttpTransport | None = None,
) -> AttemptGrant:
    """Open the attempt this pod runs (`POST /api/v1/ingest/jobs/{job_id}/attempts` with the job's
    bootstrap token, `LAB_JOB_BOOTSTRAP_TOKEN`; docs/ingest-api.md "Opening an attempt").

    Asks again, with capped exponential backoff (or the answer's `Retry-After`), while Lab is
    unreachable, answers 429/5xx, or says `attempt_not_ready` (it has not yet seen the cluster
    catch up), for up to `wait_s` seconds, then raises the last IngestError. Raises
    AttemptRefused when Lab says no for good (`invalid_state`, 404, a bad token).
    """
    transport = transport or HttpTransport(lab_url, job_id, bootstrap_token)
    deadline = time.monotonic() + wait_s
    delay = 1.0
    while True:
        try:
            answer = transport.client.request("POST", "attempts", json_body={"pod_uid": pod_uid, "jobset": jobset})
            packages, model = answer.get("environment_packages"), answer.get("model")
            return AttemptGrant(
                attempt=int(answer["attempt"]), token=str(answer["token"]), resume_from=answer.get("resume_from"),
                environment_packages=packages if isinstance(packages, list) else None,
                model=model if isinstance(model, dict) else None,
            )
        except LabError as error:
            retry = error.code == "attempt_not_ready" or error.status_code is None or is_retryable_status(error.status_code)
            if not retry:
                raise AttemptRefused(f"Lab opens no attempt for this pod: {error}") from error
            last = IngestError(f"POST attempts: {error}", retryable=True, status_code=error.status_code)
            asked = _retry_after(getattr(error, "headers", None) or {})
            wait = delay if asked is None else asked
        if time.monotonic() + wait > deadline:
            raise last
        sleep(wait)
        delay = min(delay * 2, 30.0)


def _retry_after(headers: dict) -> float | None:
    for key, value in headers.items():
        if key.lower() == "retry-after":
            try:
                return max(0.0, min(float(value), 60.0))
            except ValueError:
                return None
    return None
