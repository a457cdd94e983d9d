"""Check a Hugging Face model directory before Lab offers it to jobs (docs/models.md).

``python -m engine check-model --directory DIR --result FILE [--archive TAR]`` unpacks an
uploaded archive first when given one (``extract_archive``), then checks the directory
(``check_directory``) and writes ``{"status": "ready"|"failed", "error": str, "model": {...}}``
to ``FILE``; what it did goes to stderr, the check's log. Lab runs it as a subprocess, in
bubblewrap for an organization's upload (``jobs.registry.checks``): nothing here runs code of the
model's (``trust_remote_code`` is never set), but the files are hostile input.

A directory passes when:

- its weights are safetensors (``*.safetensors``, every shard its index names present) and it
  holds no pickle (``PICKLE_SUFFIXES``: ``pytorch_model.bin`` and the like, which run code when
  loaded);
- ``config.json`` loads with transformers and names an architecture the engine trains
  (``SUPPORTED_ARCHITECTURES``, the ``model_type`` keys of ``engine.catalog.LORA_TARGET_MODULES``);
- every safetensors header reads (size, JSON, offsets inside the file), and the tensors hold the
  parameters that architecture has for this config (the model built on PyTorch's ``meta`` device:
  no memory), so a missing shard or a truncated upload is refused rather than trained from
  random weights;
- the tokenizer loads.

The report (``model``): ``architecture`` (``model_type``), ``parameters`` (the model's count,
tied weights once), ``active_parameters`` (per token, mixtures of experts only: the non-expert
weights plus ``experts per token / experts`` of the experts' weights), ``context_length``
(tokens), ``chat_template`` (bool), ``tool_call_format`` (``hermes`` for ``<tool_call>`` in the
template, ``llama3_json`` for ``<|python_tag|>``, else ""), ``licence`` (the README's front matter
``license:``), ``files`` (the paths Lab stores, sorted) and ``left_out`` (files of other kinds,
never stored: ``.py`` code, images, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import struct
import sys
import tarfile
import time

from engine.catalog import LORA_TARGET_MODULES
from engine.commands.common import exit_with_parent

#: The transformers ``model_type`` values the engine trains, LoRA and full (docs/models.md).
SUPPORTED_ARCHITECTURES = tuple(LORA_TARGET_MODULES)
#: Suffixes of pickled files: loading one runs code, so a model holding one is refused.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
#: The files of a model Lab stores, by name; besides these, every ``*.safetensors``, the index
#: of sharded weights (``*.safetensors.index.json``) and chat templates (``*.jinja``).
KEPT_NAMES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
    "tokenizer.model", "chat_template.json", "README.md", "LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE",
})
KEPT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".jinja")
#: The patterns ``huggingface_hub`` downloads (its ``allow_patterns``): the kept files.
DOWNLOAD_PATTERNS = (*sorted(KEPT_NAMES), "*.safetensors", "*.safetensors.index.json", "*.jinja")
#: The largest safetensors header read (bytes of JSON); the format has no limit of its own.
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: The most members an uploaded archive may hold, and the most bytes they may unpack to.
MAX_ARCHIVE_MEMBERS = 10_000

_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F4": 1, "I16": 2, "U16": 2,
    "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}


class ModelRefused(Exception):
    """The directory or archive is not a model Lab can offer; the message says what is wrong and how to fix it."""


def log(message: str) -> None:
    """Write one line of the check's log (stderr)."""
    print(message, file=sys.stderr, flush=True)


# ---- an uploaded archive ----


def _member_path(name: str) -> pathlib.PurePosixPath:
    path = pathlib.PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not name or "\\" in name:
        raise ModelRefused(f"the archive holds a path that leaves its directory: {name[:200]!r}")
    return path


def extract_archive(archive: pathlib.Path, target: pathlib.Path, *, max_bytes: int) -> pathlib.Path:
    """Unpack the tar (plain or gzip) ``archive`` into ``target`` and return the model's
    directory in it: ``target``, or the one folder everything is in (``my-model/config.json``).

    Only regular files and folders are unpacked. Raises ModelRefused for anything else (links,
    devices), a path that would leave ``target``, more than ``MAX_ARCHIVE_MEMBERS`` members, more
    than ``max_bytes`` bytes unpacked, or a file that is not a tar."""
    target.mkdir(parents=True, exist_ok=True)
    total = count = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                count += 1
                if count > MAX_ARCHIVE_MEMBERS:
                    raise ModelRefused(f"the archive holds more than {MAX_ARCHIVE_MEMBERS} files")
                path = _member_path(member.name)
                if member.isdir():
                    (target / path).mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isfile():
                    raise ModelRefused(f"the archive holds {member.name[:200]!r}, which is not a regular file (links are refused)")
                total += member.size
                if total > max_bytes:
                    raise ModelRefused(f"the archive unpacks to more than {max_bytes} bytes, the limit")
                destination = target / path
                destination.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                with destination.open("wb") as handle:
                    while chunk := source.read(1024 * 1024):
                        handle.write(chunk)
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ModelRefused(f"the upload is not a readable tar archive: {error}") from None
    entries = [entry for entry in target.iterdir() if not entry.name.startswith(".")]
    if not (target / "config.json").is_file() and len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return target


