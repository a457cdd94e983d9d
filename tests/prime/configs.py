"""prime-rl native-layout configs on the tiny model, as ``prime train`` submits them."""

from __future__ import annotations

import tomllib

#: A two-step LoRA run of the tiny model on lab/addition in prime-rl's own layout.
TINY_RL_TOML = """\
name = "prime-tiny"
max_steps = 2

[model]
name = "lab/tiny-random-llama"

[model.lora]
rank = 4
alpha = 8

[orchestrator]
batch_size = 8
rollouts_per_example = 4
seed = 3

[orchestrator.sampling]
max_tokens = 6
temperature = 1.0

[[orchestrator.env]]
id = "lab/addition"
args = { max_operand = 9 }

[trainer.optim]
lr = 1e-2

[ckpt]
interval = 2
keep_last = 1
"""

#: Three problems at once: an environment Lab does not have, a temperature out of range and a
#: batch that is no multiple of the group size.
BAD_RL_TOML = TINY_RL_TOML.replace('id = "lab/addition"', 'id = "primeintellect/reverse-text"').replace(
    "temperature = 1.0", "temperature = 9.0"
).replace("batch_size = 8", "batch_size = 10")


def tiny_config() -> dict:
    """The decoded ``TINY_RL_TOML``."""
    return tomllib.loads(TINY_RL_TOML)
