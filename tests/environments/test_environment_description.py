"""The one line that describes an uploaded environment: the description the package gives itself
(a Lab package's ``EnvironmentInfo.description``, a v1 taskset's docstring, a ``load_environment``
module's docstring), as its build's probe records it and as ``lab envs try`` shows it, wins over the
wheel's ``Summary``, in ``lab envs``, ``lab envs info`` and the Environments page alike
(docs/environments.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.environments import probe
from environments.models import BuildStatus, EnvironmentBuild
from tests.support.dashboard import signed_in
from tests.support.environments import push
from tests.support.packages import REPO
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def test_the_probe_records_a_lab_packages_own_description(tmp_path):
    """vowel-count's ``info.description`` differs from its pyproject's description (its Summary)."""
    out = tmp_path / "summary.json"
    source = REPO / "examples" / "environments" / "vowel-count" / "src"
    result = subprocess.run(
        [sys.executable, "-s", probe.__file__, "vowel_count", "lab", "vowel_count:VowelCount", str(out)],
        env={**os.environ, "PYTHONPATH": f"{source}{os.pathsep}{REPO / 'sdk' / 'lab-environments'}"}, cwd=tmp_path,
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert (summary.get("error"), summary["description"], summary["multi_turn"]) == (
        None, "Count the vowels of a short made-up word.", False,
    )


def test_the_environment_object_describes_a_package_by_its_own_description_once_its_build_is_ready(owner):
    push(owner, build_wheel("digits", "0.1.0"))
    client = owner.client()

    def shown() -> tuple[str, str]:
        listed = next(item for item in client.get("/api/v1/environments").json()["data"] if item["id"] == "acme/digits@0.1.0")
        return listed["description"], client.get("/api/v1/environments/acme/digits@0.1.0").json()["description"]

    assert shown() == ("a test environment", "a test environment")  # the wheel's Summary before a build
    build = EnvironmentBuild.objects.unscoped().get()
    build.status, build.summary = BuildStatus.READY, {"api": "lab", "parameters": [], "description": "Add the digits."}
    build.save()
    assert shown() == ("Add the digits.", "Add the digits.")
    page = signed_in(owner.user).get("/o/acme/environments/")
    assert page.status_code == 200 and "Add the digits." in page.content.decode()
    build.summary = {"api": "v0", "parameters": [], "description": ""}  # none of its own: the Summary
    build.save()
    assert shown() == ("a test environment", "a test environment")
