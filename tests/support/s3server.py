"""A real S3-compatible server for storage tests: moto's server, as its own process on a free port.

``S3Server.start()`` runs ``python -m moto.server``; ``environment()`` gives the ``AWS_*`` and
``LAB_STORAGE_URL`` variables that point Lab (in-process settings or a LabStack's processes) at a
fresh bucket on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import httpx

from tests.support.stack import free_port, wait_for

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lab-test", "AWS_SECRET_ACCESS_KEY": "lab-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    """One moto server process; every ``new_bucket()`` gives an empty bucket."""

    def __init__(self, log_dir: Path):
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None

    def start(self) -> S3Server:
        """Start the server and wait until it answers."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / "moto.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **CREDENTIALS},
        )
        wait_for(self._answers, timeout=60, what="the moto S3 server")
        return self

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.endpoint_url}/moto-api/", timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    def client(self):
        """Return a boto3 S3 client on this server."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )

    def new_bucket(self) -> str:
        """Create an empty bucket and return its name."""
        name = f"lab-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        """Return every key in ``bucket``, sorted."""
        listed = self.client().list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def environment(self, bucket: str, prefix: str = "checkpoints") -> dict[str, str]:
        """Return the variables that make Lab store checkpoints in ``bucket`` under ``prefix``."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint_url, "LAB_STORAGE_URL": f"s3://{bucket}/{prefix}"}

    def stop(self) -> None:
        """End the server process."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process = None


def use_s3_storage(settings, monkeypatch, server: S3Server, bucket: str, prefix: str = "checkpoints") -> None:
    """Point this process's checkpoint storage at ``bucket`` on ``server`` (through lab.settings' parser)."""
    from lab.settings import _checkpoint_storage

    for name, value in server.environment(bucket, prefix).items():
        monkeypatch.setenv(name, value)
    settings.STORAGES = {**settings.STORAGES, "checkpoints": _checkpoint_storage(f"s3://{bucket}/{prefix}")}
