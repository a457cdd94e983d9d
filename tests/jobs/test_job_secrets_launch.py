"""Job secrets reach the engine process of their job, through the launch request and the local
launcher's environment (jobs/pipeline/launch.py, jobs/launchers/local.py), and nothing else of it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobs.launchers.local import LocalLauncher
from jobs.models import Job
from jobs.pipeline.launch import launch_request
from jobs.services import job_claim_for_start
from tests.support.local_launcher import REPO, engine_stand_in  # noqa: F401  (a fixture: an engine that prints its environment)

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-test-4f9c2e7a1b"


def test_the_launch_request_carries_them_and_the_engine_process_gets_them(owner, spec, no_broker, tmp_path, engine_stand_in):  # noqa: F811
    response = owner.client().post("/api/v1/jobs", {**spec, "secrets": {"OPENAI_API_KEY": SECRET}}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.unscoped().get()
    request = launch_request(job_claim_for_start(job_id=job.pk))
    assert request.secrets == {"OPENAI_API_KEY": SECRET}
    assert SECRET not in repr(request)

    launcher = LocalLauncher(runs_dir=tmp_path / "runs", repo_dir=REPO, python=str(engine_stand_in), isolation="none")
    workdir = Path(launcher.launch(request)["workdir"])
    deadline = time.monotonic() + 30
    while not (workdir / "exit.json").exists():
        assert time.monotonic() < deadline, (workdir / "stderr.log").read_text()
        time.sleep(0.05)
    seen = json.loads((workdir / "stdout.log").read_text())  # the stand-in prints its environment
    assert seen["OPENAI_API_KEY"] == SECRET
    assert SECRET not in (workdir / "spec.json").read_text()
