"""Benchmark: what exporting an adapter artifact (`[adapters]`) costs the trainer, against a checkpoint.

On the tiny test model (`lab/tiny-random-llama`, built from its config, nothing downloaded)
with a LoRA of `--rank` (0: a full fine-tune), after one AdamW step so the optimizer has state,
each of `--repeats` rounds writes an adapter (`engine.checkpoints.save_adapter` + `write_tar`:
the weights alone) and a checkpoint (`save_checkpoint` + `write_tar`: weights, optimizer, RNG,
trainer state) into a temporary directory. Prints one JSON line per figure: `adapter_export_ms`
and `checkpoint_export_ms` (medians), `adapter_bytes`, `checkpoint_bytes`, and
`adapter_to_checkpoint_bytes` (the ratio).

    python bench/adapter_export.py [--rank 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sdk"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank; 0 = full fine-tune (default 16)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from engine import checkpoint_archives as archives
    from engine import checkpoints as ckpt
    from engine.models import tiny_random_llama
    from engine.policy import make_trainable

    base, tokenizer = tiny_random_llama()
    model = make_trainable(base, lora_rank=args.rank, lora_alpha=2 * max(args.rank, 1), base_model_id="lab/tiny-random-llama")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, tokenizer.vocab_size, (2, 16))
    model(input_ids=ids).logits.float().mean().backward()
    optimizer.step()
    fmt = ckpt.FORMAT_LORA if args.rank else ckpt.FORMAT_FULL
    state = ckpt.TrainerState(step=1, data_position=1, seed=0, spec_digest="bench", format=fmt)

    adapter_ms, checkpoint_ms = [], []
    with tempfile.TemporaryDirectory(prefix="lab-bench-adapters-") as root:
        root = pathlib.Path(root)
        for index in range(args.repeats):
            started = time.perf_counter()
            directory = ckpt.save_adapter(root / f"adapter-{index}", model=model, tokenizer=tokenizer)
            adapter_bytes, _ = archives.write_tar(directory, root / f"adapter-{index}.tar")
            adapter_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            directory = ckpt.save_checkpoint(root / f"checkpoint-{index}", model=model, tokenizer=tokenizer, optimizer=optimizer, state=state)
            checkpoint_bytes, _ = archives.write_tar(directory, root / f"checkpoint-{index}.tar")
            checkpoint_ms.append((time.perf_counter() - started) * 1000)
    common = {"model": "lab/tiny-random-llama", "lora_rank": args.rank, "repeats": args.repeats}
    for name, value, unit in (
        ("adapter_export_ms", round(statistics.median(adapter_ms), 2), "ms"),
        ("checkpoint_export_ms", round(statistics.median(checkpoint_ms), 2), "ms"),
        ("adapter_bytes", adapter_bytes, "bytes"),
        ("checkpoint_bytes", checkpoint_bytes, "bytes"),
        ("adapter_to_checkpoint_bytes", round(adapter_bytes / checkpoint_bytes, 4), "ratio"),
    ):
        print(json.dumps({"name": name, "value": value, "unit": unit, **common}))


if __name__ == "__main__":
    main()
