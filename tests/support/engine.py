"""Engine runs, trainers and a teacher server that several engine test modules share."""

import json
import os
import re
import subprocess
import sys

import pytest

from engine.colocated import InProcessRollouts
from engine.reporter import OfflineTransport, Reporter
from engine.trainer import Trainer
from tests.engine.conftest import REPO_ROOT, engine_config

MODEL = "lab/tiny-random-llama"


@pytest.fixture
def teacher_server(tmp_path):
    """`python -m engine inference` on the tiny model, as the docs start it, on a free port."""
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "engine", "inference", "--model", MODEL, "--backend", "transformers", "--port", "0",
         "--workdir", str(tmp_path / "teacher")],
        cwd=REPO_ROOT, env=environment, stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in process.stderr:
            found = re.search(r"serving .* on (http://\S+)", line)
            if found:
                yield found.group(1)
                break
        else:
            pytest.fail(f"the inference server did not start (exit {process.wait()})")
    finally:
        process.terminate()
        process.wait(timeout=30)


def trainer_for(workdir, spec, **engine_settings):
    reporter = Reporter(OfflineTransport(workdir), job_id="job_1", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
    trainer = Trainer(config=engine_config(spec, **engine_settings), workdir=workdir, reporter=reporter, rollouts=InProcessRollouts())
    trainer.setup()
    return trainer, reporter


# Times and throughput (time/*, perf/*) differ between runs; everything else must match exactly.
NONDETERMINISTIC_PREFIXES = ("time/", "perf/")


class StoppingReporter(Reporter):
    """Requests a stop (as SIGTERM would) once the metrics of `stop_after` are reported."""

    stop_after = None

    def metrics(self, step, values):
        super().metrics(step, values)
        if step == self.stop_after:
            self.stop_requested.set()


def train(workdir, config, resume_from=None, stop_after=None):
    reporter = StoppingReporter(OfflineTransport(workdir), job_id="job_1", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
    reporter.stop_after = stop_after
    reporter.start()
    trainer = Trainer(config=config, workdir=workdir, reporter=reporter, rollouts=InProcessRollouts())
    try:
        trainer.setup()
        if resume_from is not None:
            trainer.resume(resume_from)
        outcome = trainer.run()
    finally:
        trainer.close()  # an inference role it started (engine/remote_inference.py) stops too
    assert outcome == ("stopped" if stop_after else "succeeded")
    reporter.close(outcome, timeout=10)
    points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {p["step"]: {k: v for k, v in p["values"].items() if not k.startswith(NONDETERMINISTIC_PREFIXES)} for p in points}


