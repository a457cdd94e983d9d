"""Reading an environment wheel's metadata from its zip, without ever importing or running it.

A wheel is a zip (PEP 427, the "binary distribution format" of the Python Packaging User Guide)
with one ``<name>-<version>.dist-info/`` directory holding ``WHEEL``, ``METADATA`` (core metadata,
PEP 566: ``Name``, ``Version``, ``Requires-Dist``), ``RECORD`` (a CSV of every file with its
``sha256=<urlsafe base64, unpadded>`` digest and size) and optionally ``entry_points.txt`` (an INI
file of entry point groups). ``read_wheel`` checks every member's path and size, re-hashes every
file against RECORD, and checks that the file name, the dist-info directory and METADATA agree;
anything else is an ``InvalidWheel`` with a message saying what is wrong.

Two package forms are accepted (docs/environments.md):

- ``verifiers``: verifiers' own plugin convention: a top-level module named after the
  environment (``my-env`` -> ``my_env``) whose ``__all__`` exports its ``Taskset`` subclass,
  and ``Requires-Dist: verifiers...`` (the version it targets);
- ``lab``: Lab's environment protocol (``lab_environments.Environment``), declared by exactly
  one entry point in the ``lab.environments`` group, ``<name> = <module>:<class>``.
"""

from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import importlib.machinery
import io
import posixpath
import re
import stat
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from typing import BinaryIO

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

#: The largest wheel accepted, in bytes (docs/api.md "Conventions": uploads up to 100 MB).
MAX_WHEEL_BYTES = 100 * 1024 * 1024
#: The most members a wheel may have.
MAX_MEMBERS = 10_000
#: The most bytes all members may expand to (what RECORD's check reads).
MAX_UNCOMPRESSED_BYTES = 512 * 1024 * 1024
#: A member larger than ``_RATIO_FLOOR`` bytes that expands more than this many times is a zip bomb
#: (source code compresses 3-10x; deflate's own ceiling is about 1032x).
MAX_COMPRESSION_RATIO = 200
_RATIO_FLOOR = 1024 * 1024
#: The largest METADATA, WHEEL or entry_points.txt read, in bytes; RECORD may be larger.
MAX_METADATA_BYTES = 256 * 1024
MAX_RECORD_BYTES = 4 * 1024 * 1024
#: The entry point group of Lab's own environment protocol.
ENTRY_POINT_GROUP = "lab.environments"
#: Top-level modules a package may not be named after: importing it would find these instead.
RESERVED_MODULES = frozenset(sys.stdlib_module_names) | {"engine", "labsdk", "lab_environments", "torch", "transformers", "verifiers"}
#: verifiers' own tasksets (``verifiers.v1.tasksets.<name>``, version 0.4.0): its loader imports one of
#: these before a package's module of the same name (``verifiers/v1/utils/loaders.py``, ``_import_plugin``).
VERIFIERS_BUILTIN_TASKSETS = frozenset({"harbor", "nemo_gym", "openenv", "textarena"})
_CHUNK = 1024 * 1024
#: A project name as PEP 508 spells it ("Names", ASCII only); ``re.ASCII`` keeps IGNORECASE from
#: letting the Kelvin sign or the long s stand in for k and s, as packaging's own pattern does.
_PEP_508_NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9]", re.IGNORECASE | re.ASCII)


class InvalidWheel(ValueError):
    """The upload is not an acceptable environment wheel; the message says why (a 400)."""


@dataclass(frozen=True)
class WheelInfo:
    """What Lab records of an environment wheel, all read from its metadata.

    ``name`` is the normalized project name (PEP 503: ``my-env``), ``version`` the normalized
    version (PEP 440), ``module`` the top-level module the engine imports, ``entry_point`` what it
    loads (``my_env`` for a verifiers package, ``my_env.env:MyEnv`` for a Lab one),
    ``dependencies`` the ``Requires-Dist`` lines as written, ``verifiers_version`` the specifier
    of its verifiers requirement (``">=0.4.0"``; ``""`` when it has none).
    """

    filename: str
    name: str
    version: str
    kind: str
    module: str
    entry_point: str
    summary: str = ""
    dependencies: list[str] = field(default_factory=list)
    verifiers_version: str = ""
    requires_python: str = ""


