"""The model registry (docs/models.md): its rows (``jobs.registry.models``), the operator's and
the organizations' ways to add a model (``services``, ``hub``, ``checks``, ``store``,
``builds``), and here the rows of the engine's catalogue (``engine.catalog.list_models``).

``sync_models`` writes one ``jobs.models.Model`` row, offered to everyone, for each built-in and
each Hugging Face directory an operator placed in ``LAB_MODEL_DIR/<owner>/<name>``; it runs after
every ``migrate`` (and after a test's flush, which sends the same signal) and from
``manage.py models sync``. It is idempotent: a second run changes nothing. A row that an
organization owns, or one whose files Lab stores, is never overwritten by the catalogue.

Imports no model class: the migration signal hands it the historical one, so this module can be
imported by ``jobs.apps`` before the app registry is ready.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from django.conf import settings

from engine.catalog import LORA_TARGET_MODULES, SMOLLM2_ID, ModelInfo, list_models

#: The training modes the engine offers every catalogue model (LoRA and full fine-tuning).
TRAINING_MODES = ("lora", "full")

#: GPU bytes per parameter in each mode: LoRA keeps the frozen weights in bf16 (2 bytes; the
#: adapter and its optimizer state are a small fraction); full fine-tuning with AdamW in mixed
#: precision holds bf16 weights and gradients (2 + 2) and fp32 master weights and both moments
#: (4 + 4 + 4), 16 bytes.
BYTES_PER_PARAMETER = {"lora": 2, "full": 16}

#: Headroom over the weights and optimizer state for activations, the KV cache and the CUDA
#: context.
MEMORY_OVERHEAD = 1.2

#: Licences of the built-ins that ship one (the Hugging Face licence identifier).
_LICENCES = {SMOLLM2_ID: "apache-2.0"}


def memory_estimate_gb(parameters: int | None) -> dict[str, float]:
    """Return the estimated GPU memory of each training mode in GB (10^9 bytes), rounded up to
    0.1: ``parameters × BYTES_PER_PARAMETER[mode] × MEMORY_OVERHEAD / 1e9``. Mixture-of-experts
    models count every expert (all stay resident), so ``parameters`` is the total. Empty when
    ``parameters`` is unknown."""
    if not parameters:
        return {}
    return {
        mode: math.ceil(parameters * BYTES_PER_PARAMETER[mode] * MEMORY_OVERHEAD / 1e8) / 10
        for mode in TRAINING_MODES
    }


def family_of(architecture: str | None) -> str:
    """Return the family of a transformers ``model_type``: ``qwen3`` for ``qwen3`` and
    ``qwen3_moe``; "" when unknown."""
    return (architecture or "").removesuffix("_moe")


def _has_chat_template(directory: Path) -> bool:
    """Whether the Hugging Face directory ships a chat template (``chat_template.jinja``, or a
    ``chat_template`` in ``tokenizer_config.json``)."""
    if (directory / "chat_template.jinja").is_file():
        return True
    try:
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(tokenizer_config, dict) and bool(tokenizer_config.get("chat_template"))


def registry_fields(info: ModelInfo, model_dir: Path) -> dict[str, Any]:
    """Return the ``jobs.models.Model`` field values of a catalogue entry (``id`` included,
    ``organization`` left out). A built-in has a chat template (the engine gives the test models
    ChatML); a local directory has one when it ships one."""
    architecture = info.architecture or ""
    target_modules = LORA_TARGET_MODULES.get(architecture)
    return {
        "id": info.id,
        "family": family_of(architecture),
        "architecture": architecture,
        "parameters": info.parameters,
        "active_parameters": info.active_parameters,
        "context_length": info.context_length,
        "chat_template": info.source == "builtin" or _has_chat_template(Path(model_dir) / info.id),
        "training_modes": list(TRAINING_MODES),
        "lora_target_modules": list(target_modules) if target_modules else "all-linear",
        "memory_gb": memory_estimate_gb(info.parameters),
        "revision": "",
        "licence": _LICENCES.get(info.id, ""),
        "description": info.description,
        "source": info.source,
    }


def sync_models(model_class, *, model_dir: Path | None = None, using: str = "default") -> tuple[int, int]:
    """Write the catalogue's models into ``model_class`` (``jobs.models.Model`` or its historical
    version) as rows offered to everyone; ``model_dir`` defaults to ``settings.LAB_MODEL_DIR``.
    Returns ``(created, updated)``; a row already equal to its catalogue entry is not written,
    and a row an organization owns or whose files Lab stores is left alone."""
    model_dir = Path(model_dir if model_dir is not None else settings.LAB_MODEL_DIR)
    catalogue = {model_id: registry_fields(info, model_dir) for model_id, info in list_models(model_dir).items()}
    existing = {row.id: row for row in model_class.objects.using(using).filter(id__in=catalogue)}
    created = updated = 0
    for model_id, fields in catalogue.items():
        row = existing.get(model_id)
        if row is None:
            model_class.objects.using(using).create(**fields)
            created += 1
        elif row.organization_id is None and not getattr(row, "files", None) and any(getattr(row, name) != value for name, value in fields.items()):
            for name, value in fields.items():
                setattr(row, name, value)
            row.save(using=using)
            updated += 1
    return created, updated


def sync_models_after_migrate(sender, *, using: str = "default", apps=None, **kwargs) -> None:
    """``post_migrate`` receiver: sync the registry once the ``jobs`` tables exist. ``migrate``
    sends the historical app registry (a migrate to a state before the registry's table skips
    it); ``flush`` sends none, and the ``jobs`` app's own model is used."""
    try:
        model_class = (apps or sender.apps).get_model("jobs", "Model")
    except LookupError:
        return
    sync_models(model_class, using=using)
