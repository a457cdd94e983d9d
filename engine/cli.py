"""The engine's command line (docs/api.md "Engine exit codes").

    python -m engine run --spec FILE --job-id ID --attempt N --lab-url URL --workdir DIR
                         [--offline] [--resume-from CKPT_ID_OR_DIR_OR_TAR] [--init-from CKPT_ID_OR_DIR_OR_TAR]
    python -m engine evaluate ...      (the same arguments: an evaluation job, engine/evaluation.py)
    python -m engine trainer ...       (the same arguments; LAB_ENGINE_SHARED_DIR)
    python -m engine orchestrator ...  (the same arguments; LAB_ENGINE_SHARED_DIR, LAB_ENGINE_INFERENCE_URL)
    python -m engine inference --model ID [--backend B] [--host H] [--port P] [--max-lora-rank R]
    python -m engine serve --model ID [--weights DIR] [--port P] [--max-adapters N]   (docs/serving.md)

The roles and the directory they share: docs/engine.md "Three roles"; `LAB_ENGINE_ROLES=process`
has `run` start the inference and orchestrator roles and train as the trainer role.

The job token comes from `LAB_JOB_TOKEN`, never from the command line; on the Kubernetes pool
(`LAB_JOB_BOOTSTRAP_TOKEN` set) the engine asks Lab for its attempt, token and resume point
first (docs/engine.md "Start-up on the Kubernetes pool"). Both are read once and taken out of the
environment, and the process is made non-dumpable, so that environment code (a separate process
of the same user) cannot read them (`_guard_credentials`). Exit codes:
0 finished all steps; 2 invalid spec, unknown model or environment, bad config (one line on
stderr, before step 0); 3 stopped after a checkpoint (SIGTERM or Lab's `action: stop`);
4 out of memory; 1 any other crash (Lab requeues and resumes).

Engine knobs that are not part of the spec come from the environment (engine/config.py, which
reads them):
`LAB_ENGINE_OVERLAP` (1/0: sample the next step while this one trains, when the spec's
max_off_policy_steps allows it; default 1), `LAB_ENGINE_MICRO_BATCH` (rollouts per forward/backward pass, default 16),
`LAB_ENGINE_THREADS` (torch intra-op threads; default on CPU: half the cores, so that with
overlap the sampler and the trainer each get their own, and because on a shared 2-core
machine two threads per op measured several times slower than one; on GPU torch's choice),
`LAB_ENGINE_ROLLOUT` (`transformers`, the default, or `vllm`: vLLM's CPU build here, its CUDA build on GPU pods),
`LAB_ENGINE_VLLM_DTYPE` (vLLM's compute dtype) and `LAB_ENGINE_VLLM_WEIGHTS` (`auto`, the default, `merged` or
`lora`: how a LoRA policy reaches vLLM after each update, engine.config.weights_format; docs/engine.md
"How new weights reach inference").
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pathlib
import signal
import sys
import warnings

from engine import config

config.hub_offline()  # before any subcommand's module loads transformers

from engine.commands.common import EXIT_INVALID, EXIT_SUCCEEDED, PR_SET_DUMPABLE, SERVING_TOKEN_VARIABLE, prctl  # noqa: E402

#: The variables that authenticate this engine to Lab (`_guard_credentials`).
CREDENTIAL_VARIABLES = ("LAB_JOB_TOKEN", "LAB_JOB_BOOTSTRAP_TOKEN", SERVING_TOKEN_VARIABLE)

#: Each command's module and the function in it that runs the command, imported only when that
#: command runs (as Django finds a management command by its name): the modules bring torch,
#: transformers and peft, so `--help` or a bad command line loads none of them, and a command
#: only its own. Every function takes the parsed arguments; those in `TAKES_CREDENTIALS` the
#: job's credentials too (`_guard_credentials`).
COMMANDS = {
    "run": ("engine.commands.run", "run"),
    "trainer": ("engine.commands.run", "run"),
    "evaluate": ("engine.commands.evaluate", "evaluate"),
    "orchestrator": ("engine.commands.orchestrator", "serve_orchestrator"),
    "inference": ("engine.commands.inference", "serve_inference"),
    "serve": ("engine.commands.serve", "serve"),
    "prepare-model": ("engine.commands.prepare_model", "prepare_model"),
}
TAKES_CREDENTIALS = frozenset({"run", "trainer", "evaluate", "serve"})


def _attempt_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `run` (and of the trainer and orchestrator roles, which take the same)."""
    parser.add_argument("--spec", required=True, type=pathlib.Path, help="job spec, .toml or .json")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--attempt", required=True, type=int)
    parser.add_argument("--lab-url", default=os.environ.get("LAB_PUBLIC_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--workdir", required=True, type=pathlib.Path)
    parser.add_argument("--offline", action="store_true", help="no Lab: write everything under the work dir")
    parser.add_argument(
        "--resume-from", help="a checkpoint directory, its .tar, or a checkpoint id of this job (ckpt_..., fetched from Lab)"
    )
    parser.add_argument(
        "--init-from",
        help="start from these weights only: a checkpoint id (ckpt_..., fetched from Lab), a directory "
        "or a .tar; default the spec's init_from. Ignored with --resume-from.",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Lab's RL engine")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one attempt of a job")
    trainer = commands.add_parser("trainer", help="the trainer role of an attempt (LAB_ENGINE_SHARED_DIR; docs/engine.md)")
    orchestrator = commands.add_parser(
        "orchestrator", help="the orchestrator role of an attempt (LAB_ENGINE_SHARED_DIR, LAB_ENGINE_INFERENCE_URL; docs/engine.md)"
    )
    evaluate = commands.add_parser("evaluate", help="run one attempt of an evaluation job: score a model, never train")
    for role in (run, evaluate, trainer, orchestrator):
        _attempt_arguments(role)
    inference = commands.add_parser("inference", help="serve one model over HTTP (the inference role; docs/engine.md)")
    inference.add_argument("--model", required=True, help="catalogue model id")
    inference.add_argument("--backend", choices=["transformers", "vllm"], help="default LAB_ENGINE_ROLLOUT, else the engine's default")
    inference.add_argument("--host", default=os.environ.get("LAB_INFERENCE_HOST", "127.0.0.1"))
    inference.add_argument("--port", type=int, default=int(os.environ.get("LAB_INFERENCE_PORT") or 8100))
    inference.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("var/inference"))
    inference.add_argument(
        "--tensor-parallel-size", type=int, default=1, metavar="GPUS",
        help="GPUs vLLM splits the model over (its tensor parallelism; the vllm backend on GPUs)",
    )
    inference.add_argument(
        "--max-lora-rank", type=int, default=0, metavar="R",
        help="the rank of the LoRA adapters trainers will send: vLLM applies them itself when "
        "LAB_ENGINE_VLLM_WEIGHTS (default auto) resolves to lora; 0 (default): merged weights only",
    )
    _serve_arguments(commands.add_parser(
        "serve", help="serve a model and its LoRA adapters behind an OpenAI-compatible API (docs/serving.md)"
    ))
    prepare = commands.add_parser(
        "prepare-model",
        help="put a catalogue model into the model cache if it must be converted first (SmolLM2 from its GGUF); "
        "the local launcher runs it outside the engine's sandbox, which sees the cache read-only",
    )
    prepare.add_argument("--model", required=True, help="catalogue model id")
    return parser


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `serve` (engine/commands/serve.py)."""
    parser.add_argument("--model", required=True, help="catalogue id of the base model")
    parser.add_argument("--weights", type=pathlib.Path, help="a full fine-tuned checkpoint's Hugging Face directory to serve instead of the base weights")
    parser.add_argument("--served-model", help="the name requests give as model (default: --model)")
    parser.add_argument("--backend", choices=["transformers", "vllm"], default="transformers",
                        help="vllm: vLLM with LoRA (its CPU build here, CUDA on GPUs); default transformers")
    parser.add_argument("--max-lora-rank", type=int, default=64, help="vllm: the highest adapter rank taken (default 64)")
    parser.add_argument("--workdir", type=pathlib.Path, help="vllm: where its caches go (default a temporary directory)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 (default): any free port")
    parser.add_argument("--address-file", type=pathlib.Path, help='write {"url": ...} here once listening')
    parser.add_argument("--max-adapters", type=int, default=4, help="adapters loaded at once (least recently used unloaded first)")


def _guard_credentials() -> dict[str, str]:
    """Keep Lab's job tokens out of environment code's reach; return them.

    Environment code runs in processes of the engine's own user (the verifiers bridge and the
    tool servers it starts, engine/environments/verifiers_bridge.py), and a process may read
    `/proc/<pid>/environ` of any dumpable process of its user. So every engine process makes
    itself non-dumpable (Linux `prctl(PR_SET_DUMPABLE, 0)`: its `/proc/<pid>/environ`, `mem`
    and `fd` become root's, and it writes no core dump), and takes `CREDENTIAL_VARIABLES` out of
    `os.environ`, so that no process it starts (roles, vLLM's engine process, the bridge)
    inherits them. The job's own secrets stay in the environment: the engine reads them when it
    needs them (a teacher's `api_key_var`, engine/distill.py).
    """
    prctl(PR_SET_DUMPABLE, 0)
    return {name: os.environ.pop(name) for name in CREDENTIAL_VARIABLES if name in os.environ}


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run; return the process exit code."""
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("transformers", "peft", "httpx", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The local launcher starts its sandbox with SIGTERM and SIGINT ignored (jobs/launchers/supervise.py),
    # and ignored signals stay ignored across exec: give them back their usual meaning, for this
    # process and every process it starts (roles, vLLM's engine processes, environment servers).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit:
        return EXIT_INVALID if exit.code else EXIT_SUCCEEDED
    credentials = _guard_credentials()
    if args.command not in COMMANDS:
        return EXIT_INVALID
    module, name = COMMANDS[args.command]
    command = getattr(importlib.import_module(module), name)
    return command(args, credentials) if args.command in TAKES_CREDENTIALS else command(args)