def _check_name(name: str, where: str) -> None:
    """Refuse a project name that is not PEP 508's (ASCII letters, digits, ``-``, ``_``, ``.``)."""
    if not _PEP_508_NAME.fullmatch(name):
        raise InvalidWheel(
            f"{where} names the package '{name[:100]}': a package name is ASCII letters, digits, '-', '_' and '.' (PEP 508)"
        )


def _check_filename(filename: str) -> tuple[str, Version]:
    if not filename or "/" in filename or "\\" in filename or "\x00" in filename or len(filename) > 200:
        raise InvalidWheel("the file name must be a wheel's own name (name-version-python-abi-platform.whl)")
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as error:
        raise InvalidWheel(f"not a wheel file name: {error}") from None
    _check_name(filename.partition("-")[0], "the file name")
    if any(tag.abi != "none" or tag.platform != "any" for tag in tags):
        raise InvalidWheel(f"'{filename}' is built for one platform; environment packages must be pure Python (-none-any.whl)")
    return str(name), version


def _check_member(info: zipfile.ZipInfo, seen: set[str]) -> None:
    name = info.filename
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or ":" in parts[0]
        or any(part in ("..", ".") for part in parts)
        or posixpath.normpath(name).startswith("..")
    ):
        raise InvalidWheel(f"member '{name[:200]}' points outside the package (absolute or '..' path)")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise InvalidWheel(f"member '{name[:200]}' is a symbolic link")
    if info.flag_bits & 0x1:
        raise InvalidWheel(f"member '{name[:200]}' is encrypted")
    if name in seen:
        raise InvalidWheel(f"member '{name[:200]}' appears twice")
    seen.add(name)
    if info.file_size > _RATIO_FLOOR and info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
        raise InvalidWheel(
            f"member '{name[:200]}' expands {info.file_size // max(info.compress_size, 1)} times "
            f"(more than {MAX_COMPRESSION_RATIO}): refused as a zip bomb"
        )


class _Budget:
    """Bytes that reading members may still expand to; running out is a zip bomb."""

    def __init__(self, total: int):
        self.left = total

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise InvalidWheel(f"the members expand to more than {MAX_UNCOMPRESSED_BYTES // (1024 * 1024)} MB: refused as a zip bomb")


def _read_text(archive: zipfile.ZipFile, name: str, limit: int, budget: _Budget) -> str:
    with archive.open(name) as handle:
        data = handle.read(limit + 1)
    budget.take(len(data))
    if len(data) > limit:
        raise InvalidWheel(f"{name} is larger than {limit // 1024} KB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidWheel(f"{name} is not UTF-8 text") from None
    if "\x00" in text:
        # What is read from these files is stored (summary, Requires-Python), and PostgreSQL's text cannot hold NUL.
        raise InvalidWheel(f"{name} holds NUL characters")
    return text


def _digest(archive: zipfile.ZipFile, name: str, budget: _Budget) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with archive.open(name) as handle:
        while chunk := handle.read(_CHUNK):
            budget.take(len(chunk))
            digest.update(chunk)
            size += len(chunk)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii"), size


def _check_record(archive: zipfile.ZipFile, dist_info: str, files: list[str], budget: _Budget) -> None:
    """Every file is in RECORD with its true SHA-256 and size, and RECORD names nothing else."""
    record_name = f"{dist_info}/RECORD"
    text = _read_text(archive, record_name, MAX_RECORD_BYTES, budget)
    unsigned = {record_name, f"{dist_info}/RECORD.jws", f"{dist_info}/RECORD.p7s"}
    recorded: dict[str, tuple[str, str]] = {}
    try:
        for row in csv.reader(io.StringIO(text)):
            if not row:
                continue
            if len(row) != 3:
                raise InvalidWheel(f"RECORD has a malformed line: {','.join(row)[:200]}")
            path, hash_value, size = row
            recorded[path] = (hash_value, size)
    except csv.Error as error:
        raise InvalidWheel(f"RECORD is not CSV: {error}") from None
    for name in files:
        if name in unsigned:
            continue
        if name not in recorded:
            raise InvalidWheel(f"'{name[:200]}' is in the wheel but not in its RECORD")
        hash_value, size = recorded.pop(name)
        if not hash_value.startswith("sha256="):
            raise InvalidWheel(f"RECORD gives '{name[:200]}' no sha256 digest")
        actual_hash, actual_size = _digest(archive, name, budget)
        if actual_hash != hash_value or (size and size != str(actual_size)):
            raise InvalidWheel(f"RECORD lies about '{name[:200]}': its digest or size differs from the file's")
    missing = [path for path in recorded if path not in unsigned]
    if missing:
        raise InvalidWheel(f"RECORD names '{missing[0][:200]}', which is not in the wheel")


def _entry_point(archive: zipfile.ZipFile, dist_info: str, names: set[str], budget: _Budget) -> str | None:
    """Return ``module:attr`` of the one ``lab.environments`` entry point, or None without one."""
    path = f"{dist_info}/entry_points.txt"
    if path not in names:
        return None
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=True)
    parser.optionxform = str  # entry point names are case-sensitive
    try:
        parser.read_string(_read_text(archive, path, MAX_METADATA_BYTES, budget))
    except configparser.Error as error:
        raise InvalidWheel(f"entry_points.txt is not a valid INI file: {' '.join(str(error).split())[:200]}") from None
    if not parser.has_section(ENTRY_POINT_GROUP):
        return None
    entries = list(parser.items(ENTRY_POINT_GROUP))
    if len(entries) != 1:
        raise InvalidWheel(f"the [{ENTRY_POINT_GROUP}] entry point group must hold exactly one entry, not {len(entries)}")
    value = entries[0][1].strip()
    module, _, attribute = value.partition(":")
    if not module or not attribute or not all(part.isidentifier() for part in [*module.split("."), *attribute.split(".")]):
        raise InvalidWheel(f"the [{ENTRY_POINT_GROUP}] entry point must read module:Class, not '{value[:200]}'")
    return f"{module}:{attribute}"


