"""``lab.adapters``: a job's adapter artifacts (``[adapters]`` in the spec; docs/checkpoints.md,
"Adapter artifacts").

An adapter is the trained weights alone, without optimizer or trainer state: a PEFT LoRA
adapter (``adapter_config.json``, ``adapter_model.safetensors``) or, for a full fine-tune,
Hugging Face weights, with the tokenizer files and a model card, as one uncompressed tar.
"""

from __future__ import annotations

from pathlib import Path

from labsdk._checkpoints import download_unpacked
from labsdk._common import paginate, segment
from labsdk._http import HTTPClient
from labsdk.errors import ConflictError
from labsdk.types import Adapter


class Adapters:
    """``GET /jobs/{id}/adapters``, ``GET /adapters/{id}``, ``GET /adapters/{id}/download``."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def list(self, job_id: str, *, limit: int = 100) -> list[Adapter]:
        """Return a job's adapters, newest first, every status included.
        ``NotFoundError`` for a job outside this project."""
        return [*paginate(self._http, f"jobs/{segment(job_id)}/adapters", Adapter, {"limit": limit})]

    def retrieve(self, adapter_id: str) -> Adapter:
        """Return one adapter; ``NotFoundError`` for one outside this project."""
        return Adapter.model_validate(self._http.request("GET", f"adapters/{segment(adapter_id)}"))

    def download(self, adapter_id: str, dir: str | Path, *, progress: bool = True) -> Path:
        """Download a ready adapter, check its SHA-256 against Lab's record, and unpack it into
        the directory ``dir`` (absent or empty), ready for ``peft.PeftModel.from_pretrained(base,
        dir)`` (``peft-lora``) or ``AutoModelForCausalLM.from_pretrained(dir)`` (``hf-full``).

        Returns ``dir``; nothing is left there when the download fails. Raises ``NotFoundError``
        for an adapter outside this project, ``ConflictError`` for one that is not ready,
        ``ValueError`` when ``dir`` is a file or a non-empty directory, ``APIError`` when the
        archive's SHA-256 differs from Lab's or it cannot be unpacked safely.
        """
        adapter = self.retrieve(adapter_id)
        if adapter.status != "ready" or not adapter.sha256:
            raise ConflictError(
                f"Adapter {adapter_id} is {adapter.status}; only ready adapters can be downloaded.",
                status_code=409,
                code="adapter_not_ready",
            )
        return download_unpacked(
            self._http, f"adapters/{segment(adapter_id)}/download", Path(dir),
            what=f"adapter {adapter_id}", progress=progress, sha256=adapter.sha256,
        )
