"""``client.checkpoints``: list, download (checked against its SHA-256) and load a job's checkpoints."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

from labsdk._common import paginate, segment
from labsdk._http import HTTPClient
from labsdk.errors import (
    APIError,
)
from labsdk.model_cache import model_cache_dir, model_path
from labsdk.types import (
    Checkpoint,
)


def download_unpacked(
    http: HTTPClient, route: str, path: Path, *, what: str, progress: bool, sha256: str | None = None
) -> Path:
    """Download the tar at ``route`` and unpack it into the directory ``path`` (absent or empty).

    With ``sha256`` (hex) the archive must have that SHA-256 before anything is unpacked.
    Nothing is left at ``path`` when the download fails. Raises ``ValueError`` when ``path`` is
    a file or a non-empty directory, ``APIError`` naming ``what`` when the archive's SHA-256
    differs, it is not a tar, or a member would land outside ``path``.
    """
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"{path} must be an empty directory or not exist yet, to unpack the {what.split()[0]} into")
    path.parent.mkdir(parents=True, exist_ok=True)
    archive = path.with_name(f"{path.name}.tar.download")
    staging = path.with_name(f"{path.name}.partial")
    try:
        http.download(route, archive, progress=progress)
        if sha256 is not None and (found := _sha256_of(archive)) != sha256:
            raise APIError(f"{what}: the downloaded archive has SHA-256 {found}, not the {sha256} Lab recorded")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            with tarfile.open(archive, "r:") as tar:
                # "data": no links out, no absolute paths, no devices (PEP 706).
                tar.extractall(staging, filter="data")
        except tarfile.TarError as exc:
            raise APIError(f"{what}: cannot unpack the downloaded archive: {exc}") from exc
        if path.exists():
            path.rmdir()
        staging.replace(path)
    finally:
        archive.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _sha256_of(path: Path) -> str:
    """Return the hex SHA-256 of a file, read a megabyte at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


#: Catalogue models that Lab builds when a job needs them rather than stores: no archive to fetch.
BUILT_MODELS = frozenset({"lab/tiny-random-llama", "lab/tiny-random-qwen2", "lab/tiny-random-qwen3", "lab/tiny-random-qwen3-moe"})


class Checkpoints:
    """A job's checkpoints and their archives (``GET /jobs/{id}/checkpoints``,
    ``GET /checkpoints/{id}/download``)."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def list(self, job_id: str, *, limit: int = 100) -> list[Checkpoint]:
        """Return a job's checkpoints, newest first, every status included.
        ``NotFoundError`` for a job outside this project."""
        return [*paginate(self._http, f"jobs/{segment(job_id)}/checkpoints", Checkpoint, {"limit": limit})]

    def download(
        self, checkpoint_id: str, path: str | Path, *, extract: bool = True, progress: bool = True
    ) -> Path:
        """Download a ready checkpoint and return where it is; a tqdm bar in bytes when ``progress``.

        With ``extract`` (the default) ``path`` is a directory (absent or empty) that receives
        the unpacked Hugging Face/PEFT directory with its ``trainer_state/``, ready for
        ``PeftModel.from_pretrained(base, path)``; the archive is not kept. Without it ``path``
        is the file the uncompressed tar is saved as. Nothing is left at ``path`` when the
        download fails. Raises ``NotFoundError`` for a checkpoint outside this project,
        ``ConflictError`` for one that is not ready, ``ValueError`` when ``path`` is a file or
        a non-empty directory (with ``extract``), ``APIError`` when the archive is not a tar or
        has a member that would land outside ``path``.
        """
        path = Path(path)
        route = f"checkpoints/{segment(checkpoint_id)}/download"
        if not extract:
            return self._http.download(route, path, progress=progress)
        return download_unpacked(self._http, route, path, what=f"checkpoint {checkpoint_id}", progress=progress)

    def fetch_base_model(self, model_id: str, path: str | Path, *, progress: bool = True) -> Path:
        """Download the catalogue model ``model_id`` (``owner/name``) from Lab into the directory
        ``path`` (absent or empty; ``<model cache>/<owner>/<name>`` for :meth:`load`) and return it.
        The archive is checked against the SHA-256 Lab sends. Raises ``NotFoundError`` for a model
        Lab does not hold, and what :func:`download_unpacked` raises."""
        owner, _, name = model_id.partition("/")
        route = f"models/{segment(owner)}/{segment(name)}/archive"
        return download_unpacked(self._http, route, Path(path), what=f"model {model_id}", progress=progress)

    def load(
        self, checkpoint_id: str, *, path: str | Path | None = None, model_dir: str | Path | None = None,
        base_model: Any = None, progress: bool = True,
    ) -> Any:
        """Return a ready checkpoint as a model: a ``peft.PeftModel`` for a ``peft-lora`` one, on
        its base model loaded from the local model cache; a transformers model for ``hf-full``.

        The checkpoint is downloaded (unpacked) to ``path`` (default
        ``<model cache>/checkpoints/<checkpoint id>``), or used from there when already unpacked.
        The base model is the adapter's ``base_model_name_or_path``, Lab's catalogue id, read
        from ``model_dir`` (default ``labsdk.model_cache.model_cache_dir()``: ``LAB_MODEL_DIR``,
        else ``~/.cache/lab/models``); one not there yet is fetched from Lab once
        (``GET /models/{id}/archive``, checked against its SHA-256) into that cache. Pass
        ``base_model`` (a transformers model) to use one loaded yourself, e.g. the test model
        ``lab/tiny-random-llama``, which is built rather than stored and so never fetched. Needs
        ``peft`` and ``transformers``. Raises ``FileNotFoundError`` naming the directory for
        ``lab/tiny-random-llama`` without ``base_model``, ``NotFoundError`` for a base model Lab
        does not hold, and what :meth:`download` raises.
        """
        try:
            import peft
            import transformers
        except ImportError as exc:
            raise ImportError(f"lab.checkpoints.load needs peft and transformers ({exc.name} is missing)") from exc
        path = Path(path) if path is not None else model_cache_dir() / "checkpoints" / checkpoint_id
        if not ((path / "adapter_config.json").is_file() or (path / "config.json").is_file()):
            self.download(checkpoint_id, path, extract=True, progress=progress)
        adapter_config = path / "adapter_config.json"
        if not adapter_config.is_file():
            return transformers.AutoModelForCausalLM.from_pretrained(str(path))
        if base_model is None:
            base_id = json.loads(adapter_config.read_text()).get("base_model_name_or_path") or ""
            base_dir = model_path(base_id, model_dir)
            if not (base_dir / "config.json").is_file():
                if base_id in BUILT_MODELS:
                    raise FileNotFoundError(
                        f"{checkpoint_id} is an adapter for {base_id}, which is not in the model cache at {base_dir} "
                        "and which Lab builds rather than stores: build it and pass base_model="
                    )
                self.fetch_base_model(base_id, base_dir, progress=progress)
            base_model = transformers.AutoModelForCausalLM.from_pretrained(str(base_dir))
        return peft.PeftModel.from_pretrained(base_model, str(path))
