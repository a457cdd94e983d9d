"""End to end with Prime's own CLI (``prime==0.18.0``) as a subprocess against a live Lab (uvicorn, a
Celery worker, the tiny model's engine; tests/support/stack.py): ``prime env push`` from a
``load_environment`` environment's directory makes a version whose build runs against the local
package index (``make package-index``) and ends ready, ``prime env status`` shows it, and
``prime train run`` trains a tiny-model job on it to success. Another organization's key gets the
404 a missing environment gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from environments.builds import latest_build
from environments.models import EnvironmentPackage
from jobs.models import Job, JobStatus
from tests.support.load_environment_wheels import double_it_dir
from tests.support.packages import local_index_url
from tests.support.prime_configs import TINY_RL_TOML
from tests.support.stack import running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

BIN = Path(sys.executable).parent


@pytest.fixture
def stack(tmp_path, settings):
    index = local_index_url()
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_PACKAGE_INDEX_URL=index) as lab:
        yield lab


def test_prime_env_push_makes_a_version_that_builds_and_prime_train_trains_on_it(stack, owner, outsider, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    folder = double_it_dir(tmp_path)

    def prime(*argv: str, key: str, cwd: Path = folder) -> subprocess.CompletedProcess:
        env = {name: value for name, value in os.environ.items() if not name.startswith(("PRIME_", "LAB_", "UV_"))}
        env.update(
            HOME=str(home), PRIME_API_BASE_URL=f"{stack.base_url}/prime", PRIME_API_KEY=key,
            PRIME_DISABLE_VERSION_CHECK="1", NO_COLOR="1", COLUMNS="200",
            # The CLI builds the wheel with uv: offline, on this interpreter's setuptools.
            PATH=f"{BIN}:/usr/bin:/bin", VIRTUAL_ENV=str(BIN.parent), UV_NO_BUILD_ISOLATION="1", UV_OFFLINE="1",
        )
        return subprocess.run([str(BIN / "prime"), "--plain", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=240)

    pushed = prime("env", "push", key=owner.key)
    assert pushed.returncode == 0, f"{pushed.stdout}\n{pushed.stderr}"
    assert "Successfully pushed acme/double-it" in pushed.stdout
    package = EnvironmentPackage.objects.unscoped().get(organization=owner.organization)
    assert package.public_id == "acme/double-it@0.1.0"

    def build_ended():
        build = latest_build(package)
        return build is not None and build.status in ("ready", "failed") and build

    build = wait_for(build_ended, timeout=300, what="double-it's build ended")
    assert build.status == "ready", f"{build.error}\n{stack.logs()}"
    status = json.loads(prime("env", "status", "acme/double-it", "--output", "json", key=owner.key).stdout)
    assert status["build"] == {"status": "ready", "error": None}
    assert status["latest_version"]["semantic_version"] == "0.1.0"
    foreign = prime("env", "status", "acme/double-it", key=outsider.key)
    assert foreign.returncode == 1 and "404" in foreign.stdout

    config = tmp_path / "rl.toml"
    config.write_text(TINY_RL_TOML.replace('id = "lab/addition"\nargs = { max_operand = 9 }', 'id = "acme/double-it"\nargs = { num_examples = 6 }'))
    dispatched = prime("train", "run", str(config), "--yes", key=owner.key, cwd=tmp_path)
    assert dispatched.returncode == 0, f"{dispatched.stdout}\n{dispatched.stderr}"
    job = Job.objects.unscoped().get(project=owner.project)
    assert job.spec["env"][0]["id"] == "acme/double-it@0.1.0"  # pinned to the version at submit

    def finished():
        job.refresh_from_db()
        return job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

    wait_for(finished, timeout=300, what=f"{job.public_id} finished")
    assert job.status == JobStatus.SUCCEEDED, f"{job.error_code} {job.error_message}\n{stack.logs()}"
    metrics = json.loads(prime("train", "metrics", job.public_id, key=owner.key, cwd=tmp_path).stdout)["metrics"]
    assert [point["step"] for point in metrics] == [1, 2]
    assert all("reward/double-it/exact/mean" in point for point in metrics), metrics
