"""Inference servers as engine processes on this machine, supervised as job attempts are.

Each start of a server is ``python -m engine serve ...`` under ``jobs.launchers.supervise`` in
its own work dir ``<servers dir>/<server id>/run-<generation>`` (pid files, ``exit.json``,
``stdout.log``, ``stderr.log``, and ``address.json``, which the engine writes once it listens on
a free port of 127.0.0.1). The process is observed and signalled by the local launcher's own
code (``LocalLauncher.observe``/``cancel`` on the same layout). It inherits the engine's
allow-listed environment (``engine_environment``: none of Lab's secrets) plus its serving token
``LAB_SERVING_TOKEN``, which it takes out of its environment at start, and, for a base model
Lab's model store holds, ``LAB_JOB_MODEL`` (the files it fetches first, as a job's engine does).

It runs without the bubblewrap sandbox of job attempts: it loads weights (safetensors only, no
pickles, no remote code), not users' code, and it listens on a loopback port, which other local
users' processes could reach but for the token.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.model_store import MODEL_VARIABLE
from jobs.launchers.base import AttemptPhase
from jobs.launchers.local import LocalLauncher, engine_environment, start_supervised
from serving.runtime.base import ServerObservation, ServerPhase, ServerRuntime, ServerSpec

_PHASES = {AttemptPhase.EXITED: ServerPhase.EXITED, AttemptPhase.LOST: ServerPhase.LOST}


class LocalServerRuntime(ServerRuntime):
    """Runs inference servers as supervised processes under ``servers_dir`` (cwd ``repo_dir``)."""

    def __init__(self, *, servers_dir: Path, repo_dir: Path, python: str = sys.executable):
        self.servers_dir = servers_dir
        self.repo_dir = repo_dir
        self.python = python
        self._processes = LocalLauncher(runs_dir=servers_dir, repo_dir=repo_dir, isolation="none", python=python)

    def workdir(self, spec: ServerSpec) -> Path:
        """Return the work dir of one start of a server."""
        return self.servers_dir / spec.server_id / f"run-{spec.generation}"

    def start(self, spec: ServerSpec) -> dict:
        workdir = self.workdir(spec)
        handle = {"workdir": str(workdir)}
        if (workdir / "supervisor.pid").exists() or (workdir / "exit.json").exists():
            return handle  # already started (a retried pass): never twice
        workdir.mkdir(parents=True, exist_ok=True)
        command = [
            self.python, "-m", "engine", "serve", "--model", spec.model, "--served-model", spec.served_model,
            "--max-adapters", str(spec.max_adapters), "--address-file", str(workdir / "address.json"),
            "--backend", spec.backend, "--max-lora-rank", str(spec.max_lora_rank), "--workdir", str(workdir / "work"),
        ]
        if spec.weights_dir:
            command += ["--weights", spec.weights_dir]
        env = engine_environment(token="", repo_dir=self.repo_dir)
        env.pop("LAB_JOB_TOKEN", None)
        env["LAB_SERVING_TOKEN"] = spec.token
        if spec.stored_model is not None:  # fetched into the model cache before the model loads
            env[MODEL_VARIABLE] = json.dumps(spec.stored_model, separators=(",", ":"))
        start_supervised(python=self.python, workdir=workdir, command=command, env=env, cwd=self.repo_dir)
        return handle

    def observe(self, handle: dict) -> ServerObservation:
        if "workdir" not in handle:
            return ServerObservation(ServerPhase.LOST, detail="no work dir")
        seen = self._processes.observe(handle)
        if seen.phase in _PHASES:
            return ServerObservation(_PHASES[seen.phase], detail=seen.detail)
        try:
            url = json.loads((Path(handle["workdir"]) / "address.json").read_text())["url"]
        except (OSError, ValueError, KeyError, TypeError):
            return ServerObservation(ServerPhase.STARTING)
        return ServerObservation(ServerPhase.LISTENING, url=url)

    def stop(self, handle: dict, *, force: bool = False) -> None:
        if "workdir" in handle:
            self._processes.cancel(handle, force=force)
