"""A job's uploaded environment packages: fetched, checked, installed into the attempt's own
directory and imported, before the spec is checked against the catalogue.

Lab hands the packages in ``LAB_JOB_ENVIRONMENT_PACKAGES``, a JSON list of
``{"id": "<org>/<name>@<version>", "sha256", "url", "filename"}`` (``url`` is ``file://`` on a
machine that shares Lab's storage, else a pre-signed HTTPS URL: no credential of Lab's is needed).
Each wheel is fetched and its SHA-256 checked, then all are installed with
``uv pip install --no-deps --no-index --offline --target <workdir>/environments/site`` (no
network, no dependency resolution: a package's dependencies must already be in the engine's environment),
and that directory is *appended* to ``sys.path`` so nothing of the engine's own can be shadowed.

A package of Lab's own protocol declares its ``lab_environments.Environment`` subclass as the
one entry point of the ``lab.environments`` group; it is imported here, and a dependency missing
from the engine's environment is an ``InvalidEnvironment`` naming the module (exit 2). A
verifiers package (no such entry point: its top-level module exports a ``Taskset``) is never
imported by the engine: verifiers lives in its own environment (``.venv-verifiers``), whose
Python runs the verifiers bridge over the same site directory
(``engine.environments.verifiers_taskset``); a module missing there is the same exit 2.

A package whose build loaded it through verifiers' v0 API (``load_environment``; the package's
``build``, ``{"number", "api": "v0", "lock": [...]}``) runs on its build instead: the build's
lock is installed into an environment of its own, cached on the machine by the lock's hash
(``engine.build_envs``), and the ``load_environment`` bridge runs with that environment's Python.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import logging
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine import build_envs, dataset_snapshots, egress
from engine.catalog import EnvironmentInfo, register_environment
from engine.config import PACKAGES_VARIABLE, child_environment, environment
from engine.environments import register_installed, verifiers_taskset
from engine.environments.base import Environment, InvalidEnvironment
from engine.environments.probe import not_in_engine

logger = logging.getLogger("engine")

ENTRY_POINT_GROUP = "lab.environments"
#: Seconds one wheel download or the install may take.
FETCH_TIMEOUT_S = 120
INSTALL_TIMEOUT_S = 300
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Package:
    """One package Lab asks the attempt to install."""

    id: str
    sha256: str
    url: str
    filename: str
    #: The package's build when Lab runs it on one: ``{"number", "api", "lock": [{"name", "version",
    #: "filename", "sha256", "url"}], "secrets": [name]}`` (``engine.build_envs``; ``secrets``: the job
    #: secrets its environment reads, given to its bridge); None runs it as before builds.
    build: dict | None = None

    @property
    def name(self) -> str:
        """The environment's name: its id without owner or version (``my-env``), as in metric names."""
        return self.id.split("/", 1)[-1].split("@", 1)[0]


def packages_from_environment(environ=None) -> list[Package]:
    """Return the packages named by ``LAB_JOB_ENVIRONMENT_PACKAGES`` (none when unset).

    Raises InvalidEnvironment when the variable is not a JSON list of package objects.
    """
    raw = (environment() if environ is None else environ).get(PACKAGES_VARIABLE, "")
    if not raw:
        return []
    try:
        items = json.loads(raw)
        packages = [
            Package(id=item["id"], sha256=item["sha256"], url=item["url"], filename=item["filename"], build=item.get("build"))
            for item in items
        ]
    except (ValueError, TypeError, KeyError) as error:
        raise InvalidEnvironment(f"{PACKAGES_VARIABLE} is not a list of packages: {error}") from None
    for package in packages:
        if "/" in package.filename or not package.filename.endswith(".whl"):
            raise InvalidEnvironment(f"package {package.id} has no wheel file name: {package.filename!r}")
    return packages


