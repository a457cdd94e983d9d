"""`python -m engine run` as a subprocess: exit codes, offline outputs, SIGTERM, reporting to Lab."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.engine_cli import engine, finish

from .conftest import REPO_ROOT, write_spec

METRIC_NAMES = {
    "reward/mean", "reward/std", "reward/reverse-text/mean", "reward/reverse-text/lcs_ratio/mean",
    "reward/reverse-text/exact/mean", "loss/mean", "optim/grad_norm", "optim/lr", "seq_len/mean",
    "is_truncated/mean", "perf/tokens_per_s", "time/step", "time/generate", "time/train",
}


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"batch_size": 6}, "batch_size"),
        ({"model": "acme/missing"}, "model 'acme/missing' is not in the catalogue"),
        ({"env": [{"id": "primeintellect/reverse-text"}]}, "not installed"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_it_exits_2_with_one_line_for_a_bad_spec(tmp_path, overrides, needle):
    spec = write_spec(tmp_path / "spec.json", **overrides)
    code, _, stderr = finish(engine(["--spec", str(spec)], tmp_path))
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1
    assert stderr.startswith("engine: ") and needle in stderr
    assert json.loads((tmp_path / "work" / "finish.json").read_text())["outcome"] == "failed"


#: Runs the engine's `main` in a fresh interpreter, then prints its exit code and which of the
#: heavy libraries it imported, as JSON.
_LOADED = (
    "import json, sys\nfrom engine.cli import main\ncode = main(sys.argv[1:])\n"
    "print(json.dumps([code, [name for name in ('torch', 'transformers', 'peft') if name in sys.modules]]))\n"
)


def _loaded(arguments: list[str], tmp_path) -> tuple[int, list[str]]:
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}"}
    command = [sys.executable, "-c", _LOADED, *arguments]
    done = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120, check=True)
    code, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return code, loaded


def test_it_refuses_a_spec_before_it_loads_transformers_and_peft(tmp_path):
    spec = write_spec(tmp_path / "spec.json", batch_size=6)
    arguments = ["run", "--spec", str(spec), "--job-id", "job_1", "--attempt", "1", "--workdir", str(tmp_path / "work"), "--offline"]
    code, loaded = _loaded(arguments, tmp_path)
    assert code == 2 and "transformers" not in loaded and "peft" not in loaded
    assert _loaded(["--help"], tmp_path) == (0, [])


def test_an_evaluation_spec_without_eval_environments_is_refused_before_the_model_loads(tmp_path):
    spec = write_spec(tmp_path / "spec.json", eval={"interval": 0, "num_examples": 2})
    arguments = ["evaluate", "--spec", str(spec), "--job-id", "job_1", "--attempt", "1", "--workdir", str(tmp_path / "work"), "--offline"]
    code, loaded = _loaded(arguments, tmp_path)
    assert code == 2 and "transformers" not in loaded
    finished = json.loads((tmp_path / "work" / "finish.json").read_text())
    assert finished["outcome"] == "failed" and "[[eval.env]]" in finished["error"]["message"]


def test_it_exits_2_without_a_job_token_when_online(tmp_path):
    spec = write_spec(tmp_path / "spec.json")
    process = engine(["--spec", str(spec), "--lab-url", "http://127.0.0.1:9"], tmp_path, offline=False, env={"LAB_JOB_TOKEN": ""})
    code, _, stderr = finish(process)
    assert code == 2 and "LAB_JOB_TOKEN" in stderr


def test_it_runs_three_offline_steps_on_the_tiny_model(tmp_path):
    spec = write_spec(tmp_path / "spec.json", eval={"interval": 3, "num_examples": 4})
    code, _, stderr = finish(engine(["--spec", str(spec)], tmp_path))
    assert code == 0, stderr
    work = tmp_path / "work"
    points = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    # Step 0 is the base model's eval (eval.skip_first_step is not set), alone.
    assert [p["step"] for p in points] == [0, 1, 2, 3]
    assert set(points[0]["values"]) == {"eval/reverse-text/mean", "eval/reverse-text/lcs_ratio/mean", "eval/reverse-text/exact/mean"}
    points = points[1:]
    assert METRIC_NAMES <= set(points[0]["values"])
    assert "eval/reverse-text/mean" in points[2]["values"]
    samples = [json.loads(line) for line in (work / "samples.jsonl").read_text().splitlines()]
    assert {"step", "group", "prompt", "completion", "reward", "advantage", "metrics"} <= set(samples[0])
    checkpoints = [json.loads(line) for line in (work / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["step"] for c in checkpoints] == [2, 3]
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["step-000002", "step-000002.tar", "step-000003", "step-000003.tar"]
    final = work / "checkpoints" / "step-000003"
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "trainer_state"} <= {p.name for p in final.iterdir()}
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == "lab/tiny-random-llama"
    # The model card replaces peft's empty template: the catalogue id, the job, the step, its reward, the spec.
    card = (final / "README.md").read_text()
    assert card.startswith('---\nbase_model: "lab/tiny-random-llama"\nlibrary_name: peft\n')
    assert "after step 3 of 3" in card and "**This is a test model.**" in card
    assert f"| `reward/mean` | {points[2]['values']['reward/mean']:.4g} |" in card
    assert json.loads(card.split("```json\n")[1].split("```")[0])["model"] == "lab/tiny-random-llama"
    assert json.loads((work / "finish.json").read_text()) == {"attempt": 1, "outcome": "succeeded"}

    # A second attempt resumed from the step-2 archive repeats step 3 exactly (times aside).
    resumed_dir = tmp_path / "attempt2"
    resumed_dir.mkdir()
    code, _, stderr = finish(engine(["--spec", str(spec), "--resume-from", str(work / "checkpoints" / "step-000002.tar")], resumed_dir))
    assert code == 0, stderr
    resumed = [json.loads(line) for line in (resumed_dir / "work" / "metrics.jsonl").read_text().splitlines()]
    assert [p["step"] for p in resumed] == [3]
    varying = ("time/", "perf/")  # times and throughput
    assert {k: v for k, v in resumed[0]["values"].items() if not k.startswith(varying)} == {k: v for k, v in points[2]["values"].items() if not k.startswith(varying)}


def test_it_checkpoints_and_exits_3_on_sigterm(tmp_path):
    spec = write_spec(tmp_path / "spec.json", max_steps=500, checkpoints={"interval": 0, "keep_last": 1})
    process = engine(["--spec", str(spec)], tmp_path)
    metrics = tmp_path / "work" / "metrics.jsonl"
    deadline = time.monotonic() + 90
    while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    code, _, stderr = finish(process)
    assert code == 3, stderr
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    last = steps[-1]
    assert last < 500
    state = json.loads((tmp_path / "work" / "checkpoints" / f"step-{last:06d}" / "trainer_state" / "state.json").read_text())
    assert state["step"] == last
    assert json.loads((tmp_path / "work" / "finish.json").read_text())["outcome"] == "stopped"


def test_it_reports_to_lab_and_stops_when_lab_says_stop(tmp_path, fake_lab):
    spec = write_spec(tmp_path / "spec.json", max_steps=500, checkpoints={"interval": 0, "keep_last": 1})
    process = engine(["--spec", str(spec), "--lab-url", fake_lab.url], tmp_path, offline=False, env={"LAB_JOB_TOKEN": fake_lab.token})
    deadline = time.monotonic() + 90
    while not fake_lab.metrics and time.monotonic() < deadline:
        time.sleep(0.1)
    fake_lab.action = "stop"
    code, _, stderr = finish(process)
    assert code == 3, stderr
    assert fake_lab.finish == [{"attempt": 1, "outcome": "stopped"}]
    assert sorted(fake_lab.metric_arrivals) == list(range(1, len(fake_lab.metric_arrivals) + 1))
    assert set(fake_lab.metric_arrivals.values()) == {1}
    (checkpoint,) = fake_lab.checkpoints.values()
    assert checkpoint["status"] == "ready" and checkpoint["step"] == max(fake_lab.metrics)
    assert any("loaded lab/tiny-random-llama" in line for line in fake_lab.logs.values())
    assert fake_lab.statuses and fake_lab.statuses[0]["attempt"] == 1
