"""The engine as three roles (engine/roles.py): `python -m engine run` with LAB_ENGINE_ROLES=process
starts an inference and an orchestrator role and trains as the trainer role over a shared
directory. The same job trains exactly as one process sampling through an inference role does,
resumes exactly from a checkpoint holding batches sampled ahead, and a role killed or failing
mid-run ends the attempt with the exit code its failure calls for."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.engine.conftest import REPO_ROOT, wait_for_first_step, write_spec
from tests.support.engine_roles import SPEC, engine, finished, points
from tests.support.wheelbuilder import lab_wheel

pytestmark = pytest.mark.e2e  # several engine processes per test


def samples(workdir):
    return [json.loads(line) for line in (workdir / "samples.jsonl").read_text().splitlines()]


def test_three_roles_train_exactly_as_one_process_and_resume_exactly(tmp_path):
    spec = write_spec(tmp_path / "spec.json", **SPEC)
    one = engine(tmp_path, spec, {"LAB_ENGINE_INFERENCE": "process"}, workdir="one")
    code, stderr = finished(one)
    assert code == 0, stderr[-3000:]
    three = engine(tmp_path, spec, {"LAB_ENGINE_ROLES": "process"}, workdir="three")
    code, stderr = finished(three)
    assert code == 0, stderr[-3000:]
    assert "rollouts from the orchestrator role over" in stderr

    expected, got = points(tmp_path / "one"), points(tmp_path / "three")
    assert sorted(got) == [0, 1, 2, 3, 4]  # the base model's eval is step 0
    assert got == expected
    assert "eval/reverse-text/mean" in got[0] and "eval/reverse-text/mean" in got[2] and "eval/reverse-text/mean" in got[4]
    assert [p["off_policy/steps_max"] for _, p in sorted(got.items()) if _ > 0] == [0.0, 1.0, 2.0, 2.0]
    assert samples(tmp_path / "three") == samples(tmp_path / "one")
    assert any(values.get("loss/mean") for values in got.values())
    # Each role's own log; nothing of the shared directory is left behind.
    assert (tmp_path / "three" / "orchestrator" / "orchestrator.log").exists()
    shared = re.search(r"shared directory (\S+)", stderr).group(1)
    assert "lab-engine-job_1-1-" in shared and not os.path.exists(shared)

    # The checkpoint of step 2 holds the batches of steps 3 and 4 (sampled ahead by policy 1... 0);
    # resumed as three roles it trains them and reports steps 3 and 4 as the uninterrupted run did.
    checkpoint = tmp_path / "three" / "checkpoints" / "step-000002"
    resumed = engine(tmp_path, spec, {"LAB_ENGINE_ROLES": "process"}, "--resume-from", str(checkpoint), workdir="resumed")
    code, stderr = finished(resumed)
    assert code == 0, stderr[-3000:]
    again = points(tmp_path / "resumed")
    assert sorted(again) == [3, 4]
    assert again == {step: expected[step] for step in (3, 4)}


def test_an_orchestrator_killed_mid_run_takes_the_attempt_down_as_a_crash(tmp_path):
    spec = write_spec(tmp_path / "spec.json", max_steps=200, checkpoints={"interval": 0, "keep_last": 1})
    process = engine(tmp_path, spec, {"LAB_ENGINE_ROLES": "process"})
    wait_for_first_step(process, tmp_path / "work")
    listed = subprocess.run(["pgrep", "-f", f"engine orchestrator .*{tmp_path / 'work' / 'orchestrator'}"], capture_output=True, text=True)
    (pid,) = [int(p) for p in listed.stdout.split()]
    os.kill(pid, signal.SIGKILL)
    code, stderr = finished(process, timeout=300)
    assert code == 1, stderr[-3000:]
    assert "the orchestrator role exited with code -9" in stderr
    leftover = subprocess.run(["pgrep", "-f", f"engine inference .*{tmp_path / 'work' / 'inference'}"], capture_output=True, text=True)
    assert leftover.stdout.split() == []  # the inference role went with the attempt


#: Environment code that would keep its process alive forever: a thread that is no daemon and never
#: ends, which Python's own exit waits for.
IMMORTAL_THREAD = "import threading\nthreading.Thread(target=threading.Event().wait, name='immortal').start()\n"


def test_a_trainer_killed_with_sigkill_takes_its_roles_with_it(tmp_path):
    """However the orchestrator role is held up (here by its environment's code), it ends within
    seconds of its trainer's death and clears the directory the trainer's run left."""
    filename, data = lab_wheel("immortal-env", prelude=IMMORTAL_THREAD)
    (tmp_path / filename).write_bytes(data)
    package = {"id": "acme/immortal-env@0.1.0", "sha256": hashlib.sha256(data).hexdigest(), "url": (tmp_path / filename).as_uri(), "filename": filename}
    spec = write_spec(tmp_path / "spec.json", max_steps=200, checkpoints={"interval": 0, "keep_last": 1}, env=[{"id": package["id"]}])
    process = engine(tmp_path, spec, {"LAB_ENGINE_ROLES": "process", "LAB_JOB_ENVIRONMENT_PACKAGES": json.dumps([package])})
    wait_for_first_step(process, tmp_path / "work")
    process.kill()  # no clean-up code of the trainer runs
    process.wait(timeout=30)
    shared = re.search(r"shared directory (\S+)", process.stderr.read()).group(1)

    def left():
        listed = subprocess.run(["pgrep", "-f", f"engine (orchestrator|inference) .*{tmp_path / 'work'}"], capture_output=True, text=True)
        return listed.stdout.split()

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == [], "a role outlived its trainer"
    assert not os.path.exists(shared)  # the orchestrator cleared the directory its run left


def test_the_orchestrator_carries_no_lab_token_and_its_failures_reach_the_trainer(tmp_path):
    """An environment argument that fails only when the environment loads is refused in the
    orchestrator (it alone loads environments); the trainer reports it as exit 2."""
    spec = write_spec(tmp_path / "spec.json", max_steps=2, env=[{"id": "lab/reverse-text", "args": {"min_length": 5, "max_length": 2}}])
    process = engine(tmp_path, spec, {"LAB_ENGINE_ROLES": "process", "LAB_JOB_TOKEN": "ljt_secret_value"})
    code, stderr = finished(process, timeout=600)
    assert code == 2, stderr[-3000:]
    assert "the orchestrator role failed:" in stderr and "min_length" in stderr
    assert "ljt_secret_value" not in (tmp_path / "work" / "orchestrator" / "orchestrator.log").read_text()


def descendants(pid):
    """The pids of every live process below `pid` (Linux /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(") ", 1)[1].split()[1]), []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def test_no_process_the_engine_starts_inherits_its_job_tokens_and_the_engine_is_not_dumpable(tmp_path):
    """Environment code runs in processes of the engine's user, which may read the environment of
    any dumpable process of that user (/proc/<pid>/environ). Every process a three-roles run starts
    (the inference and orchestrator roles and what they start) has neither job token in its
    environment, and every engine process is non-dumpable (engine.cli._guard_credentials)."""
    spec = write_spec(tmp_path / "spec.json", max_steps=3)
    tokens = {"LAB_JOB_TOKEN": "ljt_secret_value", "LAB_JOB_BOOTSTRAP_TOKEN": "ljb_secret_value"}
    process = engine(tmp_path, spec, {"LAB_ENGINE_ROLES": "process", **tokens})
    environments = {}
    while process.poll() is None:
        for pid in descendants(process.pid):
            try:
                command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
                environments[command] = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:  # ended meanwhile
                pass
        time.sleep(0.2)
    code, stderr = finished(process)
    assert code == 0, stderr[-3000:]
    roles = {role for role in ("engine inference", "engine orchestrator") for command in environments if role in command}
    assert roles == {"engine inference", "engine orchestrator"}, list(environments)
    for command, environment in environments.items():
        assert b"secret_value" not in environment, command
    # Non-dumpable, as each engine process sees itself (the kernel then keeps its /proc/<pid>/environ
    # from other processes of its user).
    probe = (
        "import ctypes, json, os, subprocess, sys\n"
        "from engine.cli import main\n"
        "code = main(['orchestrator', '--job-id', 'job_1', '--attempt', '1', '--workdir', sys.argv[1], '--spec', sys.argv[2]])\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(n for n in os.environ if n.startswith(\"LAB_JOB\")))'],\n"
        "                       capture_output=True, text=True).stdout.strip()\n"
        "print(json.dumps({'code': code, 'dumpable': ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), 'child': child,\n"
        "                  'left': sorted(n for n in os.environ if n.startswith('LAB_JOB'))}))\n"
    )
    environment = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}", **tokens,
                   "LAB_ENGINE_SHARED_DIR": "", "LAB_ENGINE_INFERENCE_URL": ""}
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "probe"), str(spec)], cwd=REPO_ROOT, env=environment,
                            capture_output=True, text=True, timeout=120)
    assert json.loads(result.stdout.splitlines()[-1]) == {"code": 2, "dumpable": 0, "child": "[]", "left": []}, result.stderr[-2000:]