def _fetch(package: Package, directory: Path) -> Path:
    """Copy or download the wheel into ``directory`` and check its SHA-256."""
    if "/" in package.filename or not package.filename.endswith(".whl"):
        raise InvalidEnvironment(f"package {package.id} has no wheel file name: {package.filename!r}")
    target = directory / package.filename
    digest = hashlib.sha256()
    parsed = urllib.parse.urlsplit(package.url)
    try:
        with target.open("wb") as writer:
            for chunk in _read(package, parsed):
                digest.update(chunk)
                writer.write(chunk)
    except (OSError, httpx.HTTPError) as error:
        raise InvalidEnvironment(f"package {package.id}: cannot fetch its wheel: {error}") from None
    if digest.hexdigest() != package.sha256:
        raise InvalidEnvironment(f"package {package.id}: the fetched wheel's SHA-256 is not the pushed one's")
    return target


def _read(package: Package, parsed: urllib.parse.SplitResult) -> Iterator[bytes]:
    """Yield the bytes of ``package``'s wheel from a ``file://`` URL, or over https (or http on
    loopback) through the engine's egress (``engine.egress``: a sandbox reaches storage that way)."""
    if parsed.scheme == "file":
        with Path(urllib.request.url2pathname(parsed.path)).open("rb") as reader:
            while chunk := reader.read(_CHUNK):
                yield chunk
    elif parsed.scheme == "https" or (parsed.scheme == "http" and parsed.hostname in ("127.0.0.1", "localhost")):
        with (
            httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=False, transport=egress.transport()) as client,
            client.stream("GET", package.url) as response,
        ):
            response.raise_for_status()
            yield from response.iter_bytes(_CHUNK)
    else:
        raise InvalidEnvironment(f"package {package.id}: cannot fetch from a {parsed.scheme or 'relative'} URL")


def install_packages(packages: list[Package], workdir: Path, *, build_python: Path | None = None) -> Path | None:
    """Install ``packages`` into ``workdir/environments/site`` (`install_wheels`), load each and
    register its environment in the catalogue (`load_packages`); return the site directory (None
    without packages). Raises InvalidEnvironment as those two do.
    """
    if not packages:
        return None
    site = install_wheels(packages, workdir)
    load_packages(packages, site, build_python=build_python)
    return site


def install_wheels(packages: list[Package], workdir: Path) -> Path:
    """Fetch and check each package's wheel, install them all into ``workdir/environments/site``
    (afresh) and append that directory to ``sys.path``; return it.

    Raises InvalidEnvironment with a one-line message for a wheel that cannot be fetched or does
    not match its SHA-256, and a failed install.
    """
    root = workdir / "environments"
    shutil.rmtree(root, ignore_errors=True)  # a new attempt installs afresh
    wheels_dir, site = root / "wheels", root / "site"
    wheels_dir.mkdir(parents=True)
    wheels = [_fetch(package, wheels_dir) for package in packages]
    command = [
        *build_envs.uv_command(), "pip", "install", "--quiet", "--no-deps", "--no-index", "--offline", "--no-cache",
        "--python", sys.executable, "--target", str(site), *map(str, wheels),
    ]
    uv_environment = child_environment(UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=uv_environment, check=False)
    except subprocess.TimeoutExpired:
        raise InvalidEnvironment(f"installing the environment packages took more than {INSTALL_TIMEOUT_S} s") from None
    except OSError as error:
        raise InvalidEnvironment(f"the engine cannot run uv to install the environment packages: {error}") from None
    if result.returncode != 0:
        last = next((line for line in reversed(result.stderr.splitlines()) if line.strip()), "no output")
        raise InvalidEnvironment(f"uv could not install the environment packages: {last.strip()[:300]}")
    if str(site) not in sys.path:
        sys.path.append(str(site))
    importlib.invalidate_caches()
    return site


