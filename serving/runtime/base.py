"""The runtime interface: start an inference server, observe it, stop it.

A runtime knows nothing of deployments or statuses: it starts the engine's serving role
(``python -m engine serve``) for a ``ServerSpec``, says what it sees of it, and signals it.
``serving.servers`` turns what it sees into server and deployment statuses.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class ServerSpec:
    """One start of one inference server.

    ``server_id`` and ``generation`` (its start count) name the start; ``model`` is the base
    model's catalogue id; ``weights_dir`` a full checkpoint's Hugging Face directory to serve
    instead of the base weights (None: the base model); ``served_model`` the name requests give
    for it; ``token`` what callers must present (kept out of every command line and repr);
    ``max_adapters`` the LoRA adapters kept loaded at once; ``backend`` what it samples with
    (``transformers`` or ``vllm``) and ``max_lora_rank`` the highest adapter rank vLLM takes;
    ``stored_model`` the base model's files when Lab's model store holds it (an operator's
    ``manage.py models add``, an organization's ``lab models push``): the ``LAB_JOB_MODEL``
    manifest (``jobs.registry.store.stored_model_manifest``) the server fetches it by before
    loading (``engine.model_store``); None for a built-in or a directory in the model cache.
    Kept out of the repr (its URLs may be pre-signed).
    """

    server_id: str
    generation: int
    model: str
    served_model: str
    max_adapters: int
    weights_dir: str | None = None
    backend: str = "transformers"
    max_lora_rank: int = 64
    token: str = field(default="", repr=False)
    stored_model: dict | None = field(default=None, repr=False, compare=False)


class ServerPhase(StrEnum):
    """What a runtime sees of a server start."""

    STARTING = "starting"  # launched; no address yet (loading the model)
    LISTENING = "listening"  # its process is alive and has said where it answers
    EXITED = "exited"  # its process ended (``detail``: the end of its log)
    LOST = "lost"  # gone without a trace of how


@dataclass(frozen=True)
class ServerObservation:
    """What a runtime sees now: the phase, the URL once listening, and why it ended."""

    phase: ServerPhase
    url: str = ""
    detail: str = ""


class ServerRuntime(abc.ABC):
    """Starts, observes and stops inference servers; every method is idempotent."""

    @abc.abstractmethod
    def start(self, spec: ServerSpec) -> dict:
        """Start the server of ``spec`` (nothing when that start already exists); return its handle (JSON)."""

    @abc.abstractmethod
    def observe(self, handle: dict) -> ServerObservation:
        """Return what the runtime sees of the start ``handle`` names."""

    @abc.abstractmethod
    def stop(self, handle: dict, *, force: bool = False) -> None:
        """Ask the server to stop (SIGTERM), or end it at once with ``force``; nothing when it is gone."""