def _ships_module(names: set[str], module: str) -> bool:
    return f"{module}/__init__.py" in names or f"{module}.py" in names


def read_wheel(handle: BinaryIO, *, filename: str) -> WheelInfo:
    """Read and check the environment wheel in ``handle`` (a seekable binary file) named ``filename``.

    Returns its WheelInfo. Raises InvalidWheel for a name that is not a pure-Python wheel's, a
    file that is not a zip, absolute, ``..``, symlinked, encrypted or repeated members, more than
    ``MAX_MEMBERS`` members, zip bombs (a member expanding more than ``MAX_COMPRESSION_RATIO``
    times, or all of them past ``MAX_UNCOMPRESSED_BYTES``), metadata files past their size limits,
    a missing or second dist-info directory, a RECORD that does not match the files, METADATA whose
    name or version differ from the file name's, an invalid requirement, and a package that is
    neither form (module docstring). Nothing in the wheel is imported or executed.
    """
    name, version = _check_filename(filename)
    try:
        archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError):
        raise InvalidWheel("the file is not a wheel (not a zip archive)") from None
    try:
        with archive:
            return _read_archive(archive, filename=filename, name=name, version=version)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError, ValueError) as error:
        if isinstance(error, InvalidWheel):
            raise
        raise InvalidWheel(f"the zip archive is damaged: {' '.join(str(error).split())[:200]}") from None


