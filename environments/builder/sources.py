"""Source archives in a build's lock: each built into a wheel for the engine's Python, once per
archive, Python and platform (``build_source_distributions``), in bubblewrap, with a uv cache and
folder of its own, reaching the package index from a network namespace of its own
(``environments.builder.network``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from packaging.tags import sys_tags

from environments.builder import network
from environments.builder.downloads import download as _download
from environments.builder.steps import (
    STEP_TIMEOUT_S,
    BuildFailed,
    BuildRequest,
    engine_python_version,
    log,
    uv_environment,
)


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file at ``path``."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _built_record(request: BuildRequest, entry: dict[str, Any], python_version: str) -> Path:
    """Where the wheelhouse records the wheel built from the source archive ``entry`` for the
    engine's Python and platform: ``built/<archive sha256>/<python version>-<platform tag>.json``."""
    platform_tag = next(iter(sys_tags())).platform
    return request.wheelhouse / "built" / entry["sha256"] / f"{python_version}-{platform_tag}.json"


def build_source_distributions(request: BuildRequest, lock: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace each source archive of ``lock`` by a wheel built from it for the engine's Python,
    stored in the wheelhouse like any wheel (``<sha256>/<file name>``), so that jobs install
    wheels only, offline. A wheel built from the same archive for the same Python and platform
    before is reused (``_built_record``); otherwise the archive is downloaded (its SHA-256 checked)
    and built by ``uv build --wheel``, which installs the build backend its ``pyproject.toml``
    names (setuptools for a ``setup.py`` alone) from the same index as of the same time: the
    archive's setup code runs in the builder's process tree (in bubblewrap when ``request.sandbox``),
    never in Lab's web or worker process. Raises BuildFailed naming the distribution and uv's message (a build backend the
    index lacks is named there)."""
    if not any(entry.get("sdist") for entry in lock):
        return lock
    python_version = engine_python_version(request.python)
    built_lock = []
    for entry in lock:
        if not entry.get("sdist"):
            built_lock.append(entry)
            continue
        record = _built_record(request, entry, python_version)
        wheel = json.loads(record.read_text()) if record.is_file() else None
        if wheel is not None and (request.wheelhouse / wheel["sha256"] / wheel["filename"]).is_file():
            log(f"{entry['filename']}: the wheel built from it before, {wheel['filename']}")
        else:
            # Each archive is built in a folder of its own, made after the previous build ended: the
            # setup code of one cannot plant anything (a poisoned build backend in uv's cache) that
            # the build of the next reads, whose wheel the shared record below gives every organization.
            fresh = Path(tempfile.mkdtemp(dir=request.workdir, prefix="sdist-"))
            wheel = _build_wheel(dataclasses.replace(request, workdir=fresh), entry)
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(wheel))
        built_lock.append({"name": entry["name"], "version": entry["version"], **wheel, "url": ""})
    return built_lock


def _build_wheel(request: BuildRequest, entry: dict[str, Any]) -> dict[str, str]:
    """Build the source archive ``entry`` into a wheel in the wheelhouse; return its ``{"filename", "sha256"}``."""
    sources = request.workdir / "sdists"
    archive = sources / entry["filename"]
    _download(entry["url"], archive, entry["sha256"])
    out = sources / f"{entry['name']}-wheel"
    # The archive's setup code runs in bubblewrap with a uv cache of its own: it can write to
    # nothing but this build's folder, not to the shared wheelhouse or uv cache that other builds
    # read; its build backend comes from the index, reached from a network namespace of its own
    # (environments.builder.network), never the host's.
    environment = {**uv_environment(request), "UV_CACHE_DIR": str(sources / "uv-cache")}

    def command(index_url: str) -> list[str]:
        return [request.uv, "build", "--wheel", str(archive), "--out-dir", str(out), "--index-url", index_url,
                "--exclude-newer", request.exclude_newer, "--python", request.python, "--no-config", "--quiet"]

    log(f"building a wheel of {entry['name']} {entry['version']} from its source archive {entry['filename']}"
        + (" (in bubblewrap)" if request.sandbox else ""))
    started = time.monotonic()
    result = network.index_step(request, command, environment=environment, cwd=sources, timeout=STEP_TIMEOUT_S, refuse=True,
                                what=f"building a wheel of {entry['name']} {entry['version']} from its source archive {entry['filename']}")
    print(result.stdout + result.stderr, end="", flush=True)
    wheels = sorted(out.glob("*.whl")) if out.is_dir() else []
    if result.returncode != 0 or len(wheels) != 1:
        message = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("warning:")).strip()
        raise BuildFailed(
            f"{entry['name']} {entry['version']} is a source archive on {request.index_url} ({entry['filename']}), and "
            f"building a wheel of it failed: {message[-1500:] or f'uv build exited {result.returncode}'}"
        )
    sha256 = file_sha256(wheels[0])
    target = request.wheelhouse / sha256 / wheels[0].name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(wheels[0]), target)
    log(f"built {wheels[0].name} in {time.monotonic() - started:.1f} s")
    return {"filename": wheels[0].name, "sha256": sha256}
