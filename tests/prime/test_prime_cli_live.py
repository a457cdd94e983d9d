"""Prime's own CLI (``prime==0.18.0``) driving a live Lab: uvicorn, a Celery worker and the tiny
model's engine (tests/support/stack.py).

The CLI runs as a user would, in a subprocess with ``PRIME_API_BASE_URL=<lab>/prime``,
``PRIME_API_KEY`` (a Lab key), ``PRIME_DISABLE_VERSION_CHECK=1`` (its one outbound call) and a
``HOME`` of its own, so no user config is read or written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from jobs.models import Checkpoint, Job, JobStatus
from tests.support.prime_configs import BAD_RL_TOML, TINY_RL_TOML
from tests.support.stack import running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

PRIME = Path(sys.executable).with_name("prime")


@pytest.fixture
def stack(tmp_path, settings):
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1") as lab:
        yield lab


@pytest.fixture
def prime(stack, tmp_path):
    """Run ``prime --plain ARGV`` against the stack with a key; returns the finished process."""
    home = tmp_path / "home"
    home.mkdir()

    def run(*argv: str, key: str, timeout: float = 240) -> subprocess.CompletedProcess:
        env = {name: value for name, value in os.environ.items() if not name.startswith(("PRIME_", "LAB_"))}
        env.update(
            HOME=str(home), PRIME_API_BASE_URL=f"{stack.base_url}/prime", PRIME_API_KEY=key,
            PRIME_DISABLE_VERSION_CHECK="1", NO_COLOR="1", COLUMNS="200",
        )
        return subprocess.run([str(PRIME), "--plain", *argv], env=env, capture_output=True, text=True, timeout=timeout)

    return run


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def test_prime_train_runs_a_prime_rl_config_on_lab_and_every_command_reads_or_changes_it(
    prime, stack, owner, outsider, tmp_path
):
    config, bad = tmp_path / "rl.toml", tmp_path / "bad.toml"
    config.write_text(TINY_RL_TOML)
    bad.write_text(BAD_RL_TOML)

    refused = prime("train", "run", str(bad), "--yes", key=owner.key)
    dispatched = ok(prime("train", "run", str(config), "--yes", key=owner.key))

    assert refused.returncode == 1
    assert "Validation failed:" in refused.stdout, refused.stdout
    for line in ("  - sampling.temperature: ", "  - batch_size: batch_size (10) must be a multiple",
                 "  - env.0.id: environment 'primeintellect/reverse-text' is not installed"):
        assert line in refused.stdout
    job = Job.objects.unscoped().get(project=owner.project)
    assert f"Dispatched hosted run {job.public_id}" in dispatched
    assert job.spec["translated_from"]["layout"] == "prime-rl"

    foreign = prime("train", "get", job.public_id, key=outsider.key)
    missing = prime("train", "get", "job_doesnotexist00000000", key=owner.key)
    assert foreign.returncode == missing.returncode == 1
    assert foreign.stdout == missing.stdout == "Error: HTTP 404: No such run.\n"

    # A second run waits behind the first (one local slot), so it stops at once, twice.
    second = ok(prime("train", "run", str(config), "--yes", key=owner.key)).split("Dispatched hosted run ")[1].split()[0]
    stopped = ok(prime("train", "stop", second, "--force", key=owner.key))
    assert f"Run {second} stopped successfully" in stopped and "Status: STOPPED" in stopped
    assert Job.objects.unscoped().get(public_id=second).status == JobStatus.CANCELLED
    restarted = ok(prime("train", "restart", second, "--force", key=owner.key))
    assert f"Run {second} restarting from checkpoint" in restarted and "Status: QUEUED" in restarted
    assert Job.objects.unscoped().get(public_id=second).status != JobStatus.CANCELLED
    assert "Status: STOPPED" in ok(prime("train", "stop", second, "--force", key=owner.key))

    def finished():
        job.refresh_from_db()
        return job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

    wait_for(finished, timeout=300, what=f"{job.public_id} finished")
    assert job.status == JobStatus.SUCCEEDED, f"{job.error_code} {job.error_message}\n{stack.logs()}"
    checkpoint = Checkpoint.objects.get(job=job, status="ready")

    reads = {
        "list": ("list",), "get": ("get", job.public_id), "logs": ("logs", job.public_id, "--raw"),
        "metrics": ("metrics", job.public_id), "progress": ("progress", job.public_id),
        "distributions": ("distributions", job.public_id),
        "checkpoints": ("checkpoints", job.public_id, "-o", "json"), "usage": ("usage", job.public_id, "-o", "json"),
        "models": ("models",), "gpus": ("gpus",),
    }
    with ThreadPoolExecutor(max_workers=4) as pool:
        printed = dict(zip(reads, pool.map(lambda argv: ok(prime("train", *argv, key=owner.key)), reads.values())))
    listed, shown, logs, models, gpus = (printed[name] for name in ("list", "get", "logs", "models", "gpus"))
    metrics = json.loads(printed["metrics"])["metrics"]
    progress, distribution = json.loads(printed["progress"]), json.loads(printed["distributions"])
    checkpoints, usage = json.loads(printed["checkpoints"]), json.loads(printed["usage"])
    step = progress["steps_with_samples"][-1]
    rollouts = json.loads(ok(prime("train", "rollouts", job.public_id, "--step", str(step), key=owner.key)))

    assert job.public_id in listed and "COMPLETED" in listed and "lab/tiny-random-llama" in listed
    assert "Status: COMPLETED" in shown and "Batch Size: 8" in shown and "Environments: lab/addition" in shown
    assert logs.strip(), "no log lines"
    assert [point["step"] for point in metrics] == [1, 2] and all("reward/mean" in point for point in metrics)
    assert progress["latest_step"] == 2 and progress["steps_with_distributions"] == progress["steps_with_samples"]
    assert rollouts["run_id"] == job.public_id and rollouts["total"] == len(rollouts["samples"]) == 8
    assert all(sample["step"] == step for sample in rollouts["samples"])
    assert distribution["step"] == step and sum(item["count"] for item in distribution["bins"]) == 8
    assert [(item["id"], item["status"], item["step"]) for item in checkpoints["checkpoints"]] == [
        (checkpoint.public_id, "READY", 2)
    ]
    assert checkpoints["checkpoints"][0]["storage_url"].endswith(f"/api/v1/checkpoints/{checkpoint.public_id}/download")
    assert (usage["run_id"], usage["status"], usage["base_model"]) == (job.public_id, "COMPLETED", "lab/tiny-random-llama")
    assert usage["total_cost_usd"] == float(job.cost_usd)
    assert "lab/tiny-random-llama" in models and "cpu" in gpus

    refused_stop = prime("train", "stop", job.public_id, "--force", key=owner.key)
    assert refused_stop.returncode == 1 and "HTTP 409" in refused_stop.stdout

    for run_id in (job.public_id, second):
        assert f"Run {run_id} deleted successfully" in ok(prime("train", "delete", run_id, "--force", key=owner.key))
    assert not Job.objects.unscoped().filter(project=owner.project).exists()
    assert ok(prime("train", "list", key=owner.key)) == "No Hosted Training runs found.\n"