def _read_archive(archive: zipfile.ZipFile, *, filename: str, name: str, version: Version) -> WheelInfo:
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise InvalidWheel(f"the wheel has {len(members)} members; at most {MAX_MEMBERS} are allowed")
    seen: set[str] = set()
    for info in members:
        _check_member(info, seen)
    if sum(info.file_size for info in members) > MAX_UNCOMPRESSED_BYTES:
        raise InvalidWheel(f"the members expand to more than {MAX_UNCOMPRESSED_BYTES // (1024 * 1024)} MB: refused as a zip bomb")
    files = [info.filename for info in members if not info.is_dir()]
    names = set(files)
    dist_infos = {path.split("/", 1)[0] for path in files if path.split("/", 1)[0].endswith(".dist-info") and "/" in path}
    if len(dist_infos) != 1:
        raise InvalidWheel(f"a wheel has exactly one .dist-info directory; this one has {len(dist_infos)}")
    dist_info = dist_infos.pop()
    dist_name, _, dist_version = dist_info.removesuffix(".dist-info").rpartition("-")
    if canonicalize_name(dist_name) != name or _version(dist_version, "the .dist-info directory") != version:
        raise InvalidWheel(f"the directory {dist_info} does not match the file name {filename}")
    for required in ("WHEEL", "METADATA", "RECORD"):
        if f"{dist_info}/{required}" not in names:
            raise InvalidWheel(f"the wheel has no {dist_info}/{required}")
    budget = _Budget(MAX_UNCOMPRESSED_BYTES)
    wheel = Parser().parsestr(_read_text(archive, f"{dist_info}/WHEEL", MAX_METADATA_BYTES, budget))
    if not str(wheel.get("Wheel-Version", "")).startswith("1."):
        raise InvalidWheel("WHEEL must declare Wheel-Version 1.x")
    metadata = Parser().parsestr(_read_text(archive, f"{dist_info}/METADATA", MAX_METADATA_BYTES, budget))
    declared_name, declared_version = metadata.get("Name"), metadata.get("Version")
    if not metadata.get("Metadata-Version") or not declared_name or not declared_version:
        raise InvalidWheel("METADATA must declare Metadata-Version, Name and Version")
    _check_name(str(declared_name), "METADATA")
    if canonicalize_name(str(declared_name)) != name:
        raise InvalidWheel(f"METADATA names the package '{str(declared_name)[:100]}', the file name says '{name}'")
    if _version(str(declared_version), "METADATA") != version:
        raise InvalidWheel(f"METADATA says version '{str(declared_version)[:100]}', the file name says '{version}'")
    dependencies, verifiers_version = [], ""
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(str(line))
        except InvalidRequirement as error:
            raise InvalidWheel(f"METADATA has an invalid Requires-Dist '{str(line)[:200]}': {error}") from None
        dependencies.append(str(requirement))
        if canonicalize_name(requirement.name) == "verifiers" and not requirement.marker:
            verifiers_version = str(requirement.specifier)
    _check_record(archive, dist_info, files, budget)
    module = name.replace("-", "_")
    entry_point = _entry_point(archive, dist_info, names, budget)
    if entry_point is not None:
        kind, module = "lab", entry_point.split(":")[0].split(".")[0]
    elif any(canonicalize_name(Requirement(line).name) == "verifiers" for line in dependencies):
        kind, entry_point = "verifiers", module
    else:
        raise InvalidWheel(
            f"'{name}' is neither a verifiers environment (Requires-Dist: verifiers) nor a Lab one "
            f"(an entry point in [{ENTRY_POINT_GROUP}])"
        )
    if not module.isidentifier() or module in RESERVED_MODULES:
        raise InvalidWheel(f"the module '{module}' cannot be an environment's: pick another package name")
    if _importable(module):
        raise InvalidWheel(
            f"the module '{module}' is installed where Lab runs, and the engine would import that one instead "
            "(packages come after its own modules on sys.path): pick another package name"
        )
    if kind == "verifiers" and module in VERIFIERS_BUILTIN_TASKSETS:
        raise InvalidWheel(f"verifiers has a taskset '{module}' of its own, which it would load instead: pick another package name")
    if not _ships_module(names, module):
        raise InvalidWheel(f"the wheel has no top-level module '{module}' ({module}/__init__.py or {module}.py)")
    return WheelInfo(
        filename=filename,
        name=name,
        version=str(version),
        kind=kind,
        module=module,
        entry_point=entry_point,
        summary=str(metadata.get("Summary") or "")[:500],
        dependencies=dependencies,
        verifiers_version=verifiers_version,
        requires_python=str(metadata.get("Requires-Python") or "")[:100],
    )


#: Lab's own import path as it was at start-up, before any engine run in this process appended
#: a job's package directory to it (engine/packages.py).
_LAB_PATH = tuple(sys.path)


def _importable(module: str) -> bool:
    """Whether the top-level ``module`` is a module of Lab's own environment: built in, or found on
    its start-up ``sys.path`` (found, not imported: no code of it runs). The engine appends a job's
    packages to ``sys.path`` (engine/packages.py), so such a package's own module would never load."""
    if module in sys.builtin_module_names:
        return True
    try:
        return importlib.machinery.PathFinder.find_spec(module, list(_LAB_PATH)) is not None
    except (ImportError, ValueError):
        return True


def _version(text: str, where: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise InvalidWheel(f"{where} gives an invalid version '{text[:100]}' (PEP 440)") from None
