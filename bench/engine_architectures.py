"""Benchmark: the seconds of one GRPO step of the tiny mixture-of-experts model beside the tiny
dense Qwen3 of about the same total size (81,088 and 80,576 parameters), in the same run.

Each model trains `--steps` steps in process (transformers rollouts, one torch thread, no
overlap, LoRA rank 4 or full weights), the two models one after the other for each mode; the
figure is the median of the steps' `time/step` after the first. Prints one JSON line per model
and mode: `engine_step_s` with `model` and `mode`.

    python bench/engine_architectures.py [--steps 6] [--modes lora,full]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sdk"))

MODELS = ("lab/tiny-random-qwen3", "lab/tiny-random-qwen3-moe")


def step_seconds(model_id: str, mode: str, steps: int, workdir: pathlib.Path) -> list[float]:
    """Train `model_id` for `steps` steps; return each step's `time/step` (seconds)."""
    from labsdk.spec import parse_spec

    from engine.colocated import InProcessRollouts
    from engine.config import EngineConfig
    from engine.reporter import OfflineTransport, Reporter
    from engine.trainer import Trainer

    spec = {
        "model": model_id, "max_steps": steps, "batch_size": 16, "rollouts_per_example": 4, "learning_rate": 1e-3,
        "lora_rank": 4 if mode == "lora" else 0, "lora_alpha": 8, "seed": 0,
        "sampling": {"max_tokens": 16, "temperature": 1.0},
        "env": [{"id": "lab/reverse-text", "args": {"min_length": 3, "max_length": 6}}],
        "checkpoints": {"interval": 0, "keep_last": 1}, "eval": {"interval": 0, "num_examples": 4},
    }
    reporter = Reporter(OfflineTransport(workdir), job_id="bench", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
    reporter.start()
    trainer = Trainer(config=EngineConfig(spec=parse_spec(spec).spec, overlap=False), workdir=workdir, reporter=reporter,
                      rollouts=InProcessRollouts())
    try:
        trainer.setup()
        trainer.run()
    finally:
        trainer.close()
        reporter.close("succeeded", timeout=10)
    points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [p["values"]["time/step"] for p in sorted(points, key=lambda p: p["step"]) if "time/step" in p["values"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--modes", default="lora,full")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-architectures-") as root:
        for mode in args.modes.split(","):
            for model_id in MODELS:
                seconds = step_seconds(model_id, mode, args.steps, pathlib.Path(root) / f"{model_id.replace('/', '-')}-{mode}")
                print(json.dumps({"name": "engine_step_s", "value": round(statistics.median(seconds[1:] or seconds), 4),
                                  "unit": "s", "model": model_id, "mode": mode, "steps": len(seconds)}), flush=True)


if __name__ == "__main__":
    main()
