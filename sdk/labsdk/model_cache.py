"""Where a machine keeps base models: the local model cache, one Hugging Face directory per
catalogue id (``<cache>/<owner>/<name>``), the layout Lab's engine and a GPU pod's model volume
use. Nothing here downloads (``lab.checkpoints.load`` fetches a missing base model from Lab)."""

from __future__ import annotations

import os
from pathlib import Path


def model_cache_dir() -> Path:
    """Return this user's model cache: ``LAB_MODEL_DIR``, else ``~/.cache/lab/models``. (Lab's own
    server keeps its cache where its settings say, ``LAB_DATA_DIR/models`` by default.)"""
    if os.environ.get("LAB_MODEL_DIR"):
        return Path(os.environ["LAB_MODEL_DIR"])
    return Path.home() / ".cache" / "lab" / "models"


def model_path(model_id: str, model_dir: str | Path | None = None) -> Path:
    """Return the directory of catalogue id ``model_id`` (``owner/name``) in ``model_dir``
    (default :func:`model_cache_dir`). Raises ValueError for an id that is not ``owner/name``."""
    owner, slash, name = model_id.partition("/")
    if not slash or not owner or not name or "/" in name or ".." in (owner, name):
        raise ValueError(f"a catalogue id is owner/name, not {model_id!r}")
    return Path(model_dir or model_cache_dir()) / owner / name
