"""``client.models``, ``client.environments`` and ``client.prices``: what a job can name and what it costs."""

from __future__ import annotations

from pathlib import Path

from labsdk._common import list_data, paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.types import (
    Environment,
    EnvironmentBuild,
    Model,
    Price,
)


class Models:
    """The model catalogue (``GET /models``)."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def list(self) -> list[Model]:
        """Return every model a job may train."""
        return list(paginate(self._http, "models", Model, {"limit": 100}))


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
