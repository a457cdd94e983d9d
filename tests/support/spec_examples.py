"""Specs shared by the SDK tests: the smallest valid one, docs/spec.md's example, and a Prime
Intellect hosted-training file that uses only Prime's keys."""

MINIMAL = {"model": "lab/tiny-random-llama", "env": [{"id": "lab/addition"}]}

DESIGN_EXAMPLE_TOML = """
name = "addition-smollm2"
model = "HuggingFaceTB/SmolLM2-135M-Instruct"
max_steps = 20
batch_size = 32
rollouts_per_example = 4
learning_rate = 5e-4
lora_alpha = 32
lora_rank = 16
seed = 0
max_restarts = 2
max_off_policy_steps = 1
priority = "normal"
max_runtime_minutes = 600
init_from = "ckpt_3fA9"
[sampling]
max_tokens = 24
temperature = 1.0
[[env]]
id = "lab/addition"
args = { max_operand = 20 }
[eval]
interval = 5
num_examples = 32
[checkpoints]
interval = 5
keep_last = 3
[resources]
gpu_type = "cpu"
gpus = 0
[metadata]
team = "research"
"""

PRIME_ONLY_TOML = """
model = "HuggingFaceTB/SmolLM2-135M-Instruct"
max_steps = 100
batch_size = 256
rollouts_per_example = 8
learning_rate = 1e-4
lora_alpha = 16
oversampling_factor = 1.5
max_async_level = 2
trajectory_strategy = "interleaved"
env_files = ["secrets.env"]

[sampling]
max_tokens = 512
enable_thinking = false

[[env]]
id = "lab/addition"
args = { max_operand = 50 }

[wandb]
project = "lab-runs"
name = "addition"
"""