def test_the_roles_refuse_to_start_without_their_shared_directory(tmp_path):
    spec = write_spec(tmp_path / "spec.json")
    for command, needed in (("trainer", "LAB_ENGINE_SHARED_DIR"), ("orchestrator", "LAB_ENGINE_SHARED_DIR and LAB_ENGINE_INFERENCE_URL")):
        env = {"LAB_ENGINE_SHARED_DIR": "", "LAB_ENGINE_INFERENCE_URL": ""}
        code, stderr = finished(engine(tmp_path, spec, env, command=command, workdir=command), timeout=300)
        assert code == 2, stderr[-2000:]
        assert needed in stderr


def test_the_three_documented_commands_run_a_job_and_a_stale_session_is_ignored(tmp_path):
    """The roles started one by one, as a JobSet starts them (docs/engine.md "Three roles"), on a
    shared directory holding an earlier attempt's ended session, which the orchestrator must not follow."""
    spec = write_spec(tmp_path / "spec.json", max_steps=3, max_off_policy_steps=1)
    shared = tmp_path / "shared"
    (shared / "old").mkdir(parents=True)
    (shared / "session.json").write_text(json.dumps({
        "session": "old", "job_id": "job_1", "attempt": 1, "start_step": 1, "next_batch_step": 4, "max_steps": 3, "async_depth": 0,
    }))
    # Ended whole: followed, it would let the orchestrator finish at once and leave the new trainer waiting.
    (shared / "old" / "final.json").write_text('{"last_step": 3}')
    (shared / "old" / "exit.json").write_text('{"exit_code": 0}')
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}"}
    inference = subprocess.Popen(
        [sys.executable, "-m", "engine", "inference", "--model", "lab/tiny-random-llama", "--backend", "transformers",
         "--host", "127.0.0.1", "--port", "0", "--workdir", str(tmp_path / "inference")],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = None
        while url is None:
            line = inference.stderr.readline()
            assert line, "the inference role exited before serving"
            found = re.search(r"serving .* on (http://\S+)", line)
            url = found.group(1) if found else None
        roles = {"LAB_ENGINE_SHARED_DIR": str(shared), "LAB_ENGINE_INFERENCE_URL": url}
        orchestrator = engine(tmp_path, spec, roles, command="orchestrator", workdir="orchestrator")
        time.sleep(2)  # it sees the old session first
        assert orchestrator.poll() is None
        trainer = engine(tmp_path, spec, roles, command="trainer", workdir="trainer")
        code, stderr = finished(trainer, timeout=300)
        assert code == 0, stderr[-3000:]
        code, orchestrator_stderr = finished(orchestrator, timeout=120)
        assert code == 0, orchestrator_stderr[-3000:]
    finally:
        inference.terminate()
        inference.wait(timeout=60)
    assert sorted(points(tmp_path / "trainer")) == [1, 2, 3]
    assert not (shared / "old").exists()  # the trainer cleared the directory for its session
    session = json.loads((shared / "session.json").read_text())["session"]
    assert json.loads((shared / session / "exit.json").read_text()) == {"exit_code": 0}
