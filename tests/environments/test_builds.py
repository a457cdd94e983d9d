"""Environment builds: every pushed version is built (environments.builds, environments.builder)
against the local package index that ``make package-index`` fills, never a remote one.

The builds that install verifiers' closure take tens of seconds each, so few run here (two
``load_environment`` packages' on verifiers 0.3.1, a multi-turn v1 taskset's two); the others fail
before installing anything, or build a package with no dependency. The module is ``system``
(tests/conftest.py).
"""

from __future__ import annotations

import hashlib
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
from lab_environments import __version__ as PROTOCOL_VERSION

from environments import builds
from environments.builder.build import (
    check_python,
    is_load_environment_module,
    resolve,
)
from environments.builder.sources import build_source_distributions
from environments.builder.steps import BuildFailed, BuildRequest
from environments.builds import build_log, build_run, latest_build
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from environments.wheels import WheelInfo
from jobs.admission import admission_pass
from jobs.models import Job
from tests.environments.verifiers_wheels import REFEREE_LEFT_ENV, guess_wheel, spell_wheel
from tests.support.environments import push
from tests.support.load_environment_wheels import TINY_SINGLE_TURN, tiny_single_turn_wheel
from tests.support.wheelbuilder import ADDITION_LIKE, build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

REPO = Path(__file__).resolve().parents[2]
PACKAGE_INDEX = REPO / "var" / "package-index"
UV = str(Path(sys.executable).parent / "uv")


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
    # verifiers' own rollout of two rows against the stub model, whose "42" is never the next number: `short` alone scores
    assert build.summary["rollout"]["examples"] == 2
    assert build.summary["rollout"]["rewards"] == [0.25, 0.25]
    assert build.summary["rollout"]["reply"] == "42"
    assert 0 < build.summary["rollout"]["seconds"] < 60
    assert "smoke rollout of 2 examples" in build_log(build)
    assert "ready in" in build_log(build)

    body = owner.client().get("/api/v1/environments/acme/tiny-count@0.1.0").json()["build"]
    assert (body["status"], body["api"], body["args"]) == ("ready", "v0", {"num_examples": 10, "system_prompt": "Answer with a number."})
    log = owner.client().get("/api/v1/environments/acme/tiny-count@0.1.0/build-log")
    assert log.status_code == 200 and log["Content-Type"].startswith("text/plain")
    assert b"resolving 2 requirements" in log.content


@pytest.mark.system
def test_a_load_environment_package_whose_reward_function_raises_on_a_reply_fails_its_build_where_verifiers_scores_0(owner, index):
    # verifiers logs a reward function that raised and scores it 0; the build's smoke rollout fails on it
    short = "    return 1.0 if len(text) <= 4 else 0.0\n"
    assert short in TINY_SINGLE_TURN
    source = TINY_SINGLE_TURN.replace(short, "    return 1.0 / (len(text) - 2)  # the stub's reply has two characters\n")
    wheel = build_wheel("tiny-picky", "0.1.0", files={"tiny_picky/__init__.py": source}, requires=["verifiers>=0.1.0", "datasets"])

    build = build_run(_pushed_build(owner, wheel).pk)

    assert build.status == BuildStatus.FAILED, build_log(build)
    assert build.error.startswith("the environment's rollout raised ZeroDivisionError: float division by zero (it loads")
    assert "`lab envs try PACKAGE --reply 42`" in build.error
    log = build_log(build)
    assert "Traceback (most recent call last)" in log and "in short" in log


@pytest.mark.system
def test_a_multi_turn_v1_tasksets_build_plays_whole_episodes_and_one_whose_second_turn_raises_fails(owner, index):
    build = build_run(_pushed_build(owner, guess_wheel()).pk)
    assert build.status == BuildStatus.READY, build_log(build)
    assert (build.summary["api"], build.summary["multi_turn"]) == ("v1", True)
    # "42" is over every secret (at most 20): numeric alone scores, 1 x 0.25, over 4 turns of "Lower."
    assert (build.summary["rollout"]["examples"], build.summary["rollout"]["rewards"]) == (2, [0.25, 0.25])

    # Its turn 2 raises: the episode fails in the build, as it would in the job's first rollout.
    build = build_run(_pushed_build(owner, guess_wheel("referee-left", source=REFEREE_LEFT_ENV)).pk)
    assert build.status == BuildStatus.FAILED, build_log(build)
    assert build.error.startswith(
        "the environment's rollout raised EnvError: GuessEnv.run(): RuntimeError: the referee left (it loads, but a smoke rollout"
    ), build.error
    assert "episode e1 failed: EnvError: GuessEnv.run(): RuntimeError: the referee left" in build_log(build)


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
    # the stub model's "42" is no word's vowel count, and 38 or more off: neither function scores
    assert (build.summary["rollout"]["examples"], build.summary["rollout"]["rewards"]) == (2, [0.0, 0.0])
    assert "smoke rollout of 2 examples" in build_log(build)


