"""`python -m engine prepare-model`: put a catalogue model into the model cache ahead of a job."""

from __future__ import annotations

import argparse
import sys

from engine.catalog import SMOLLM2_ID
from engine.commands.common import EXIT_INVALID, EXIT_SUCCEEDED
from engine.models import ModelNotFound, convert_smollm2


def prepare_model(args: argparse.Namespace) -> int:
    """Convert ``args.model`` into the model cache when it is built from a file Lab ships (SmolLM2);
    a no-op for every other model and once converted. Exit 2 (model_not_found) when it cannot."""
    if args.model != SMOLLM2_ID:
        return EXIT_SUCCEEDED
    try:
        convert_smollm2()
    except ModelNotFound as error:
        sys.stderr.write(f"model_not_found: {error}\n")
        return EXIT_INVALID
    return EXIT_SUCCEEDED
