"""Environment builds: every pushed version is built (environments.builds, environments.builder)
against the local package index that ``make package-index`` fills, never a remote one.

The builds that install verifiers' closure take tens of seconds each, so only two run here
(``system``); the others fail before installing anything, or build a package with no dependency.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.cache import cache
from django.utils import timezone

from environments import builds

from environments.builder.build import BuildFailed, check_python, is_load_environment_module
from environments.builds import build_log, build_run, latest_build
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from environments.wheels import WheelInfo
from jobs.admission import admission_pass
from jobs.models import Job
from tests.environments.load_environment_wheels import tiny_single_turn_wheel
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

REPO = Path(__file__).resolve().parents[2]
PACKAGE_INDEX = REPO / "var" / "package-index"


@pytest.fixture
def index(settings, tmp_path) -> str:
    """The local package index as LAB_PACKAGE_INDEX_URL, and an empty storage for this test."""
    if not (PACKAGE_INDEX / ".filled").is_file():
        pytest.fail("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    settings.LAB_PACKAGE_INDEX_URL = (PACKAGE_INDEX / "simple").as_uri()
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    return settings.LAB_PACKAGE_INDEX_URL


def _pushed_build(owner, wheel) -> EnvironmentBuild:
    response = push(owner, wheel)
    assert response.status_code == 201, response.content
    assert response.json()["build"]["status"] == "queued"
    return latest_build(EnvironmentPackage.objects.unscoped().get(name=response.json()["name"]))


# --- builds that run the builder --------------------------------------------------------------


@pytest.mark.system
def test_a_load_environment_package_builds_ready_on_verifiers_0_3_1_with_its_summary(owner, index):
    build = _pushed_build(owner, tiny_single_turn_wheel())
    assert build.index_snapshot_at == build.package.created_at  # the index as it was at the push

    build = build_run(build.pk)

    assert build.status == BuildStatus.READY, build_log(build)
    assert build.error == ""
    locked = {entry["name"]: entry["version"] for entry in build.lock}
    assert locked["verifiers"] == "0.3.1"  # `verifiers>=0.1.0`, capped below 0.4 for a load_environment module
    assert "datasets" in locked
    assert all(len(entry["sha256"]) == 64 for entry in build.lock)
    assert build.summary["api"] == "v0"
    assert build.summary["environment_class"].endswith("SingleTurnEnv")
    assert build.summary["parameters"] == [
        {"name": "num_examples", "default": 10, "type": "int", "required": False},
        {"name": "system_prompt", "default": "Answer with a number.", "type": "str", "required": False},
    ]
    assert build.summary["dataset_size"] == 10
    assert build.summary["reward_functions"][:2] == [{"name": "correct", "weight": 1.0}, {"name": "short", "weight": 0.25}]
    assert build.summary["secrets"] == ["TINY_JUDGE_KEY"]
    assert build.summary["verifiers_version"] == "0.3.1"
    assert "ready in" in build_log(build)

    body = owner.client().get("/api/v1/environments/acme/tiny-count@0.1.0").json()["build"]
    assert (body["status"], body["api"], body["args"]) == ("ready", "v0", {"num_examples": 10, "system_prompt": "Answer with a number."})
    log = owner.client().get("/api/v1/environments/acme/tiny-count@0.1.0/build-log")
    assert log.status_code == 200 and log["Content-Type"].startswith("text/plain")
    assert b"resolving 2 requirements" in log.content


@pytest.mark.system
def test_a_library_with_verifiers_as_a_dependency_is_refused_at_build(owner, index):
    library = build_wheel("helper-lib", "1.0", files={"helper_lib/__init__.py": "def helper():\n    return 1\n"}, requires=["verifiers>=0.1.0"])
    build = build_run(_pushed_build(owner, library).pk)
    assert build.status == BuildStatus.FAILED
    assert "is neither a Lab environment" in build.error and "is this a library?" in build.error


def test_a_lab_protocol_package_builds_ready(owner, index, tmp_path):
    source = shutil.copytree(REPO / "examples" / "environments" / "vowel-count", tmp_path / "vowel-count")  # pip leaves build/ behind
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path), str(source)],
        check=True, cwd=tmp_path, capture_output=True,
    )
    [wheel] = tmp_path.glob("vowel_count-*.whl")
    build = build_run(_pushed_build(owner, (wheel.name, wheel.read_bytes())).pk)
    assert build.status == BuildStatus.READY, build_log(build)
    assert build.lock == []
    assert build.summary["api"] == "lab"
    assert build.summary["environment_class"] == "vowel_count.VowelCount"
    assert build.summary["reward_functions"]


def test_an_unsatisfiable_requirement_fails_with_the_resolvers_own_message(owner, index):
    wheel = tiny_single_turn_wheel("needy-count", requires=["verifiers>=0.1.0", "frobnicator-9000>=1.0"])
    build = build_run(_pushed_build(owner, wheel).pk)
    assert build.status == BuildStatus.FAILED
    assert build.error.startswith(f"its requirements cannot be met from {index} as of ")
    assert "frobnicator-9000" in build.error and "requirements are unsatisfiable" in build.error
    assert build.lock == [] and build.summary == {}
    assert "frobnicator-9000" in build_log(build)


def test_a_build_runs_once_however_often_its_task_is_delivered(owner, index):
    build = _pushed_build(owner, tiny_single_turn_wheel("needy-count", requires=["verifiers>=0.1.0", "frobnicator-9000"]))
    assert build_run(build.pk).status == BuildStatus.FAILED
    assert build_run(build.pk) is None


# --- the API and submit, on builds whose outcome is set here -----------------------------------


def _finish(build: EnvironmentBuild, status: str, error: str = "") -> None:
    build.status, build.error, build.finished_at = status, error, timezone.now()
    build.save()


def test_a_job_naming_a_version_whose_build_failed_is_refused_at_submit_with_the_builds_error(owner, index, spec):
    build = _pushed_build(owner, tiny_single_turn_wheel())
    spec["env"] = [{"id": "acme/tiny-count"}]
    _finish(build, BuildStatus.FAILED, "it needs Python >=3.12 (its Requires-Python)")
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "env.0.id"
    assert "acme/tiny-count@0.1.0' did not build (build 1): it needs Python >=3.12" in error["message"]

    rebuilt = owner.client().post("/api/v1/environments/acme/tiny-count/builds")
    assert rebuilt.status_code == 201, rebuilt.content
    assert (rebuilt.json()["number"], rebuilt.json()["status"]) == (2, "queued")
    assert latest_build(build.package).index_snapshot_at > build.index_snapshot_at  # the index as it is now
    again = owner.client().post("/api/v1/environments/acme/tiny-count/builds")
    assert again.status_code == 409 and "still queued" in again.json()["error"]["message"]
    _finish(latest_build(build.package), BuildStatus.READY)
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201


def test_a_job_on_a_version_still_building_waits_environment_building_and_starts_once_it_is_ready(owner, index, spec, settings):
    settings.LAB_LOCAL_SLOTS = 2
    build = _pushed_build(owner, tiny_single_turn_wheel())
    waiting = owner.client().post("/api/v1/jobs", {**spec, "env": [{"id": "acme/tiny-count"}]}, format="json")
    assert waiting.status_code == 201, waiting.content  # accepted at submit: its build has not ended
    other = owner.client().post("/api/v1/jobs", spec, format="json").json()["id"]
    job = Job.objects.unscoped().get(public_id=waiting.json()["id"])

    other_pk = Job.objects.unscoped().get(public_id=other).pk
    for status, started in ((BuildStatus.QUEUED, [other_pk]), (BuildStatus.RUNNING, [])):  # the other job is not held
        EnvironmentBuild.objects.unscoped().filter(pk=build.pk).update(status=status)
        assert admission_pass().started == started
        body = owner.client().get(f"/api/v1/jobs/{job.public_id}").json()
        assert (body["status"], body["status_reason"]) == ("queued", "environment_building")

    build.refresh_from_db()
    _finish(build, BuildStatus.READY)
    assert admission_pass().started == [job.pk]


def test_a_job_waiting_on_a_build_that_fails_fails_with_the_builds_error(owner, index, spec):
    build = _pushed_build(owner, tiny_single_turn_wheel())
    submitted = owner.client().post("/api/v1/jobs", {**spec, "env": [{"id": "acme/tiny-count"}]}, format="json").json()["id"]
    admission_pass()
    _finish(build, BuildStatus.FAILED, "importing it needs the module 'frobnicator_9000', which none of its requirements installs")

    assert admission_pass().started == []

    job = owner.client().get(f"/api/v1/jobs/{submitted}").json()
    assert job["status"] == "failed" and job["error"]["code"] == "environment_error"
    assert job["error"]["message"].startswith(
        "environment 'acme/tiny-count@0.1.0' did not build (build 1): importing it needs the module 'frobnicator_9000'"
    )


def test_another_organizations_builds_are_not_found(owner, outsider, index):
    _pushed_build(owner, tiny_single_turn_wheel())
    client = outsider.client()
    for method, path in (
        ("get", "/api/v1/environments/acme/tiny-count@0.1.0"),
        ("get", "/api/v1/environments/acme/tiny-count@0.1.0/build-log"),
        ("post", "/api/v1/environments/acme/tiny-count@0.1.0/builds"),
    ):
        response = getattr(client, method)(path)
        assert response.status_code == 404, (path, response.content)
    assert EnvironmentBuild.objects.unscoped().count() == 1


# --- builds a lost worker left, and the builder's time limit ----------------------------------


def test_the_sweep_fails_a_build_left_running_past_the_limit_and_sends_a_long_queued_one_again(owner, index, settings, monkeypatch):
    settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S = 600
    sent = []
    monkeypatch.setattr(builds, "send", lambda name, *args: sent.append((name, *args)))
    cache.clear()
    now = timezone.now()
    lost = _pushed_build(owner, tiny_single_turn_wheel("lost-count"))
    EnvironmentBuild.objects.unscoped().filter(pk=lost.pk).update(
        status=BuildStatus.RUNNING, started_at=now - timedelta(seconds=600 + builds.TASK_GRACE_S + 5)
    )
    slow = _pushed_build(owner, tiny_single_turn_wheel("slow-count"))  # past the limit, within the task's grace
    EnvironmentBuild.objects.unscoped().filter(pk=slow.pk).update(status=BuildStatus.RUNNING, started_at=now - timedelta(seconds=700))
    waiting = _pushed_build(owner, tiny_single_turn_wheel("waiting-count"))
    EnvironmentBuild.objects.unscoped().filter(pk=waiting.pk).update(created_at=now - timedelta(seconds=builds.REQUEUE_AFTER_S + 5))
    fresh = _pushed_build(owner, tiny_single_turn_wheel("fresh-count"))

    assert builds.build_sweep() == {"failed": 1, "resent": 1}

    lost.refresh_from_db()
    assert lost.status == BuildStatus.FAILED and lost.finished_at is not None
    assert lost.error.startswith("the build did not finish within 600 s (LAB_ENVIRONMENT_BUILD_TIMEOUT_S)")
    assert "lab envs rebuild ID" in lost.error
    body = owner.client().get("/api/v1/environments/acme/lost-count@0.1.0").json()["build"]
    assert (body["status"], body["error"]) == ("failed", lost.error)
    assert owner.client().post("/api/v1/environments/acme/lost-count/builds").status_code == 201  # no longer blocked by it
    slow.refresh_from_db()
    fresh.refresh_from_db()
    assert (slow.status, fresh.status) == (BuildStatus.RUNNING, BuildStatus.QUEUED)
    assert sent == [(builds.TaskName.BUILD_ENVIRONMENT, waiting.pk)]
    assert builds.build_sweep() == {"failed": 0, "resent": 0}  # sent once per REQUEUE_AFTER_S, not every pass


def test_a_build_past_its_time_limit_fails_and_its_builder_and_what_it_started_are_killed(owner, index, settings, monkeypatch, tmp_path):
    settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S = 2
    pid_file = tmp_path / "grandchild.pid"
    hang = f"import os, subprocess; p = subprocess.Popen(['sleep', '120']); open({str(pid_file)!r}, 'w').write(str(p.pid)); p.wait()"
    monkeypatch.setattr(builds, "builder_command", lambda **kwargs: [sys.executable, "-c", hang])
    build = _pushed_build(owner, tiny_single_turn_wheel())

    started = time.monotonic()
    build = build_run(build.pk)

    assert time.monotonic() - started < 30
    assert build.status == BuildStatus.FAILED
    assert build.error == "the build took longer than 2 s (LAB_ENVIRONMENT_BUILD_TIMEOUT_S)"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")  # a zombie is dead


# --- the builder's own checks -------------------------------------------------------------------


def test_the_verifiers_cap_applies_to_load_environment_modules_only():
    assert is_load_environment_module("import verifiers as vf\n\ndef load_environment(**kwargs):\n    return None\n")
    assert is_load_environment_module("from .env import load_environment\n")
    assert not is_load_environment_module("import verifiers as vf\n\nclass T(vf.Taskset):\n    pass\n\ndef load_environment():\n    pass\n")
    assert not is_load_environment_module("__all__ = ['MyTaskset']\n")


def test_a_python_requirement_the_engine_cannot_meet_names_the_fix():
    info = WheelInfo(filename="x-1.0-py3-none-any.whl", name="x", version="1.0", kind="verifiers", module="x", entry_point="x", requires_python=">=3.12")
    with pytest.raises(BuildFailed, match=r"it needs Python >=3.12 \(its Requires-Python\), and Lab's engine runs Python 3.11.7: publish"):
        check_python(info, "3.11.7")
    check_python(info, "3.12.1")