def test_a_package_that_loads_but_whose_reward_function_raises_on_a_reply_fails_its_build_naming_the_exception(owner, index):
    exact = "    return 1.0 if completion.strip() == example.answer else 0.0\n"
    source = ADDITION_LIKE.format(id="acme/picky-env@0.1.0", name="picky-env")
    assert exact in source
    source = source.replace(exact, "    return {\"7\": 1.0}[completion.strip()]  # any other reply raises\n")
    wheel = build_wheel("picky-env", files={"picky_env/__init__.py": source}, requires=[], entry_points="[lab.environments]\npicky-env = picky_env:Echo\n")

    build = build_run(_pushed_build(owner, wheel).pk)

    assert build.status == BuildStatus.FAILED, build_log(build)
    assert build.error.startswith("the environment's rollout raised KeyError: '42' (it loads, but a smoke rollout of 2 train examples")
    assert "try it locally with `lab envs try PACKAGE --reply 42`" in build.error
    assert build.summary == {}
    log = build_log(build)
    assert "Traceback (most recent call last)" in log and "in _exact" in log and "KeyError: '42'" in log


def test_a_lab_package_whose_dependency_the_engine_lacks_fails_its_build_as_its_job_would(owner, index):
    source = ADDITION_LIKE.format(id="acme/echo-env@0.1.0", name="echo-env")
    wheel = build_wheel("echo-env", files={"echo_env/__init__.py": "import math_verify\n" + source}, requires=["math-verify"],
                        entry_points="[lab.environments]\necho-env = echo_env:Echo\n")
    build = build_run(_pushed_build(owner, wheel).pk)
    assert build.status == BuildStatus.FAILED, build_log(build)
    assert build.error.startswith("it depends on the distributions ") and "'math-verify'" in build.error
    assert "not installed in the engine's environment: a job installs the package with --no-deps" in build.error


def test_a_v1_taskset_requiring_what_the_verifiers_environment_lacks_fails_its_build(owner, index):
    build = build_run(_pushed_build(owner, spell_wheel(prelude="import tabulate\n", requires=("verifiers>=0.4.0", "tabulate"))).pk)
    assert build.status == BuildStatus.FAILED, build_log(build)
    assert build.error.startswith("it depends on the distribution 'tabulate', which is not installed in the engine's environment")


def test_a_lab_package_needing_another_protocol_version_fails_naming_the_one_the_engine_provides(owner, index):
    source = ADDITION_LIKE.format(id="acme/echo-env@0.1.0", name="echo-env")
    wheel = build_wheel("echo-env", files={"echo_env/__init__.py": source}, requires=["lab-environments>=9"],
                        entry_points="[lab.environments]\necho-env = echo_env:Echo\n")
    build = build_run(_pushed_build(owner, wheel).pk)
    assert build.status == BuildStatus.FAILED
    assert build.error == (
        f"it needs lab-environments>=9, and Lab's engine provides lab-environments {PROTOCOL_VERSION}: "
        f"require a version range that admits {PROTOCOL_VERSION}"
    )
    assert build.lock == [] and build.summary == {}


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
    assert error["message"].endswith(
        "(push a fixed version, or rebuild it: lab envs rebuild acme/tiny-count@0.1.0, or POST /api/v1/environments/<id>/builds)"
    )

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


def test_the_builder_reaches_the_index_as_the_worker_does_and_gets_nothing_else_of_its_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/company/ca.pem")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("no_proxy", "localhost")
    monkeypatch.setenv("LAB_SECRET_THING", "x")
    monkeypatch.setenv("UV_INDEX_URL", "https://elsewhere.example/simple")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)

    environment = builds.builder_environment(str(tmp_path))

    assert environment["HOME"] == str(tmp_path)
    assert environment["SSL_CERT_FILE"] == "/etc/company/ca.pem"
    assert environment["HTTPS_PROXY"] == "http://proxy.internal:3128"
    assert environment["no_proxy"] == "localhost"
    assert "SSL_CERT_DIR" not in environment
    assert set(environment) <= {"PATH", "HOME", "LANG", "PYTHONUNBUFFERED", *builds.NETWORK_VARIABLES}


