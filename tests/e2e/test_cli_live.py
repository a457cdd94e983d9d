"""The installed ``lab`` console script against the real jobs API on a live HTTP server.

Each test runs the command as a user would, in a subprocess with ``LAB_API_KEY`` and
``LAB_BASE_URL``, and checks its exit status, what it printed, and what the server stored.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from jobs.models import Job, JobStatus
from tests.support.cli import lab_cli

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cli(live_server, tenant):
    def run(*argv: str, key: str | None = tenant.key) -> subprocess.CompletedProcess:
        return lab_cli(*argv, key=key, base_url=live_server.url)

    return run


BAD_SPEC = """\
model = "lab/tiny-random-llama"
batch_size = 30
rollouts_per_example = 4
colour = "blue"

[sampling]
temperature = 3.0

[[env]]
args = { max_operand = 9 }
"""


def test_jobs_create_prints_the_new_job_id(cli, tenant, tiny_toml):
    result = cli("jobs", "create", "-f", str(tiny_toml))

    assert result.returncode == 0, result.stderr
    job = Job.objects.unscoped().get(project=tenant.project)
    assert result.stdout == f"{job.public_id}\n"
    assert job.public_id.startswith("job_")
    assert result.stderr == ""


def test_jobs_list_json_get_and_cancel(cli, tenant, tiny_toml):
    first = cli("jobs", "create", "-f", str(tiny_toml)).stdout.strip()
    second = cli("jobs", "create", "-f", str(tiny_toml), "--name", "second").stdout.strip()

    listed = cli("jobs", "list", "--json")
    shown = cli("jobs", "get", first)
    shown_json = cli("jobs", "get", second, "--json")
    cancelled = cli("jobs", "cancel", first)
    again = cli("jobs", "cancel", first)

    assert listed.returncode == 0, listed.stderr
    assert [job["id"] for job in json.loads(listed.stdout)] == [second, first]
    assert shown.returncode == 0, shown.stderr
    assert first in shown.stdout and "queued" in shown.stdout and "lab/addition" in shown.stdout
    assert json.loads(shown_json.stdout)["name"] == "second"
    assert (cancelled.returncode, cancelled.stdout) == (0, f"{first} cancelled\n")
    assert Job.objects.unscoped().get(public_id=first).status == JobStatus.CANCELLED
    assert again.returncode == 1
    assert "(invalid_state)" in again.stderr and "Traceback" not in again.stderr
    assert Job.objects.unscoped().get(public_id=second).status == JobStatus.QUEUED


def test_spec_check_names_every_problem_without_a_traceback(cli, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(BAD_SPEC)

    offline = cli("spec", "check", str(path), key=None)
    online = cli("spec", "check", str(path))

    for result in (offline, online):
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        for param in ("colour", "sampling.temperature", "env.0.id"):
            assert f"  {param}: " in result.stderr, result.stderr
        assert "batch_size" in result.stderr


def test_spec_check_asks_lab_for_the_catalogue_checks(cli, tmp_path, tiny_toml):
    path = tmp_path / "unknown-env.toml"
    path.write_text(tiny_toml.read_text().replace('"lab/addition"', '"primeintellect/reverse-text"'))

    good = cli("spec", "check", str(tiny_toml))
    bad = cli("spec", "check", str(path))

    assert good.returncode == 0, good.stderr
    assert "checked locally and by Lab" in good.stdout
    assert bad.returncode == 1
    assert "1 problem (checked locally and by Lab)" in bad.stderr and "  env.0.id: " in bad.stderr
    assert "lab/addition" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert not Job.objects.unscoped().exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'model = "a"\nmodel = "b"\n', "line 2"),
        (b'name = "\xff\xfe"\n', "UTF-8"),
        (b"[[env]\n", "bad.toml"),
    ],
    ids=["duplicate-key", "not-utf8", "broken-toml"],
)
def test_spec_check_refuses_unreadable_toml_clearly(cli, tmp_path, content, expected):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)

    result = cli("spec", "check", str(path), key=None)

    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_wrong_key_fails_with_the_servers_message(cli, tiny_toml):
    listed = cli("jobs", "list", key="lab_not-a-real-key")
    created = cli("jobs", "create", "-f", str(tiny_toml), key="lab_not-a-real-key")

    for result in (listed, created):
        assert result.returncode == 1
        assert result.stdout == ""
        assert "Missing, malformed, revoked or unknown API key" in result.stderr
        assert "(invalid_api_key)" in result.stderr
        assert "Traceback" not in result.stderr
    assert not Job.objects.unscoped().exists()


def test_another_tenants_job_is_not_found(cli, outsider, tiny_toml):
    job_id = cli("jobs", "create", "-f", str(tiny_toml)).stdout.strip()

    shown = cli("jobs", "get", job_id, key=outsider.key)
    cancelled = cli("jobs", "cancel", job_id, key=outsider.key)

    for result in (shown, cancelled):
        assert result.returncode == 1
        assert "(not_found)" in result.stderr and "Traceback" not in result.stderr
    assert Job.objects.unscoped().get(public_id=job_id).status == JobStatus.QUEUED


def test_a_toml_with_only_prime_keys_is_accepted_with_warnings(cli, tenant, tmp_path):
    from tests.support.spec_examples import PRIME_ONLY_TOML

    path = tmp_path / "prime.toml"
    path.write_text(PRIME_ONLY_TOML)
    (tmp_path / "secrets.env").write_text("WANDB_API_KEY=wandb-secret-value\n")  # its env_files, read by the CLI

    result = cli("jobs", "create", "-f", str(path))

    assert result.returncode == 0, result.stderr
    job = Job.objects.unscoped().get(project=tenant.project)
    assert result.stdout == f"{job.public_id}\n"
    # oversampling_factor, max_async_level, trajectory_strategy and [wandb] (the reasoning controls
    # go to the chat template); env_files is read by the CLI (the job's secrets), not sent
    assert result.stderr.count("warning: ") == len(job.warnings) == 4
    assert job.spec["wandb"] == {"project": "lab-runs", "name": "addition"}
    assert job.spec["sampling"]["enable_thinking"] is False
    assert "env_files" not in job.spec and job.secrets.names == ["WANDB_API_KEY"]


def test_jobs_wait_and_events_report_how_a_job_ended(cli, tiny_toml):
    queued = cli("jobs", "create", "-f", str(tiny_toml)).stdout.strip()
    cancelled = cli("jobs", "create", "-f", str(tiny_toml)).stdout.strip()
    cli("jobs", "cancel", cancelled)

    timed_out = cli("jobs", "wait", queued, "--timeout", "1", "--no-progress")
    ended = cli("jobs", "wait", cancelled, "--no-progress")
    events = cli("jobs", "events", cancelled, "--json")

    assert timed_out.returncode == 1
    assert f"job {queued} is still queued after waiting 1 s" in timed_out.stderr
    assert ended.returncode == 1
    assert f"job {cancelled} was cancelled" in ended.stderr
    assert "Traceback" not in timed_out.stderr + ended.stderr
    assert [event["type"] for event in json.loads(events.stdout)] == ["job.queued", "job.cancelled"]


def test_jobs_distributions_prints_a_histogram_of_a_steps_rewards(cli, tenant, spec, no_broker):
    from tests.support.jobs_helpers import Engine, submit

    job = submit(tenant, spec)
    engine = Engine(job)
    engine.running(0)
    rows = [{"group": i // 2, "prompt": "p", "completion": "c", "reward": r, "advantage": r - 0.5, "metrics": {}}
            for i, r in enumerate([0.0, 0.0, 0.0, 1.0])]
    engine.post("samples", {"attempt": 1, "samples": [{"step": 3, **row} for row in rows]})

    shown = cli("jobs", "distributions", job.public_id, "--bins", "2")
    as_json = cli("jobs", "distributions", job.public_id, "--type", "advantage", "--json")

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "reward at step 3: 4 rollouts, mean 0.25, min 0, max 1"
    assert [line.split() for line in lines[2:]] == [["0", "0.5", "3", "█" * 30], ["0.5", "1", "1", "█" * 10]]
    assert (json.loads(as_json.stdout)["type"], json.loads(as_json.stdout)["mean"]) == ("advantage", -0.25)