# ---- the files of a directory ----


def is_kept(relative: str) -> bool:
    """Whether Lab stores the file at ``relative`` (a path in the model's directory)."""
    name = relative.rsplit("/", 1)[-1]
    return name in KEPT_NAMES or name.endswith(KEPT_SUFFIXES)


def directory_files(directory: pathlib.Path) -> list[str]:
    """Return every regular file under ``directory`` as a sorted relative POSIX path, hidden
    files and folders (``.cache``, ``.git``) left out. Raises ModelRefused for a symbolic link."""
    found = []
    for folder, folders, files in os.walk(directory):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in files:
            path = pathlib.Path(folder) / name
            if name.startswith("."):
                continue
            if path.is_symlink() or not path.is_file():
                raise ModelRefused(f"{path.relative_to(directory).as_posix()} is a link or not a regular file: copy the file itself")
            found.append(path.relative_to(directory).as_posix())
    return sorted(found)


def safetensors_header(path: pathlib.Path) -> dict:
    """Return the tensors of a safetensors file's header, ``{name: {"dtype", "shape",
    "data_offsets"}}`` (``__metadata__`` left out). Raises ModelRefused when the header is not
    the format's (https://github.com/huggingface/safetensors: a little-endian u64 length, that
    many bytes of JSON, then the data) or a tensor lies outside the file."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ModelRefused(f"{path.name} is not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise ModelRefused(f"{path.name} is not a safetensors file (its header claims {length} bytes)")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, ValueError):
            raise ModelRefused(f"{path.name} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ModelRefused(f"{path.name} is not a safetensors file (its header is not a JSON object)")
    data = size - 8 - length
    tensors = {}
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = tensor["dtype"], list(tensor["shape"]), tensor["data_offsets"]
            expected = math.prod(int(dimension) for dimension in shape) * _DTYPE_BYTES[dtype]
        except (KeyError, TypeError, ValueError):
            raise ModelRefused(f"{path.name}: tensor {name[:200]!r} has no valid dtype, shape and offsets") from None
        if not (0 <= start <= end <= data) or end - start != expected:
            raise ModelRefused(f"{path.name}: tensor {name[:200]!r} lies outside the file or has the wrong size (a truncated upload?)")
        tensors[name] = {"dtype": dtype, "shape": shape}
    return tensors


def _weight_files(directory: pathlib.Path, files: list[str]) -> list[str]:
    """The safetensors files holding the weights: the shards the index names (each must be
    there), else every ``*.safetensors``. Raises ModelRefused when there are none."""
    indexes = [name for name in files if name.endswith(".safetensors.index.json")]
    if indexes:
        try:
            weight_map = json.loads((directory / indexes[0]).read_text())["weight_map"]
            shards = sorted({str(shard) for shard in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelRefused(f"{indexes[0]} is not a safetensors index (no weight_map)") from None
        prefix = indexes[0].rpartition("/")[0]
        shards = [f"{prefix}/{shard}" if prefix else shard for shard in shards]
        missing = [shard for shard in shards if shard not in files]
        if missing:
            raise ModelRefused(f"{indexes[0]} names shards that are missing: {', '.join(missing[:5])}")
        return shards
    weights = [name for name in files if name.endswith(".safetensors")]
    if not weights:
        raise ModelRefused("the directory holds no safetensors weights (*.safetensors): Lab loads safetensors only")
    return weights


def _expert_count(config) -> tuple[int, int] | None:
    """``(experts, experts per token)`` of a mixture-of-experts config, None for a dense model."""
    experts = next((getattr(config, name, None) for name in ("num_experts", "num_local_experts", "n_routed_experts")
                    if getattr(config, name, None)), None)
    per_token = getattr(config, "num_experts_per_tok", None)
    return (int(experts), int(per_token)) if experts and per_token else None


def _licence(directory: pathlib.Path) -> str:
    """The ``license:`` of the README's YAML front matter (the Hub's model card), or ""."""
    try:
        text = (directory / "README.md").read_text(errors="replace")[:20_000]
    except OSError:
        return ""
    front = re.match(r"---\n(.*?)\n---", text, re.S)
    found = re.search(r"^license:\s*['\"]?([\w.\-+]+)", front.group(1), re.M) if front else None
    return found.group(1)[:64] if found else ""


def tool_call_format(template: str) -> str:
    """The tool-call format a chat template renders: ``hermes`` (``<tool_call>`` JSON, Qwen's),
    ``llama3_json`` (``<|python_tag|>``), or "" when it shows none."""
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template:
        return "llama3_json"
    return ""


def check_directory(directory: pathlib.Path) -> dict:
    """Check the Hugging Face model directory ``directory`` (see the module docstring) and return
    its report. Raises ModelRefused naming the first thing wrong."""
    started = time.monotonic()
    files = directory_files(directory)
    pickles = [name for name in files if name.lower().endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise ModelRefused(
            f"the directory holds pickle files, which run code when loaded: {', '.join(pickles[:5])}; "
            "Lab loads safetensors only: remove them (save the weights with safe_serialization=True)"
        )
    if "config.json" not in files:
        raise ModelRefused("the directory holds no config.json: it is not a Hugging Face model directory")
    try:
        raw_config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ModelRefused(f"config.json is not JSON: {error}") from None
    architecture = raw_config.get("model_type") if isinstance(raw_config, dict) else None
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelRefused(
            f"config.json's model_type {architecture!r} is not an architecture the engine trains "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    weights = _weight_files(directory, files)
    tensors: dict[str, dict] = {}
    for name in weights:
        tensors.update(safetensors_header(directory / name))
    log(f"read the headers of {len(weights)} safetensors file(s): {len(tensors)} tensors")

    import torch  # only here: the archive and header checks above need no torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(str(directory), trust_remote_code=False)
    except Exception as error:  # transformers raises ValueError, OSError, KeyError... for a bad config
        raise ModelRefused(f"config.json does not load with transformers {transformers.__version__}: {error}") from None
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    stored = sum(math.prod(tensor["shape"]) for tensor in tensors.values())
    tied = bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
    head = sum(math.prod(tensor["shape"]) for name, tensor in tensors.items() if name.endswith("lm_head.weight"))
    if stored != parameters and not (tied and stored - head == parameters):
        raise ModelRefused(
            f"the safetensors hold {stored:,} parameters, but a {architecture} of this config.json has {parameters:,}: "
            "a shard is missing or the weights belong to another config"
        )
    log(f"config.json: a {architecture} of {parameters:,} parameters (built on the meta device), matching the weights")
    active = None
    experts = _expert_count(config)
    if experts is not None:
        expert_weights = sum(math.prod(tensor["shape"]) for name, tensor in tensors.items() if ".experts." in name)
        active = parameters - expert_weights + expert_weights * experts[1] // experts[0]
        log(f"mixture of experts: {experts[0]} experts, {experts[1]} per token: {active:,} active parameters")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except Exception as error:  # a missing or malformed tokenizer file raises anything from OSError to a Rust error
        raise ModelRefused(f"the tokenizer does not load: {error}") from None
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    log(f"tokenizer: {type(tokenizer).__name__} of {len(tokenizer)} tokens; chat template: {'yes' if template else 'none'}")
    text_config = config.get_text_config()
    context = next((getattr(text_config, name) for name in ("max_position_embeddings", "n_positions", "seq_length")
                    if isinstance(getattr(text_config, name, None), int)), None)
    if not context:
        raise ModelRefused("config.json names no context length (max_position_embeddings)")
    kept = [name for name in files if is_kept(name)]
    left_out = [name for name in files if not is_kept(name)]
    if left_out:
        log(f"left out (not model files Lab stores): {', '.join(left_out[:20])}")
    log(f"checked in {time.monotonic() - started:.1f} s")
    return {
        "architecture": architecture,
        "parameters": parameters,
        "active_parameters": active,
        "context_length": int(context),
        "chat_template": bool(template),
        "tool_call_format": tool_call_format(template),
        "licence": _licence(directory),
        "files": kept,
        "left_out": left_out,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m engine check-model``: check (after unpacking ``--archive``) and write the
    result JSON; exit 0 when it was written (passed or refused), 1 when the check crashed."""
    parser = argparse.ArgumentParser(prog="python -m engine check-model")
    parser.add_argument("--directory", required=True, type=pathlib.Path, help="the model directory (the archive is unpacked here)")
    parser.add_argument("--result", required=True, type=pathlib.Path, help="where the result JSON goes")
    parser.add_argument("--archive", type=pathlib.Path, help="a tar or tar.gz of the model directory to unpack first")
    parser.add_argument("--max-bytes", type=int, default=0, help="the most bytes the archive may unpack to")
    parser.add_argument("--parent", type=int, help="end when this process (the worker that started the check) ends")
    args = parser.parse_args(argv)
    if args.parent:  # outside bubblewrap, whose --die-with-parent does this for a sandboxed check
        exit_with_parent(args.parent)
    directory = args.directory
    try:
        if args.archive is not None:
            directory = extract_archive(args.archive, args.directory, max_bytes=args.max_bytes or 2**62)
            log(f"unpacked the archive ({sum(1 for _ in directory.rglob('*'))} entries)")
        result = {"status": "ready", "error": "", "model": check_directory(directory),
                  "directory": directory.relative_to(args.directory).as_posix() if args.archive else ""}
    except ModelRefused as refusal:
        log(f"refused: {refusal}")
        result = {"status": "failed", "error": str(refusal), "model": {}}
    args.result.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
