"""Environment builds attacked by the packages they build (environments.builder): a pushed wheel is
hostile, so neither its metadata nor its code at import may reach another tenant's files, Lab's
files or what later builds install. Each test first makes sure the target exists, so that it
fails when the protection goes."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

from environments.builder.sandbox import sandbox_command
from environments.builds import build_log, build_run, latest_build
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from lab import storage
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel, lab_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

PACKAGE_INDEX = Path(__file__).resolve().parents[2] / "var" / "package-index"


@pytest.fixture
def index(settings, tmp_path) -> str:
    """The local package index, an empty storage and a LAB_DATA_DIR (uv's cache) of this test's own."""
    if not (PACKAGE_INDEX / ".filled").is_file():
        pytest.fail("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    settings.LAB_PACKAGE_INDEX_URL = (PACKAGE_INDEX / "simple").as_uri()
    settings.LAB_DATA_DIR = tmp_path / "data"
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    return settings.LAB_PACKAGE_INDEX_URL


def _build(tenant, wheel) -> EnvironmentBuild:
    response = push(tenant, wheel)
    assert response.status_code == 201, response.content
    return build_run(latest_build(EnvironmentPackage.objects.unscoped().get(pk=_package_pk(response))).pk)


def _package_pk(response) -> int:
    body = response.json()
    return EnvironmentPackage.objects.unscoped().get(name=body["name"], version=body["version"]).pk


def test_a_direct_reference_to_another_tenants_wheel_is_refused_before_anything_is_fetched(owner, outsider, index):
    victim = push(outsider, lab_wheel("victim-env", organization="other", prelude="SECRET = 'the-victims-secret'\n"))
    assert victim.status_code == 201, victim.content
    victim_path = storage.path_of(EnvironmentPackage.objects.unscoped().get(name="victim-env").storage_key)
    assert victim_path.is_file()
    thief = lab_wheel("thief-env", prelude="import victim_env\nprint('stolen:', victim_env.SECRET)\n")
    thief = build_wheel(
        "thief-env", files={"thief_env/__init__.py": zipfile.ZipFile(io.BytesIO(thief[1])).read("thief_env/__init__.py")},
        requires=[f"victim-env @ {victim_path.as_uri()}"], entry_points="[lab.environments]\nthief-env = thief_env:Echo\n",
    )

    build = _build(owner, thief)

    assert build.status == BuildStatus.FAILED
    assert "victim-env" not in [entry["name"] for entry in build.lock]
    assert "the-victims-secret" not in build_log(build)
    assert "direct reference" in build.error, build.error


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x-1.0-py3-none-any.whl", "http://169.254.169.254/latest/x-1.0-py3-none-any.whl", "file:///etc/passwd"])
def test_a_url_requirement_is_refused_without_a_request(owner, index, url):
    build = _build(owner, build_wheel("url-env", files={"url_env/__init__.py": ""}, requires=[f"x @ {url}"],
                                      entry_points="[lab.environments]\nurl-env = url_env:Echo\n"))

    assert build.status == BuildStatus.FAILED
    assert build.error.startswith("its requirement 'x @ "), build.error
    assert "direct reference" in build.error


POISON = """
import importlib.util, pathlib
_six = pathlib.Path(importlib.util.find_spec('six').origin)
try:
    with _six.open('a') as _handle:
        _handle.write('\\nPOISONED_BY_ANOTHER_TENANT = True\\n')
    print('poisoned', _six)
except OSError as _error:
    print('could not poison', _six, _error)
"""


def test_a_package_cannot_change_the_files_that_later_builds_install(owner, outsider, index):
    first = _build(outsider, lab_wheel("poison-env", organization="other", extra_requires=("six",), prelude=POISON))
    assert "six" in [entry["name"] for entry in first.lock], build_log(first)
    assert first.status == BuildStatus.READY, build_log(first)

    cache = Path(settings.LAB_DATA_DIR) / "cache" / "uv"
    assert cache.is_dir()
    poisoned = [path for path in cache.rglob("six.py") if b"POISONED_BY_ANOTHER_TENANT" in path.read_bytes()]
    assert poisoned == [], build_log(first)
    check = "import six\nassert not hasattr(six, 'POISONED_BY_ANOTHER_TENANT'), 'six was poisoned'\n"
    second = _build(owner, lab_wheel("victim-env", extra_requires=("six",), prelude=check))
    assert second.status == BuildStatus.READY, build_log(second)


def test_the_import_step_sees_no_private_keys_of_the_host(tmp_path):
    if not Path("/etc/ssl/private").is_dir():
        pytest.skip("this host has no /etc/ssl/private to hide")
    command = sandbox_command([Path(sys.prefix)], tmp_path) + ["/bin/sh", "-c", "ls /etc/ssl; ls -d /etc/ssl/private"]
    result = subprocess.run(command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=False)

    assert "certs" in result.stdout.split(), result.stderr  # what TLS needs is there
    assert "private" not in result.stdout, result.stdout


def test_another_organizations_version_answers_on_every_build_route_as_a_missing_one(owner, outsider, index):
    assert push(owner, lab_wheel("echo-env")).status_code == 201
    for method, path in (("get", ""), ("get", "/build-log"), ("post", "/builds")):
        foreign = getattr(outsider.client(), method)(f"/api/v1/environments/acme/echo-env@0.1.0{path}")
        missing = getattr(outsider.client(), method)(f"/api/v1/environments/acme/nothing-env@0.1.0{path}")
        assert foreign.status_code == missing.status_code == 404, (path, foreign.content)
        assert foreign.json() == missing.json(), path
    assert EnvironmentBuild.objects.unscoped().count() == 1