def load_packages(
    packages: list[Package], site: Path, *, build_python: Path | None = None, bridges: dict[str, verifiers_taskset.Bridge] | None = None,
) -> None:
    """Load each of ``packages``, installed in ``site`` (`install_wheels`): a Lab-protocol one by
    importing it, a verifiers one through a verifiers bridge, a ``load_environment`` one on its
    build; register its environment in the catalogue (``engine.catalog.list_environments``).

    ``build_python`` stands for the environment of a ``load_environment`` package's build: the
    Python of an environment where its requirements are installed already (``lab envs try``),
    whose bridge then starts without installing the build's lock. ``bridges`` holds, by package
    id, a bridge already started for a package (`start_bridge`), which loads it instead of a new one.

    Raises InvalidEnvironment with a one-line message for an import that needs a module the
    engine's (or the verifiers) environment lacks (named in the message), an entry point that is
    not a ``lab_environments.Environment`` subclass, and a verifiers package that wants another
    verifiers version or exports no usable Taskset.
    """
    for package in packages:
        _load(package, site, build_python, (bridges or {}).get(package.id))


def start_bridge(package: Package, site: Path, *, build_python: Path | None = None) -> verifiers_taskset.Bridge:
    """Start the bridge the verifiers ``package`` (installed in ``site``) runs in, as
    `load_packages` starts it: the ``load_environment`` bridge on its build (``build_python`` as
    `load_packages` takes it) for a package whose ``build`` is verifiers' v0 API, else the
    verifiers bridge. Raises InvalidEnvironment as `load_packages` does."""
    if _on_build(package):
        return _start_on_build(package, site, build_python)
    return _start_verifiers(package, site, _distribution(package, site))


def entry_point_of(package: Package, site: Path) -> str | None:
    """The ``module:Class`` of the ``lab.environments`` entry point that ``package``, installed
    in ``site``, declares (a Lab-protocol package), or None (a verifiers package)."""
    points = [point for point in _distribution(package, site).entry_points if point.group == ENTRY_POINT_GROUP]
    return points[0].value if points else None


def _distribution(package: Package, site: Path) -> importlib.metadata.Distribution:
    wanted = package.name.replace("-", "_").lower()
    for distribution in importlib.metadata.distributions(path=[str(site)]):
        if (distribution.metadata["Name"] or "").replace("-", "_").replace(".", "_").lower() == wanted:
            return distribution
    raise InvalidEnvironment(f"package {package.id} installed no distribution named {package.name}")


