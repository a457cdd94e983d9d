"""``python -m demo`` end to end, the way CI runs it: from the existing virtual environment, on
the embedded defaults (no DATABASE_URL, REDIS_URL or CELERY_BROKER_URL), in a fresh data dir, on
free ports. Each test checks that nothing it started is left running afterwards.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.stack import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
SERVER_VARIABLES = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")

pytestmark = pytest.mark.e2e


def demo_environment(data_dir: Path, **overrides: str) -> dict[str, str]:
    """The test's environment without Lab's server URLs, with a fresh data dir and free port."""
    env = {name: value for name, value in os.environ.items() if name not in SERVER_VARIABLES}
    env.update({"LAB_DATA_DIR": str(data_dir), "DEMO_PORT": str(free_port()), "DEMO_EXIT": "1", **overrides})
    return env


def processes_using(data_dir: Path) -> list[str]:
    """Return ``pid command`` of every live process whose environment names ``data_dir``."""
    marker = f"LAB_DATA_DIR={data_dir}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "environ").read_bytes() + b"\0":
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {command}")
        except OSError:
            continue
    return found


def run_demo(env: dict[str, str], *, timeout: float) -> subprocess.CompletedProcess:
    """Run the demo to its end; return its result with stdout and stderr together."""
    return subprocess.run(
        [sys.executable, "-m", "demo"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=timeout,
    )


class DemoProcess:
    """The demo running in the background, its output collected as it comes."""

    def __init__(self, env: dict[str, str]):
        self.data_dir = Path(env["LAB_DATA_DIR"])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "demo"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # Raw reads, not lines: a progress bar rewrites its line after a carriage return, and a
        # line reader would hold its latest state back until the bar draws again.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := os.read(self.process.stdout.fileno(), 65536):
            self.output.append(decoder.decode(chunk))

    @property
    def text(self) -> str:
        return "".join(self.output)

    def wait_for_output(self, needle: str, *, timeout: float) -> None:
        wait_for(
            lambda: needle in self.text or self.process.poll() is not None, timeout=timeout, what=f"{needle!r}"
        )
        assert needle in self.text, self.text[-3000:]

    def interrupt(self, *, timeout: float) -> int:
        """Press Ctrl-C (SIGINT) and return the exit status."""
        self.process.send_signal(signal.SIGINT)
        status = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return status

    def kill(self) -> None:
        """Kill the demo if it still runs, and whatever of Lab it started (after a failed check
        the demo never got to stop its processes: they must not outlive the test)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for process in processes_using(self.data_dir):
            try:
                os.kill(int(process.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def assert_nothing_left(data_dir: Path) -> None:
    """Every process of the run has exited (a few seconds' grace for the last to be reaped)."""
    deadline = time.monotonic() + 10
    while processes_using(data_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_using(data_dir) == []


def test_the_demo_runs_the_main_job_with_every_check_but_learning(tmp_path):
    data_dir = tmp_path / "data"
    # A password that looks like an option (generated ones start with "-" one time in 64).
    env = demo_environment(data_dir, DEMO_MODEL="lab/tiny-random-llama", DEMO_PASSWORD="-Zy-U3IRHA5U6yo7v")

    result = run_demo(env, timeout=600)

    output = result.stdout
    assert result.returncode == 0, output[-4000:]
    assert "demo@lab.localhost" not in output and "-Zy-U3IRHA5U6yo7v" not in output  # Lab stops right after
    assert "[PASS] job succeeded" in output
    assert "[n/a ] reward went up: not checked on lab/tiny-random-llama" in output
    assert "[PASS] final checkpoint loads with peft" in output
    assert "[PASS] webhooks verified, checkpoint.ready among them" in output
    assert "[PASS] usage recorded and priced: " in output
    assert "[FAIL]" not in output
    assert output.rstrip().endswith("Every check passed.")
    assert "  Rollouts    sampled with transformers (Lab's default on CPU: faster end to end here than vLLM" in output
    assert "  CLI, SDK " not in output and "  Dashboard " not in output
    # The checkpoint download has its own line and bar (tqdm, in the same decimal units as the summary).
    download = re.search(r"Downloading (ckpt_\w+) \(step 20, ([\d.]+ [kMG]B)\) \.\.\.", output)
    assert download, output[-4000:]
    assert f"{download.group(1)} (step 20, peft-lora, {download.group(2)})" in output
    webhook_lines = [line.split() for line in output.splitlines() if line.strip().startswith("Webhook ")]
    assert ["Webhook", "checkpoint.ready", "step", "20", "signature", "verified"] in webhook_lines
    assert ["Webhook", "job.succeeded", "signature", "verified"] in webhook_lines
    assert all(line[-2:] == ["signature", "verified"] for line in webhook_lines)
    # The embedded defaults were used: SQLite for the data and the broker, under the data dir.
    assert (data_dir / "lab.sqlite3").is_file()
    assert (data_dir / "celery-broker.sqlite3").is_file()
    checkpoint_dirs = list((data_dir / "demo").glob("job_*/ckpt_*"))
    assert len(checkpoint_dirs) == 1
    assert (checkpoint_dirs[0] / "adapter_config.json").is_file()
    assert_nothing_left(data_dir)


def test_ctrl_c_while_the_job_runs_cancels_it_and_stops_every_process_engine_included(tmp_path):
    data_dir = tmp_path / "data"
    env = demo_environment(data_dir, DEMO_MODEL="lab/tiny-random-llama", DEMO_MAX_STEPS="100000")
    del env["DEMO_EXIT"]
    demo = DemoProcess(env)
    try:
        demo.wait_for_output("Submitted job_", timeout=180)
        # Training has begun once the engine has spooled a step's metrics (the demo's bar is
        # not read: how it draws depends on the terminal).
        wait_for(lambda: any(data_dir.glob("runs/*/attempt-1/spool/attempt-1/metrics.jsonl")), timeout=120,
                 what="the engine's first metrics")
        running = processes_using(data_dir)
        assert any(" -m engine run " in process for process in running), running

        status = demo.interrupt(timeout=120)
    finally:
        demo.kill()

    assert status == 130, demo.text[-3000:]
    assert "is cancelled." in demo.text
    assert_nothing_left(data_dir)


def test_a_bad_setting_is_named_and_nothing_starts(tmp_path):
    data_dir = tmp_path / "data"
    env = demo_environment(data_dir, DEMO_MAX_STEPS="twenty")

    result = run_demo(env, timeout=60)

    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1] == "The demo stopped: DEMO_MAX_STEPS must be an integer, not 'twenty'"
    assert not data_dir.exists()


def test_a_model_lab_does_not_have_is_refused_at_submit_and_everything_stops(tmp_path):
    data_dir = tmp_path / "data"
    env = demo_environment(data_dir, DEMO_MODEL="acme/no-such-model")

    result = run_demo(env, timeout=300)

    assert result.returncode == 1, result.stdout[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("The demo stopped: ") and "acme/no-such-model" in last, result.stdout[-3000:]
    assert "Submitted" not in result.stdout
    assert not list(data_dir.glob("runs/*"))
    assert_nothing_left(data_dir)


def test_a_port_in_use_is_named_and_nothing_starts(tmp_path):
    import socket

    data_dir = tmp_path / "data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = demo_environment(data_dir, DEMO_PORT=str(busy.getsockname()[1]))

        result = run_demo(env, timeout=60)

    assert result.returncode == 1
    assert f"port {env['DEMO_PORT']} is in use" in result.stdout
    assert not (data_dir / "lab.sqlite3").exists()
    assert_nothing_left(data_dir)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"),
    reason="needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)",
)
def test_on_database_and_redis_urls_it_runs_on_them_and_after_the_summary_keeps_running_until_ctrl_c(tmp_path):
    import redis

    from jobs.models import Job
    from tests.support.stack import _database_url

    data_dir = tmp_path / "data"
    broker = os.environ.get("CELERY_BROKER_URL") or os.environ["REDIS_URL"]
    redis.Redis.from_url(broker).flushdb()
    env = demo_environment(
        data_dir,
        DEMO_MODEL="lab/tiny-random-llama",
        DEMO_MAX_STEPS="3",
        DATABASE_URL=_database_url(),
        REDIS_URL=os.environ["REDIS_URL"],
        CELERY_BROKER_URL=broker,
    )
    del env["DEMO_EXIT"]
    demo = DemoProcess(env)
    try:
        demo.wait_for_output("Ctrl-C stops everything", timeout=600)
        assert "Every check passed." in demo.text
        port = env["DEMO_PORT"]
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        # The printed export line points the CLI at the demo's project: it lists the demo's job.
        exported = re.search(r"export LAB_API_KEY=(lab_\S+) LAB_BASE_URL=(\S+)$", demo.text, re.M)
        assert exported and exported.group(2) == f"http://127.0.0.1:{port}", demo.text[-3000:]
        job_id = re.search(r"Submitted (job_\w+)", demo.text).group(1)
        cli = {**os.environ, "LAB_API_KEY": exported.group(1), "LAB_BASE_URL": exported.group(2)}
        listed = subprocess.run([str(Path(sys.executable).with_name("lab")), "jobs", "list", "--json"], env=cli,
                                capture_output=True, text=True, timeout=60, check=True)
        assert [job["id"] for job in json.loads(listed.stdout)] == [job_id]

        status = demo.interrupt(timeout=120)
    finally:
        demo.kill()

    assert status == 0, demo.text[-3000:]
    job = Job.objects.unscoped().get()
    assert (job.public_id, job.status, job.step, job.project.slug, job.project.organization.slug) == (job_id, "succeeded", 3, "demo", "demo")
    assert f"Job {job.public_id} (lab/tiny-random-llama, 3 steps) succeeded" in demo.text
    assert not (data_dir / "lab.sqlite3").exists()
    assert not (data_dir / "celery-broker.sqlite3").exists()
    assert_nothing_left(data_dir)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)


@pytest.mark.real_model
def test_the_demo_trains_smollm2_from_its_gguf_for_three_steps(tmp_path):
    data_dir = tmp_path / "data"
    # A model cache of its own, so the GGUF conversion (the real loading path) runs here.
    env = demo_environment(data_dir, DEMO_MAX_STEPS="3", LAB_MODEL_DIR=str(tmp_path / "models"))

    result = run_demo(env, timeout=1200)

    output = result.stdout
    assert result.returncode == 0, output[-4000:]
    assert "Job job_" in output and "(HuggingFaceTB/SmolLM2-135M-Instruct, 3 steps) succeeded" in output
    assert "[PASS] final checkpoint loads with peft" in output
    assert "peft.PeftModel.from_pretrained on HuggingFaceTB/SmolLM2-135M-Instruct" in output
    assert "[PASS] webhooks verified, checkpoint.ready among them" in output
    assert "[n/a ] reward went up: not checked: 3 steps with a reward, 10 needed" in output
    assert (tmp_path / "models" / "HuggingFaceTB" / "SmolLM2-135M-Instruct" / "config.json").is_file()
    assert_nothing_left(data_dir)
