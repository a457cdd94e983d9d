"""prime-rl native-layout configs on the tiny model, as ``prime train`` submits them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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


DATA = Path(__file__).resolve().parents[1] / "sdk" / "data" / "prime"


TEMPLATE = (DATA / "rl.toml").read_text()


INSTALLED_MODEL = "lab/tiny-random-llama"


def installed(text: str) -> str:
    """Point the model and environment ids of a Prime file at ones Lab has installed."""
    text = re.sub(r'^model = ".*"', f'model = "{INSTALLED_MODEL}"', text, flags=re.M)
    text = text.replace('"primeintellect/reverse-text"', '"lab/reverse-text"')
    text = text.replace('"primeintellect/another-env"', '"lab/addition"')
    text = text.replace('"primeintellect/eval-env"', '"lab/alphabet-sort"')
    return text


def uncomment_everything(template: str) -> str:
    """Uncomment every optional line of Prime's template, following its own instructions: loss
    becomes "sft" for the [teacher] block, and of the two mutually exclusive reasoning controls
    of [sampling] only the first is kept; the checkpoint id gets a Lab-shaped value."""
    lines = []
    for line in template.splitlines():
        match = re.match(r"^# (\[.*|[a-z_]+ = .*)$", line)
        lines.append(match.group(1) if match else line)
    text = "\n".join(lines) + "\n"
    text = text.replace('loss = "rl"', 'loss = "sft"', 1)
    text = text.replace('reasoning_effort = "high"  # supported models: GPT-OSS', '# reasoning_effort = "high"')
    return text.replace('checkpoint_id = "..."', 'checkpoint_id = "ckpt_3fA9"')