def _import(package: Package, module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == module.split(".")[0]:
            raise InvalidEnvironment(f"environment {package.id}: its package has no module '{error.name}'") from None
        raise InvalidEnvironment(not_in_engine(f"environment {package.id} needs the module '{error.name}'")) from None
    except Exception as error:  # the package's own code failed while importing
        message = " ".join(str(error).split())[:300]
        raise InvalidEnvironment(f"environment {package.id}: importing it failed: {type(error).__name__}: {message}") from None


def _fetch_locked(package: Package):
    """``fetch(entry, folder)`` for ``engine.build_envs``: one wheel of ``package``'s build's lock,
    fetched and checked as a package's own wheel is."""

    def fetch(entry: dict, folder: Path) -> Path:
        try:
            wheel = Package(id=package.id, sha256=entry["sha256"], url=entry["url"], filename=entry["filename"])
        except (KeyError, TypeError):
            raise InvalidEnvironment(f"package {package.id}: its build's lock is not a list of wheels") from None
        return _fetch(wheel, folder)

    return fetch


def _url_reader(package: Package):
    """``read(url)`` for ``engine.dataset_snapshots``: the chunks at ``url``, read as a package's
    own wheel is (``file://``, or through the engine's egress); a failed download is an OSError."""

    def read(url: str) -> Iterator[bytes]:
        try:
            yield from _read(Package(id=package.id, sha256="", url=url, filename=""), urllib.parse.urlsplit(url))
        except httpx.HTTPError as error:
            raise OSError(str(error)) from None

    return read


def _on_build(package: Package) -> bool:
    return bool(package.build and package.build.get("api") == "v0")


def _load(package: Package, site: Path, build_python: Path | None, bridge: verifiers_taskset.Bridge | None = None) -> None:
    if _on_build(package):
        _register_bridge(package, site, bridge or _start_on_build(package, site, build_python))
        return
    distribution = _distribution(package, site)
    entry_points = [point for point in distribution.entry_points if point.group == ENTRY_POINT_GROUP]
    if not entry_points:
        _register_bridge(package, site, bridge or _start_verifiers(package, site, distribution))
        return
    point = entry_points[0]
    module = _import(package, point.module)
    target = module
    for attribute in (point.attr or "").split("."):
        target = getattr(target, attribute, None)
    if not (isinstance(target, type) and issubclass(target, Environment)):
        raise InvalidEnvironment(f"environment {package.id}: {point.value} is not a lab_environments.Environment subclass")
    declared = getattr(target, "info", None)
    info = EnvironmentInfo(
        id=package.id,
        name=package.name,
        description=getattr(declared, "description", "") or distribution.metadata["Summary"] or "",
        args=dict(getattr(declared, "args", {}) or {}),
    )
    register_installed(package.id, type(target.__name__, (target,), {"info": info, "__module__": target.__module__}))
    register_environment(info)


def _start_verifiers(package: Package, site: Path, distribution: importlib.metadata.Distribution) -> verifiers_taskset.Bridge:
    """Start a verifiers bridge for the package, checking the verifiers version it requires."""
    from packaging.requirements import InvalidRequirement, Requirement

    specifier = ""
    for line in distribution.requires or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name.lower() == "verifiers" and requirement.marker is None:
            specifier = str(requirement.specifier)
    return verifiers_taskset.start_bridge(package_id=package.id, site=site, workdir=site.parents[1], requires_verifiers=specifier)


def _register_bridge(package: Package, site: Path, bridge: verifiers_taskset.Bridge) -> None:
    """Read the arguments of the environment ``bridge`` loads and register it."""
    info = verifiers_taskset.describe(
        bridge, package_id=package.id, name=package.name, summary=_distribution(package, site).metadata["Summary"] or "",
    )
    register_installed(package.id, verifiers_taskset.environment_class(info, bridge))
    register_environment(info)


def _start_on_build(package: Package, site: Path, build_python: Path | None) -> verifiers_taskset.Bridge:
    """Install ``package``'s build (or find it installed; ``build_python`` instead when given),
    unpack the organization's pushed datasets the build lists (``engine.dataset_snapshots``: the
    bridge starts among them) and the Hugging Face datasets it fetched (its ``hub_datasets``: the
    bridge's ``HF_HOME``, read offline) and start its ``load_environment`` bridge with the build's Python."""
    lock = package.build.get("lock")
    if not isinstance(lock, list):
        raise InvalidEnvironment(f"package {package.id}: its build's lock is not a list of wheels")
    workdir = site.parents[1]
    started = time.monotonic()
    if build_python is None:
        python, installed = build_envs.ensure_environment(package.id, lock, workdir, _fetch_locked(package), log=logger.info)
    else:
        python, installed = build_python, False
    datasets = dataset_snapshots.unpack_snapshots(
        list(package.build.get("datasets") or []), workdir, _url_reader(package), package_id=package.id,
    )
    hf_home = dataset_snapshots.unpack_hub_datasets(package.build.get("hub_datasets"), workdir, _url_reader(package), package_id=package.id)
    ready = time.monotonic()
    bridge = verifiers_taskset.start_load_environment_bridge(
        package_id=package.id, python=python, site=site, workdir=workdir, secret_names=list(package.build.get("secrets") or []),
        cwd=datasets, hf_home=hf_home,
    )
    logger.info(
        "environment %s runs on build %s: its environment %s in %.2f s, its bridge started in %.2f s",
        package.id, package.build.get("number"), "installed" if installed else "found installed",
        ready - started, time.monotonic() - ready,
    )
    return bridge
