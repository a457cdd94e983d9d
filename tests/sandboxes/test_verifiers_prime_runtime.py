"""verifiers 0.4.0's v1 ``prime`` runtime (``PrimeRuntime``, what a taskset's agent runs in by
default) against Lab with an attempt's sandbox key, as the engine hands it to an environment
(``PRIME_API_BASE_URL``, ``PRIME_API_KEY``): with its default config (work dir ``/app``, made in
the sandbox's writable root) it makes a sandbox of the attempt, runs commands and moves files
there (relative to ``/app`` and absolute), and deletes it at teardown; its live processes are what
Lab's sandboxes lack (docs/prime-compat.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engine.environments.verifiers_taskset import verifiers_python
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.services import LIMITS
from tests.support.job_sandboxes import attempt_sandbox_key, held, launched_attempt, stop_active_sandboxes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime", "no_broker")]

PROBE = Path(__file__).with_name("verifiers_prime_runtime_probe.py")


@pytest.fixture(autouse=True)
def _stop_what_the_test_left(runtime):
    yield
    stop_active_sandboxes(runtime)


def test_verifiers_prime_runtime_makes_runs_and_deletes_a_sandbox_of_the_attempt_in_lab(owner, spec, live_server, tmp_path, runtime):
    python = verifiers_python()
    if not python.exists():
        pytest.fail(f"{python} does not exist: run `make install` (it creates .venv-verifiers)")
    attempt, engine = launched_attempt(owner, spec)
    key = attempt_sandbox_key(attempt, engine)
    environment = {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path), "PRIME_API_BASE_URL": f"{live_server.url}/prime",
        "PRIME_API_KEY": key["api_key"], "PRIME_DISABLE_VERSION_CHECK": "1",
    }
    # verifiers' default config: work dir /app (python:3.11-slim's), which it makes with mkdir -p.
    configs = [[{}, ["run", "write", "read", "write_absolute", "read_absolute", "run_on_written", "live_process"]]]
    done = subprocess.run([str(python), str(PROBE), json.dumps(configs)], env=environment, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    (default,) = (json.loads(line) for line in done.stdout.splitlines())

    assert default["run"] == [0, "42 /app\n", ""], default
    assert (default["write"], default["read"]) == ("None", "b'42\\n'"), default
    assert (default["write_absolute"], default["read_absolute"]) == ("None", "b'in etc\\n'"), default
    assert default["run_on_written"] == [0, "42\nin etc\n1000\n", ""], default
    # A live process (stdin, re-attach) is a command session Lab's gateway does not serve.
    assert "unimplemented" in default["live_process_error"]

    made = {row.public_id: row for row in Sandbox.objects.unscoped().filter(attempt=attempt)}
    assert set(made) == {default["id"]}
    for row in made.values():
        assert (row.labels["lab.job"], row.labels["lab.attempt"]) == (attempt.job.public_id, "1")
        assert row.image == "python:3.11"  # python:3.11-slim maps to it
        # verifiers asks for no lifetime (timeout_minutes -1, its idle timeout alone): Lab's longest.
        assert row.timeout_s == LIMITS["timeout_s"][1]
        assert row.status == SandboxStatus.STOPPED  # its teardown deleted it
    assert not set(made) & held(runtime)
