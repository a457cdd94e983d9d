"""Benchmark: wall seconds until the main job learns, the figure a user feels.

Runs `examples/addition-smollm2.toml` (SmolLM2-135M-Instruct adding numbers up to 20) offline
with the engine, from before the model loads (so the inference backend's start-up counts), and
reports `engine_learning_s_to_reward_0_6`: the wall seconds at which the mean `reward/mean` of
the last `--window` steps first reaches `--target`, or null when it never does within the
spec's steps. Baseline: about 200 s, the transformers backend with one step of overlap on these
2-core machines before the engine's asynchrony and vLLM backend (docs/engine.md).

    python bench/engine_learning.py [--rollout transformers|vllm] [--max-off-policy-steps K] [--target 0.6] [--window 5] [--steps]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC = REPO_ROOT / "examples" / "addition-smollm2.toml"
BASELINE_S = 200.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollout", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--max-off-policy-steps", type=int, default=None, help="default: the spec's")
    parser.add_argument("--target", type=float, default=0.6)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--steps", action="store_true", help="print each step's figures to stderr")
    args = parser.parse_args()
    sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "sdk")]
    import torch
    from labsdk.spec import load_spec_file

    from engine.colocated import InProcessRollouts
    from engine.reporter import OfflineTransport, Reporter
    from engine.config import EngineConfig
    from engine.trainer import Trainer

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # as engine.cli does
    spec = load_spec_file(SPEC).spec
    if args.max_off_policy_steps is not None:
        spec = spec.model_copy(update={"max_off_policy_steps": args.max_off_policy_steps})
    started = time.perf_counter()
    reached: list[float] = []
    rewards: list[float] = []

    class Timing(Reporter):
        def metrics(self, step, values):
            super().metrics(step, values)
            if args.steps:
                shown = {k: round(v, 3) for k, v in values.items() if k.startswith(("reward/mean", "time/", "eval/", "seq_len/", "is_truncated/"))}
                print(f"{time.perf_counter() - started:7.1f}s step {step} {shown}", file=sys.stderr, flush=True)
            if "reward/mean" in values and step >= 1:
                rewards.append(values["reward/mean"])
                window = rewards[-args.window:]
                if not reached and len(window) == args.window and sum(window) / args.window >= args.target:
                    reached.append(time.perf_counter() - started)

    with tempfile.TemporaryDirectory() as workdir:
        workdir = pathlib.Path(workdir)
        reporter = Timing(OfflineTransport(workdir), job_id="bench", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
        reporter.start()
        trainer = Trainer(config=EngineConfig(spec=spec, overlap=True, rollout_backend=args.rollout), workdir=workdir, reporter=reporter, rollouts=InProcessRollouts())
        trainer.setup()
        try:
            trainer.run()
        finally:
            trainer.close()
        reporter.close("succeeded", timeout=10)
    total = time.perf_counter() - started
    value = round(reached[0], 1) if reached else None
    print(json.dumps({
        "name": "engine_learning_s_to_reward_0_6", "value": value, "unit": "s", "baseline": BASELINE_S,
        "ratio": round(value / BASELINE_S, 3) if value is not None else None, "rollout": args.rollout,
        "max_off_policy_steps": spec.max_off_policy_steps, "steps": len(rewards), "total_s": round(total, 1),
        "last_window_reward": round(sum(rewards[-args.window:]) / min(args.window, len(rewards)), 3) if rewards else None,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
