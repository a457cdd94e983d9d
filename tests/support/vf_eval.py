"""verifiers' own ``vf-eval`` of both generations, run for real against the engine's serving role
on the tiny model, so that tests read the files verifiers itself writes.

- ``serving_url``: ``python -m engine serve`` on ``lab/tiny-random-llama`` (an OpenAI-compatible
  API, streamed or not: verifiers 0.4 streams), on a free port.
- ``legacy_verifiers_python``: a virtual environment with verifiers 0.3.1 (``load_environment``,
  ``verifiers.legacy``), installed by uv offline from the local package index
  (``make package-index``).
- ``run_legacy_vf_eval`` / ``run_v1_vf_eval``: one run each, returning its run folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_INDEX = REPO / "var" / "package-index"
VERIFIERS_PYTHON = REPO / ".venv-verifiers" / "bin" / "python"
#: verifiers 0.4's example taskset (examples/environments/shout-word), importable from its source.
SHOUT_WORD_SOURCE = REPO / "examples" / "environments" / "shout-word" / "src"
MODEL = "lab/tiny-random-llama"

#: A verifiers 0.3 ``load_environment`` environment: "what comes after N?", scored by a rubric of
#: two functions (``brief`` gives the tiny model's replies rewards other than 0).
TINY_COUNT = '''"""Say the number after the given one."""
import verifiers as vf
from datasets import Dataset


def correct(completion, answer, **kwargs) -> float:
    return 1.0 if completion[-1]["content"].strip() == answer else 0.0


def brief(completion, **kwargs) -> float:
    return max(0.0, 1.0 - len(completion[-1]["content"]) / 40)


def load_environment(num_examples: int = 10, **kwargs) -> vf.Environment:
    dataset = Dataset.from_list([{"question": f"What comes after {n}?", "answer": str(n + 1)} for n in range(num_examples)])
    return vf.SingleTurnEnv(
        dataset=dataset, eval_dataset=dataset, system_prompt="Answer with a number.",
        rubric=vf.Rubric(funcs=[correct, brief], weights=[1.0, 0.5]), **kwargs,
    )
'''


@contextmanager
def serving_url(root: Path, *, model: str = MODEL, threads: int = 1) -> Iterator[str]:
    """Run ``python -m engine serve`` on ``model`` (its work files under ``root``) and yield its
    base URL (``http://127.0.0.1:PORT``); stop it after."""
    root.mkdir(parents=True, exist_ok=True)
    address = root / "address.json"
    environment = {
        **os.environ, "LAB_MODEL_DIR": os.environ.get("LAB_MODEL_DIR", str(root / "models")),
        "LAB_ENGINE_THREADS": str(threads), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'sdk'}",
    }
    log = (root / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--model", model, "--address-file", str(address)],
        cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while not (address.is_file() and address.stat().st_size):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the serving role did not start: {(root / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield json.loads(address.read_text())["url"]
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def legacy_verifiers_python(root: Path) -> Path:
    """Make a virtual environment with verifiers 0.3.1 under ``root`` (uv, offline, from the local
    package index) and return its Python."""
    if not (PACKAGE_INDEX / ".filled").is_file():
        raise AssertionError("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    venv = root / "verifiers-0.3.1"
    uv = [str(Path(sys.executable).with_name("uv"))]
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, capture_output=True, timeout=120)
    subprocess.run(
        [*uv, "pip", "install", "-q", "--offline", "--no-index", "--find-links", str(PACKAGE_INDEX / "files"), "verifiers==0.3.1"],
        check=True, capture_output=True, timeout=600, env={**os.environ, "VIRTUAL_ENV": str(venv)},
    )
    return venv / "bin" / "python"


def run_legacy_vf_eval(python: Path, base_url: str, root: Path, *, num_examples: int, rollouts: int,
                       max_tokens: int = 8, temperature: float = 0.7, max_concurrent: int = 32,
                       module: str = "tiny_count", source: str = TINY_COUNT, env_args: dict | None = None) -> Path:
    """Run verifiers 0.3's ``vf-eval`` (``verifiers.legacy.scripts.eval``) on ``module`` (written
    from ``source`` under ``root``) against ``base_url``, saving its results; return the run folder."""
    modules = root / "modules"
    modules.mkdir(parents=True, exist_ok=True)
    (modules / f"{module}.py").write_text(source)
    output = root / "outputs"
    command = [
        str(python.with_name("vf-eval")), module, "-m", MODEL, "-b", f"{base_url}/v1", "-k", "LAB_VF_EVAL_KEY",
        "-n", str(num_examples), "-r", str(rollouts), "--max-tokens", str(max_tokens), "--temperature", str(temperature),
        "--max-concurrent", str(max_concurrent), "--save-results", "--output-dir", str(output), "--disable-tui",
        "-a", json.dumps(env_args or {"num_examples": num_examples}),
    ]
    done = subprocess.run(
        command, cwd=root, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(modules), "LAB_VF_EVAL_KEY": "unused"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (folder,) = output.glob("evals/*/*")
    return folder


def run_v1_vf_eval(base_url: str, root: Path, *, num_examples: int, rollouts: int, max_tokens: int = 8,
                   temperature: float = 0.7, max_concurrent: int = 32) -> Path:
    """Run verifiers 0.4's ``vf-eval`` (``verifiers.v1.cli.eval``) on the shout-word taskset against
    ``base_url`` (its null harness in a subprocess runtime: one chat call per task, nothing
    tunnelled, nothing pushed to Prime); return the run folder."""
    output = root / "outputs"
    root.mkdir(parents=True, exist_ok=True)
    command = [
        str(VERIFIERS_PYTHON.with_name("vf-eval")), "shout-word", "-m", MODEL, "-n", str(num_examples), "-r", str(rollouts),
        "-c", str(max_concurrent), "--client.base-url", f"{base_url}/v1", "--client.api-key-var", "LAB_VF_EVAL_KEY",
        "--sampling.max-tokens", str(max_tokens), "--sampling.temperature", str(temperature), "--no-push", "--no-rich",
        "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "null", "-o", str(output), "--run.dir", "run",
    ]
    done = subprocess.run(
        command, cwd=root, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(SHOUT_WORD_SOURCE), "LAB_VF_EVAL_KEY": "unused", "HOME": str(root)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return output / "run"
