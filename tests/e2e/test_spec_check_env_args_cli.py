"""``lab spec check`` names an uploaded environment's argument that its ready build says it does
not take, and one of the wrong type, before any job runs, and ``lab envs`` lists the arguments
the build recorded (a subprocess against a live Lab)."""

from __future__ import annotations

import pytest

from environments.models import BuildStatus, EnvironmentBuild
from tests.support.cli import lab_cli
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]

SPEC = """\
model = "lab/tiny-random-llama"
max_steps = 2

[[env]]
id = "acme/digits"
args = { max_digit = 3, min_digits = "1" }
"""


def test_spec_check_names_the_arguments_the_environment_takes(live_server, tenant, tmp_path, settings):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    assert push(tenant, build_wheel("digits", "0.1.0")).status_code == 201
    EnvironmentBuild.objects.unscoped().update(status=BuildStatus.READY, summary={"api": "v0", "parameters": [
        {"name": "min_digits", "default": 1, "type": "int", "required": False},
        {"name": "max_digits", "default": 5, "type": "int", "required": False},
    ]})
    path = tmp_path / "job.toml"
    path.write_text(SPEC)

    result = lab_cli("spec", "check", str(path), key=tenant.key, base_url=live_server.url)

    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "env.0.args.max_digit" in output and "its load_environment takes min_digits, max_digits" in output
    assert "env.0.args.min_digits" in output and "must be an integer (int), not a string" in output
    assert "Traceback" not in output
    listed = lab_cli("envs", key=tenant.key, base_url=live_server.url)
    assert listed.returncode == 0, listed.stderr
    assert "min_digits=1 max_digits=5" in listed.stdout
