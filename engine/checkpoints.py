"""Checkpoints: a Hugging Face/PEFT directory plus `trainer_state/`, archived as one tar.

Layout of `step-000005/` (docs/ingest-api.md: one uncompressed tar of a Hugging Face
or PEFT directory plus `trainer_state/`):

    adapter_config.json, adapter_model.safetensors   LoRA (format "peft-lora"), loadable by
                                                     `peft.PeftModel.from_pretrained` and vLLM
    or config.json, model.safetensors                full weights (format "hf-full")
    tokenizer files, chat_template.jinja
    README.md                    the model card (`model_card`): base model, job, step, reward, spec
    trainer_state/state.json     step, data position, seed, spec digest, lab metadata
    trainer_state/optimizer.pt   AdamW state (torch.save)
    trainer_state/rng.pt         torch and Python RNG states
    trainer_state/pending_rollouts.pt   only with overlap: the rollouts already sampled
                                        for the next step, so a resume replays them
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
from dataclasses import dataclass

import peft
import safetensors.torch
import torch
import transformers

from engine.checkpoint_archives import STATE_DIR
from engine.distributed import is_sharded, load_full_optimizer_state, load_full_weights
from engine.policy import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, is_lora

FORMAT_LORA = "peft-lora"
FORMAT_FULL = "hf-full"


@dataclass
class TrainerState:
    """What a resume needs besides the weights: the next step and the data position."""

    step: int
    data_position: int
    seed: int
    spec_digest: str
    format: str


#: What a model card says of a base model that is a test fixture, not a language model.
TEST_MODEL_NOTE = (
    "**This is a test model.** `{model}` has a few layers of seeded random weights and exists for "
    "fast tests: it learns nothing, and this adapter is of no use outside Lab's tests."
)


def model_card(
    *, base_model: str, job_id: str, step: int, max_steps: int, metrics: dict[str, float], spec: dict,
    checkpoint_format: str, test_model: bool = False,
) -> str:
    """Return the checkpoint's model card (`README.md`): a Hugging Face card whose YAML front
    matter names `base_model` (the catalogue id, which the local model cache is keyed by),
    `library_name` peft for an adapter, and tags; then the job, the step of `max_steps`, the
    step's `reward/mean` and other main metrics, how to load it, and the spec as JSON.

    The front matter's keys are the Hub's model-card metadata (huggingface_hub `ModelCardData`:
    `base_model`, `library_name`, `tags`). `test_model` adds a note that the base model is a test
    fixture (`TEST_MODEL_NOTE`).
    """
    lora = checkpoint_format == FORMAT_LORA
    front = ["---", f"base_model: {json.dumps(base_model)}"]
    if lora:
        front.append("library_name: peft")
    front += ["tags:", "- lab", "- grpo", *(["- lora"] if lora else []), *(["- test-model"] if test_model else []), "---"]
    shown = [name for name in ("reward/mean", "reward/std", "loss/mean", "entropy/mean", "seq_len/mean") if name in metrics]
    lines = [
        *front,
        "",
        f"# {spec.get('name') or job_id}, step {step}",
        "",
        f"{'A LoRA adapter' if lora else 'Full weights'} trained with GRPO by Lab job `{job_id}` on "
        f"`{base_model}`: the checkpoint after step {step} of {max_steps}.",
        "",
    ]
    if test_model:
        lines += [TEST_MODEL_NOTE.format(model=base_model), ""]
    if shown:
        lines += ["| metric at this step | value |", "|---|---|", *(f"| `{name}` | {metrics[name]:.4g} |" for name in shown), ""]
    lines += ["## Loading it", "", "```python", "import labsdk as lab"]
    if test_model:
        lines += [
            "from engine.models import load_model   # in Lab's repository: a test model is built, not stored",
            "",
            f'base, tokenizer = load_model("{base_model}")',
            'model = lab.checkpoints.load("ckpt_...", base_model=base)',
        ]
    else:
        lines += [
            "",
            "# Downloads the checkpoint; the base weights come from the local model cache",
            f"# (LAB_MODEL_DIR/{base_model}), nothing from a model hub.",
            'model = lab.checkpoints.load("ckpt_...")',
            "```",
            "",
            f"or by hand, from this directory{' with peft' if lora else ''}:",
            "",
            "```python",
            "import os",
            "import transformers" + ("\nimport peft" if lora else ""),
            "",
        ]
        if lora:
            lines += [
                f'base_dir = os.path.join(os.environ["LAB_MODEL_DIR"], "{base_model}")',
                "base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)",
                'model = peft.PeftModel.from_pretrained(base, "path/to/this/directory")',
            ]
        else:
            lines.append('model = transformers.AutoModelForCausalLM.from_pretrained("path/to/this/directory")')
    lines += ["```", "", "## Spec", "", "```json", json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False), "```", ""]
    return "\n".join(lines)


def checkpoint_name(step: int) -> str:
    """Return the directory name of the checkpoint taken after `step` (e.g. "step-000005")."""
    return f"step-{step:06d}"


def save_checkpoint(
    directory: pathlib.Path,
    *,
    model: torch.nn.Module,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    pending_rollouts: object | None = None,
    card: str | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict | None = None,
) -> pathlib.Path:
    """Write a checkpoint directory atomically (temp dir, then rename) and return its path.

    `card` (see `model_card`) replaces the `README.md` peft writes, an empty template.
    `weights` and `optimizer_state`: the full state of a model sharded with FSDP2, gathered
    by every rank for this one (engine.distributed.full_weights, full_optimizer_state); they
    are written in place of `model`'s and `optimizer`'s own, in the same format."""
    directory = pathlib.Path(directory)
    staging = _stage_weights(directory, model=model, tokenizer=tokenizer, card=card, weights=weights)
    state_dir = staging / STATE_DIR
    state_dir.mkdir()
    torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state, state_dir / "optimizer.pt")
    torch.save({"torch": torch.random.get_rng_state(), "python": random.getstate()}, state_dir / "rng.pt")
    if pending_rollouts is not None:
        torch.save(pending_rollouts, state_dir / "pending_rollouts.pt")
    (state_dir / "state.json").write_text(json.dumps(state.__dict__, indent=2, sort_keys=True))
    return _publish(staging, directory)


def _stage_weights(
    directory: pathlib.Path, *, model: torch.nn.Module, tokenizer, card: str | None, weights: dict[str, torch.Tensor] | None = None,
) -> pathlib.Path:
    """Write the weights of `model` (its PEFT adapter alone for LoRA, else its Hugging Face
    weights, or `weights` when given: a sharded model's gathered state dict), the tokenizer and
    the model card into a fresh `<directory>.partial`; return it."""
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if is_lora(model):
        # The embeddings are frozen, so the adapter alone is the weights (and peft need not
        # look the base model up to decide that).
        model.save_pretrained(str(staging), safe_serialization=True, save_embedding_layers=False)
    else:
        model.save_pretrained(str(staging), safe_serialization=True, state_dict=weights)
    tokenizer.save_pretrained(str(staging))
    if card is not None:
        (staging / "README.md").write_text(card, encoding="utf-8")
    return staging


def _publish(staging: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """Put the finished `staging` directory in place of `directory` (a rename); return it."""
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    return directory


def load_trainer_state(directory: pathlib.Path) -> TrainerState:
    """Read `trainer_state/state.json` of a checkpoint directory."""
    data = json.loads((pathlib.Path(directory) / STATE_DIR / "state.json").read_text())
    return TrainerState(**data)


def load_weights(directory: pathlib.Path, *, model: torch.nn.Module, base_model_id: str | None = None) -> TrainerState:
    """Load a checkpoint directory's weights (the LoRA adapter, or full weights) into `model`.

    Returns the checkpoint's trainer state; touches no optimizer or RNG. Raises ValueError when
    the checkpoint does not fit: LoRA vs full, an adapter for another base model than
    `base_model_id` (when given), or weights of other names or shapes. A model sharded with
    FSDP2 loads the same full weights (every rank must call this; rank 0 reads them).
    """
    directory = pathlib.Path(directory)
    state = load_trainer_state(directory)
    _load_model_weights(directory, state.format, model=model, base_model_id=base_model_id)
    return state


def load_adapter_weights(directory: pathlib.Path, *, model: torch.nn.Module, base_model_id: str | None = None) -> str:
    """Load an adapter artifact's directory (a checkpoint's weights alone, no `trainer_state/`:
    a peft adapter when it holds `adapter_config.json`, else full weights) into `model`; return
    its format. Raises ValueError as `load_weights` does."""
    directory = pathlib.Path(directory)
    fmt = FORMAT_LORA if (directory / ADAPTER_CONFIG_FILE).is_file() else FORMAT_FULL
    _load_model_weights(directory, fmt, model=model, base_model_id=base_model_id)
    return fmt


def _load_model_weights(directory: pathlib.Path, fmt: str, *, model: torch.nn.Module, base_model_id: str | None) -> None:
    """Load the weights of format `fmt` in `directory` into `model` (`load_weights`' rules)."""
    if (fmt == FORMAT_LORA) != is_lora(model):
        wanted = "LoRA (lora_rank > 0)" if fmt == FORMAT_LORA else "full weights (lora_rank 0)"
        raise ValueError(f"checkpoint format {fmt} needs a job that trains {wanted}")
    try:
        if is_lora(model):
            adapter_config = json.loads((directory / ADAPTER_CONFIG_FILE).read_text())
            base = adapter_config.get("base_model_name_or_path")
            if base_model_id is not None and base and base != base_model_id:
                raise ValueError(f"checkpoint is an adapter for {base}, not for {base_model_id}")
            weights = safetensors.torch.load_file(str(directory / ADAPTER_WEIGHTS_FILE))
            result = peft.set_peft_model_state_dict(model, weights)
            if getattr(result, "unexpected_keys", None):
                raise ValueError(f"adapter has unexpected weights: {result.unexpected_keys[:3]}")
        elif is_sharded(model):
            missing, unexpected = load_full_weights(model, lambda: read_full_weights(directory, model))
        else:
            missing, unexpected = model.load_state_dict(read_full_weights(directory, model), strict=False)
            # Tied output embeddings are saved once; anything else missing is an error.
            missing = [name for name in missing if "lm_head" not in name]
            if missing or unexpected:
                raise ValueError(f"checkpoint weights do not fit the model: {(missing or unexpected)[:3]}")
    except RuntimeError as error:  # torch's size mismatch (another LoRA rank or model size)
        raise ValueError(f"checkpoint weights do not fit the model: {' '.join(str(error).split())[:300]}") from None


def read_full_weights(directory: pathlib.Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Return a full checkpoint's weights under `model`'s parameter names.

    `save_pretrained` writes a model whose transformers class fuses weights (a mixture of
    experts' `mlp.experts.gate_up_proj` [E, 2·I, H]) in its family's published layout (one
    `experts.<e>.gate_proj.weight` per expert), which vLLM and the Hub read; such a checkpoint
    is read back through `from_pretrained`, which fuses them again (exactly: a concatenation).
    """
    weights = safetensors.torch.load_file(str(pathlib.Path(directory) / "model.safetensors"))
    names = {name for name, _ in model.named_parameters()}
    if names <= weights.keys() | {name for name in names if "lm_head" in name}:
        return weights
    return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype="auto").state_dict()


def restore_checkpoint(
    directory: pathlib.Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[TrainerState, object | None]:
    """Load weights, optimizer and RNG state from a checkpoint directory into a built trainer.

    Returns the trainer state and the pending rollouts (None when the checkpoint has none).
    Raises ValueError when the checkpoint's format does not match the model (LoRA vs full).
    A model sharded with FSDP2 and its optimizer take the same files as one process's
    (every rank must call this).
    """
    directory = pathlib.Path(directory)
    state = load_weights(directory, model=model)
    state_dir = directory / STATE_DIR
    if is_sharded(model):
        load_full_optimizer_state(model, optimizer, torch.load(state_dir / "optimizer.pt", weights_only=True))
    else:
        optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt", weights_only=True))
    rng = torch.load(state_dir / "rng.pt", weights_only=False)
    torch.random.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    pending_path = state_dir / "pending_rollouts.pt"
    pending = torch.load(pending_path, weights_only=False) if pending_path.exists() else None
    return state, pending


def prune_checkpoints(root: pathlib.Path, keep_last: int, *, pending_archives: set[pathlib.Path] = frozenset()) -> list[pathlib.Path]:
    """Delete all but the newest `keep_last` local checkpoint directories and their tars.

    A checkpoint whose tar is in `pending_archives` (not yet settled with Lab: still to be
    registered, uploaded or completed) is kept whatever its age, so an upload never finds its
    archive gone. Returns the directories deleted.
    """
    root = pathlib.Path(root)
    pending = {pathlib.Path(path).resolve() for path in pending_archives}
    steps = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".partial"))
    deleted = []
    for old in steps[:-keep_last] if keep_last > 0 else []:
        archive = old.with_name(old.name + ".tar")
        if archive.resolve() in pending:
            continue
        shutil.rmtree(old, ignore_errors=True)
        archive.unlink(missing_ok=True)
        deleted.append(old)
    return deleted


# ---- adapter artifacts ([adapters]; docs/checkpoints.md, "Adapter artifacts") ----

ADAPTER_ROOT = "adapters"


def adapter_due(adapters: object | None, step: int, max_steps: int) -> bool:
    """Whether the adapter artifact of `step` is to be exported.

    `adapters` is the spec's `[adapters]` section (None: the job exports none); its `interval`
    is steps between exports, and 0 or absent exports only after the last step (`max_steps`).
    """
    if adapters is None:
        return False
    interval = getattr(adapters, "interval", None) or 0
    return step == max_steps or (interval > 0 and step % interval == 0)


def save_adapter(
    directory: pathlib.Path, *, model: torch.nn.Module, tokenizer, card: str | None = None, weights: dict[str, torch.Tensor] | None = None,
) -> pathlib.Path:
    """Write the adapter artifact of the current weights to `directory` atomically; return it.

    A LoRA model writes its PEFT adapter alone (`adapter_config.json`,
    `adapter_model.safetensors`; `peft.PeftModel.from_pretrained(base, directory)` loads it), a
    full fine-tune its Hugging Face weights (`config.json`, `model.safetensors`); then the
    tokenizer files and the model card (`README.md`). Unlike a checkpoint there is no
    `trainer_state/`: no optimizer, RNG or data position, so it is small and cannot resume a job.
    `weights`: a sharded model's gathered state dict, as for `save_checkpoint`.
    """
    directory = pathlib.Path(directory)
    return _publish(_stage_weights(directory, model=model, tokenizer=tokenizer, card=card, weights=weights), directory)


def prune_adapters(root: pathlib.Path, *, keep: set[pathlib.Path]) -> list[pathlib.Path]:
    """Delete the local adapter directories under `root` and the tars not in `keep` (the archives
    Lab has not settled yet); Lab keeps the settled ones. Returns what was deleted."""
    keep = {pathlib.Path(path).resolve() for path in keep}
    deleted = []
    for path in sorted(pathlib.Path(root).glob("step-*")):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
        elif path.suffix == ".tar" and path.resolve() not in keep:
            path.unlink(missing_ok=True)
            deleted.append(path)
    return deleted
