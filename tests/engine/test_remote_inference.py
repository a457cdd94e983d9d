"""The trainer sampling through an inference role over HTTP (engine/remote_inference.py): a
tiny-model job with the role started by the engine (`LAB_ENGINE_INFERENCE=process`), resume
exactness through it, a role killed mid-run, and a role serving another model."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.engine.conftest import REPO_ROOT, engine_config, tiny_spec, wait_for_first_step, write_spec
from tests.support.engine import (
    NONDETERMINISTIC_PREFIXES,
    teacher_server,  # noqa: F401  (a fixture: an inference role on the tiny model)
    train,
)


def engine(tmp_path, spec, env):
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}",
                   "LAB_ENGINE_WEIGHTS_DIR": str(tmp_path / "weights"), **env}
    return subprocess.Popen(
        [sys.executable, "-m", "engine", "run", "--job-id", "job_1", "--attempt", "1", "--workdir", str(tmp_path / "work"),
         "--spec", str(spec), "--offline"],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def role_url(tmp_path):
    return re.search(r"serving .* on (http://\S+)", (tmp_path / "work" / "inference" / "inference.log").read_text()).group(1)


def role_pids(tmp_path):
    listed = subprocess.run(["pgrep", "-f", f"engine inference .*{tmp_path / 'work' / 'inference'}"], capture_output=True, text=True)
    return [int(pid) for pid in listed.stdout.split()]


def test_a_job_samples_through_an_inference_role_it_starts_and_stops_it_at_the_end(tmp_path):
    spec = write_spec(tmp_path / "spec.json", max_steps=3)
    process = engine(tmp_path, spec, {"LAB_ENGINE_INFERENCE": "process"})
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    points = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(p["step"] for p in points) == [1, 2, 3]
    assert "rollouts through the inference role at http://127.0.0.1:" in stderr
    log = (tmp_path / "work" / "inference" / "inference.log").read_text()
    # The trainer's weights reached the role: with overlap step 3 is sampled by version 1.
    assert re.findall(r"loaded policy version (\d+) from", log)[-1] == "1"
    with pytest.raises(httpx.ConnectError):  # the role went with the engine
        httpx.get(role_url(tmp_path) + "/health", timeout=5)
    assert not (tmp_path / "weights").exists() or not any((tmp_path / "weights").iterdir())  # weight files removed


def test_resume_through_an_inference_role_reproduces_the_uninterrupted_run(tmp_path):
    def config():
        spec = tiny_spec(max_steps=4, seed=2, checkpoints={"interval": 2, "keep_last": 3})
        return engine_config(spec, overlap=True, micro_batch_rollouts=4, inference="process", weights_dir=str(tmp_path / "weights"))

    uninterrupted = train(tmp_path / "a", config())
    train(tmp_path / "b", config(), stop_after=2)
    resumed = train(tmp_path / "c", config(), resume_from=tmp_path / "b" / "checkpoints" / "step-000002")
    assert resumed == {step: uninterrupted[step] for step in (3, 4)}
    assert all(not name.startswith(NONDETERMINISTIC_PREFIXES) for values in resumed.values() for name in values)
    assert any(values["loss/mean"] != 0.0 for values in uninterrupted.values())


def test_a_role_killed_mid_run_takes_the_attempt_down_as_a_crash(tmp_path):
    spec = write_spec(tmp_path / "spec.json", max_steps=200, checkpoints={"interval": 0, "keep_last": 1})
    process = engine(tmp_path, spec, {"LAB_ENGINE_INFERENCE": "process"})
    wait_for_first_step(process, tmp_path / "work")
    port = role_url(tmp_path).rsplit(":", 1)[1]
    (role_pid,) = role_pids(tmp_path)
    os.kill(role_pid, signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 1, stderr[-3000:]
    assert "the inference role exited with code -9" in stderr
    assert port  # the role had an address before it died


def test_an_engine_killed_with_sigkill_takes_its_inference_role_with_it(tmp_path):
    spec = write_spec(tmp_path / "spec.json", max_steps=200, checkpoints={"interval": 0, "keep_last": 1})
    process = engine(tmp_path, spec, {"LAB_ENGINE_INFERENCE": "process"})
    wait_for_first_step(process, tmp_path / "work")
    (role,) = role_pids(tmp_path)
    process.kill()  # no clean-up code of the engine runs
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while role_pids(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert role_pids(tmp_path) == [], f"the inference role {role} outlived its engine"


def test_a_role_serving_another_model_is_refused(tmp_path, teacher_server):  # noqa: F811
    from engine.remote_inference import HttpRolloutBackend, InferenceUnavailable

    with pytest.raises(InferenceUnavailable) as refused:
        HttpRolloutBackend(teacher_server, model_id="other/model", weights_dir=tmp_path / "weights")
    assert str(refused.value) == f"the inference role at {teacher_server} serves ['lab/tiny-random-llama'], not 'other/model'"
