"""`python -m engine prepare-model`: put a catalogue model into the model cache ahead of a job."""

from __future__ import annotations

import argparse
import sys

from engine.catalog import SMOLLM2_ID
from engine.commands.common import EXIT_CRASHED, EXIT_INVALID, EXIT_SUCCEEDED, one_line
from engine.model_store import StoredModelError, prepare_job_model
from engine.models import ModelNotFound, convert_smollm2


def prepare_model(args: argparse.Namespace) -> int:
    """Put ``args.model`` into the model cache: the job's stored model (``LAB_JOB_MODEL``,
    fetched from Lab's storage: engine.model_store), or SmolLM2 converted from its GGUF; a no-op
    for every other model and once done. Exit 2 (model_not_found) when it cannot, 1 when storage
    cannot be reached."""
    try:
        if prepare_job_model() is not None:
            return EXIT_SUCCEEDED
    except StoredModelError as error:
        sys.stderr.write(f"model_not_found: {one_line(error)}\n")
        return EXIT_CRASHED if error.retryable else EXIT_INVALID
    if args.model != SMOLLM2_ID:
        return EXIT_SUCCEEDED
    try:
        convert_smollm2()
    except ModelNotFound as error:
        sys.stderr.write(f"model_not_found: {error}\n")
        return EXIT_INVALID
    return EXIT_SUCCEEDED
