"""``client.models``, ``client.environments`` and ``client.prices``: what a job can name and what it costs."""

from __future__ import annotations

import os
import tarfile
import tempfile
import time
from pathlib import Path

from labsdk._common import list_data, paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.errors import ModelCheckFailedError, ModelWaitTimeoutError
from labsdk.types import (
    Environment,
    EnvironmentBuild,
    Model,
    Price,
)


def _model_path(model_id: str) -> str:
    """Return the URL path of the model ``<owner>/<name>``, each segment quoted."""
    owner, slash, name = model_id.partition("/") if isinstance(model_id, str) else ("", "", "")
    if not slash or not owner or not name or "/" in name:
        raise ValueError(f"expected a model id <owner>/<name>, got {model_id!r}")
    return f"models/{segment(owner)}/{segment(name)}"


def pack_model_directory(directory: str | Path, target: Path) -> Path:
    """Write the regular files under ``directory`` (a Hugging Face model directory) into the tar
    ``target`` and return it: hidden files and folders (``.cache``, ``.git``) left out, links
    replaced by the files they point to (a Hugging Face cache's snapshot is links into its
    blobs). Raises ``ValueError`` when ``directory`` holds no ``config.json``."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} is not a Hugging Face model directory: it holds no config.json")
    with tarfile.open(target, "w", dereference=True) as tar:
        for folder, folders, files in os.walk(directory, followlinks=True):
            folders[:] = sorted(name for name in folders if not name.startswith("."))
            for name in sorted(files):
                path = Path(folder) / name
                if not name.startswith(".") and path.is_file():
                    tar.add(path, arcname=path.relative_to(directory).as_posix())
    return target


class Models:
    """The model registry (``/models``, docs/models.md): the models this organization may use, and
    its own pushed ones with their checks."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def list(self) -> list[Model]:
        """Return every model this organization sees: those offered to everyone and its own
        (only ``status == "ready"`` ones train)."""
        return list(paginate(self._http, "models", Model, {"limit": 100}))

    def retrieve(self, model_id: str) -> Model:
        """Return the model ``<owner>/<name>`` with its latest check (``build``). Raises
        ``NotFoundError`` for a missing model and another organization's alike."""
        return parse(Model, self._http.request("GET", _model_path(model_id)))

    get = retrieve

    def push(self, directory: str | Path, *, name: str, wait: bool = False, timeout: float | None = 1800.0) -> Model:
        """Upload the Hugging Face model directory ``directory`` as the organization's model
        ``name`` (``<organization slug>/<name>``), packed as one tar and streamed; Lab checks it
        in a worker (safetensors only, an architecture the engine trains, the tokenizer loads).
        Returns the model, its ``build`` queued (pushing the same files again returns the same
        check); with ``wait``, once the check has passed (:meth:`wait`). Raises ``ValueError``
        for a directory without ``config.json``, ``BadRequestError`` for a name outside the
        organization, ``ConflictError`` while its previous check runs, ``RequestTooLargeError``
        above Lab's limit, and :meth:`wait`'s errors."""
        with tempfile.TemporaryDirectory(prefix="lab-model-") as scratch:
            archive = pack_model_directory(directory, Path(scratch) / f"{Path(directory).resolve().name or 'model'}.tar")
            model = parse(Model, self._http.upload_stream(
                "models", fields={"name": name}, field="file", file=archive, content_type="application/x-tar",
            ))
        return self.wait(model.id, timeout=timeout) if wait else model

    def wait(self, model_id: str, *, timeout: float | None = 1800.0, poll_interval: float = 2.0) -> Model:
        """Poll a pushed model until its latest check has passed and return it. ``timeout`` and
        ``poll_interval`` are seconds (``None``: no limit). Raises ``ModelCheckFailedError`` when
        the check refused it (``error.model.build.error`` says why; ``build_log`` has the
        rest), ``ModelWaitTimeoutError`` when time runs out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            model = self.retrieve(model_id)
            build = model.build
            if build is None or build.status == "ready":
                return model
            if build.status == "failed":
                raise ModelCheckFailedError(model)
            if deadline is not None and time.monotonic() >= deadline:
                raise ModelWaitTimeoutError(model, timeout)
            time.sleep(poll_interval)

    def build_log(self, model_id: str) -> str:
        """Return the log of the model's latest check as text (``""`` for a model never pushed):
        what was unpacked and read, and why it was refused. Raises ``NotFoundError`` as
        :meth:`retrieve` does."""
        return self._http.request_text(f"{_model_path(model_id)}/build-log")


def _environment_path(environment_id: str) -> str:
    """Return the URL path of ``<organization>/<name>[@<version>]``, each segment quoted."""
    owner, slash, name = environment_id.partition("/") if isinstance(environment_id, str) else ("", "", "")
    if not slash or not owner or not name or "/" in name:
        raise ValueError(f"expected an environment id <organization>/<name>[@<version>], got {environment_id!r}")
    return f"environments/{segment(owner)}/{segment(name)}"


class Environments:
    """Environments (``/environments``): the built-ins and this organization's uploaded packages
    (docs/environments.md)."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def list(self) -> list[Environment]:
        """Return every environment a job of this project may use: built-ins, then the
        organization's packages by name, newest version first."""
        return list(paginate(self._http, "environments", Environment, {"limit": 100}))

    def push(self, wheel: str | Path) -> Environment:
        """Upload the environment wheel at ``wheel`` (a ``.whl`` file, at most 100 MB) for the
        whole organization and return its Environment (pushing the same bytes again returns the
        same one). Raises ``BadRequestError`` for a file Lab refuses (its message says why),
        ``ConflictError`` when that version exists with other bytes or was deleted, and
        ``RequestTooLargeError`` above 100 MB."""
        return parse(Environment, self._http.upload("environments", field="file", file=wheel, content_type="application/zip"))

    def retrieve(self, environment_id: str) -> Environment:
        """Return the package ``<organization>/<name>[@<version>]`` (no version, or ``@latest``:
        the highest). Raises ``NotFoundError`` for a missing or another organization's package."""
        return parse(Environment, self._http.request("GET", _environment_path(environment_id)))

    get = retrieve

    def build_log(self, environment_id: str) -> str:
        """Return the log of the version's latest build as text (``""`` while it has none): the
        resolver's messages, the wheels fetched, the package's traceback when loading it failed.
        Raises ``NotFoundError`` as :meth:`retrieve` does."""
        return self._http.request_text(f"{_environment_path(environment_id)}/build-log")

    def rebuild(self, environment_id: str) -> EnvironmentBuild:
        """Build the version again (the same wheel, the package index as it is now) and return the
        new build, ``queued``; follow it with :meth:`retrieve` (``.build``). Raises
        ``ConflictError`` while its latest build is still queued or running, ``NotFoundError`` as
        :meth:`retrieve` does."""
        return parse(EnvironmentBuild, self._http.request("POST", f"{_environment_path(environment_id)}/builds"))

    def delete(self, environment_id: str) -> None:
        """Delete one version (no version: the latest); the version can never be pushed again.
        Raises ``ConflictError`` while a queued or running job uses it, ``NotFoundError`` as
        :meth:`retrieve` does."""
        self._http.request("DELETE", _environment_path(environment_id))


class Prices:
    """The price table (``GET /prices``): USD per hour per resource type."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def list(self) -> list[Price]:
        """Return every row of the price table."""
        return [parse(Price, item) for item in list_data(self._http.request("GET", "prices"), "prices")]