def test_an_index_whose_certificate_is_not_trusted_fails_the_build_naming_the_variable_to_set(tmp_path):
    uv = tmp_path / "uv"
    uv.write_text(
        "#!/bin/sh\n"
        "echo 'error: Failed to fetch: https://pypi.org/simple/verifiers/' >&2\n"
        "echo '  cause: invalid peer certificate: UnknownIssuer' >&2\n"
        "echo 'hint: Consider enabling use of system TLS certificates with the `--system-certs` command-line flag' >&2\n"
        "exit 2\n"
    )
    uv.chmod(0o755)
    request = BuildRequest(wheel=tmp_path / "x.whl", index_url="https://pypi.org/simple", exclude_newer="2026-01-01T00:00:00Z",
                           wheelhouse=tmp_path / "wheelhouse", workdir=tmp_path, uv=str(uv))
    info = WheelInfo(filename="x-1.0-py3-none-any.whl", name="x", version="1.0", kind="verifiers", module="x", entry_point="x",
                     dependencies=["verifiers>=0.1"])

    with pytest.raises(BuildFailed) as failed:
        resolve(request, info, cap_verifiers=True)

    message = str(failed.value)
    assert "invalid peer certificate: UnknownIssuer" in message and "--system-certs" not in message
    assert message.endswith(
        "https://pypi.org/simple could not be verified: the build reaches the index with the CA bundle and proxies of the "
        "environment Lab's worker runs in (SSL_CERT_FILE, SSL_CERT_DIR, HTTPS_PROXY, NO_PROXY): set SSL_CERT_FILE there "
        "to the bundle that verifies it (a company proxy's), then lab envs rebuild"
    )


def _zss_source_archive(request: BuildRequest) -> dict:
    """The lock entry of zss 1.2.0 as the resolver gives it from the local index: its source archive only."""
    archive = PACKAGE_INDEX / "files" / "zss-1.2.0.tar.gz"
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    return {"name": "zss", "version": "1.2.0", "filename": archive.name, "url": archive.as_uri(), "sha256": sha256, "sdist": True}


def _index_without(root: Path, project: str) -> str:
    """A copy of the local index's simple/ tree that lists no ``project``, over the same files; its URL."""
    shutil.copytree(PACKAGE_INDEX / "simple", root / "simple", ignore=shutil.ignore_patterns(project))
    (root / "files").symlink_to(PACKAGE_INDEX / "files")
    listing = root / "simple" / "index.html"
    listing.write_text("".join(line for line in listing.read_text().splitlines(keepends=True) if f'"{project}/"' not in line))
    return (root / "simple").as_uri()


def test_a_source_archive_is_built_into_a_wheel_in_the_wheelhouse_once(tmp_path, capsys):
    if not (PACKAGE_INDEX / ".filled").is_file():
        pytest.fail("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    request = BuildRequest(wheel=tmp_path / "x.whl", index_url=(PACKAGE_INDEX / "simple").as_uri(), exclude_newer="2099-01-01T00:00:00Z",
                           wheelhouse=tmp_path / "wheelhouse", workdir=tmp_path / "work", uv=UV, cache=tmp_path / "uv-cache",
                           sandbox=shutil.which("bwrap") is not None)
    request.workdir.mkdir()
    archive = _zss_source_archive(request)

    [built] = build_source_distributions(request, [archive])

    assert (built["name"], built["version"], built["filename"]) == ("zss", "1.2.0", "zss-1.2.0-py3-none-any.whl")
    wheel = request.wheelhouse / built["sha256"] / built["filename"]
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == built["sha256"]
    where = " (in bubblewrap)" if request.sandbox else ""
    assert f"building a wheel of zss 1.2.0 from its source archive zss-1.2.0.tar.gz{where}" in capsys.readouterr().out
    assert not (tmp_path / "uv-cache").exists()  # its setup code ran on a uv cache of its own, not the shared one

    assert build_source_distributions(request, [archive]) == [built]  # the same wheel again, not built twice
    assert "zss-1.2.0.tar.gz: the wheel built from it before, zss-1.2.0-py3-none-any.whl" in capsys.readouterr().out


def test_a_source_archive_whose_build_backend_the_index_lacks_fails_naming_the_backend(tmp_path):
    if not (PACKAGE_INDEX / ".filled").is_file():
        pytest.fail("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    index_url = _index_without(tmp_path / "index", "setuptools")
    request = BuildRequest(wheel=tmp_path / "x.whl", index_url=index_url, exclude_newer="2099-01-01T00:00:00Z",
                           wheelhouse=tmp_path / "wheelhouse", workdir=tmp_path / "work", uv=UV, cache=tmp_path / "uv-cache")
    request.workdir.mkdir()

    with pytest.raises(BuildFailed) as failed:
        build_source_distributions(request, [_zss_source_archive(request)])

    message = str(failed.value)
    assert message.startswith(f"zss 1.2.0 is a source archive on {index_url} (zss-1.2.0.tar.gz), and building a wheel of it failed: ")
    assert "setuptools was not found in the package registry" in message
    assert not any(request.wheelhouse.rglob("*.whl"))
