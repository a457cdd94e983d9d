"""Environment wheels that lied their way in before: a package whose module Lab's own environment
already has (the engine appends packages to ``sys.path``, so it would import that one instead)
and metadata holding NUL (stored, it was a 500). Each push is a 400 that stores nothing."""

from __future__ import annotations

import pytest

from environments.models import EnvironmentPackage
from tests.support.environments import push, stored_keys
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

META = "Metadata-Version: 2.1\nName: my-env\nVersion: 0.1.0\nRequires-Dist: verifiers>=0.4.0\n"


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


@pytest.mark.parametrize(("wheel", "message"), [
    (build_wheel("numpy", files={"numpy/__init__.py": "__all__ = []\n"}),
     "the module 'numpy' is installed where Lab runs, and the engine would import that one instead"),
    (build_wheel("echo-env", files={"echo_env/__init__.py": "", "httpx/__init__.py": ""},
                 entry_points="[lab.environments]\necho = httpx:Echo\n"),
     "the module 'httpx' is installed where Lab runs"),
    (build_wheel("jobs", files={"jobs/__init__.py": ""}), "the module 'jobs' is installed where Lab runs"),
    (build_wheel(metadata=META + "Summary: a\x00b\n"), "my_env-0.1.0.dist-info/METADATA holds NUL characters"),
    (build_wheel(metadata=META + "Requires-Python: >=3\x00\n"), "my_env-0.1.0.dist-info/METADATA holds NUL characters"),
], ids=["verifiers-numpy", "lab-entry-point-httpx", "labs-own-jobs", "summary-nul", "requires-python-nul"])
def test_a_wheel_the_engine_could_not_load_or_lab_could_not_store_is_a_400_that_stores_nothing(owner, wheel, message):
    response = push(owner, wheel)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_environment_package", "file")
    assert error["message"].startswith(f"Not an acceptable environment wheel: {message}")
    assert EnvironmentPackage.objects.unscoped().count() == 0
    assert stored_keys() == []


def test_a_package_named_like_no_installed_module_is_still_accepted(owner):
    response = push(owner, build_wheel("my-env"))

    assert response.status_code == 201, response.content
    assert response.json()["entry_point"] == "my_env"
