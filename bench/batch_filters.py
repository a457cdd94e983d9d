"""Benchmark: what the rollout filters (engine/filters.py) cost per step, on a large batch.

A synthetic batch (no model): `--rollouts` completions of `--tokens` random token ids from a
32k vocabulary, with sampler log-probabilities and decoded-looking text, in groups of
`--group-size`; a quarter of the groups have equal rewards. Each filter type runs with its
default settings (labsdk.spec.model.FILTER_SETTINGS), then all three together, as pre filters
before the advantages are computed. Prints one JSON line per figure:
`batch_filters_<type>_ms` and `batch_filters_all_ms` (median of `--repeats` runs).

    python bench/batch_filters.py [--rollouts 1024] [--tokens 512] [--group-size 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sdk"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from engine.filters import Rollouts, apply_filters
    from engine.grpo import group_advantages
    from labsdk.spec.model import FILTER_SETTINGS, BatchFilterConfig

    rng = random.Random(0)
    groups = args.rollouts // args.group_size
    rewards = []
    for group in range(groups):
        equal = group % 4 == 0
        rewards += [1.0 if equal else rng.random() for _ in range(args.group_size)]
    rollouts = Rollouts(
        rewards=rewards,
        token_ids=[[rng.randrange(32_000) for _ in range(args.tokens)] for _ in rewards],
        logprobs=[[-rng.random() * 3 for _ in range(args.tokens)] for _ in rewards],
        texts=["".join(rng.choice("abcdefgh ij\n") for _ in range(args.tokens * 4)) for _ in rewards],
        group_size=args.group_size,
    )

    def timed(filters) -> float:
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            keep, _ = apply_filters(filters, rollouts, [True] * len(rewards))
            group_advantages(torch.tensor(rewards), args.group_size, keep=torch.tensor(keep))
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    shape = f"{args.rollouts} rollouts x {args.tokens} tokens"
    every = [BatchFilterConfig.model_validate({"type": kind}) for kind in FILTER_SETTINGS]
    for config in every:
        print(json.dumps({"name": f"batch_filters_{config.type}_ms", "value": round(timed([config]), 2), "unit": "ms",
                          "baseline": None, "ratio": None, "batch": shape}))
    print(json.dumps({"name": "batch_filters_all_ms", "value": round(timed(every), 2), "unit": "ms",
                      "baseline": None, "ratio": None, "batch": shape}))


if __name__ == "__main__":
    main()
