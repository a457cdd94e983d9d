"""One environment build (the steps are the package docstring's): ``run_build`` and its command line.

Errors that the package's author can fix end the build ``failed`` with a message naming the fix
(``BuildFailed``); the log (stdout) holds the details: the resolver's whole message, the package's
traceback. Paths: ``workdir`` is this build's own scratch folder (its venv, lock files, probe
output), ``wheelhouse`` the shared folder of wheels by SHA-256.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from environments.wheels import InvalidWheel, WheelInfo, read_wheel

#: verifiers' last release with the ``load_environment`` API (0.4.0 removed it).
V0_VERIFIERS_CAP = "verifiers<0.4"
#: The longest a resolve, a download or an install may take, in seconds.
STEP_TIMEOUT_S = 900
#: The longest loading the environment with its defaults may take, in seconds.
PROBE_TIMEOUT_S = 300
_CHUNK = 1024 * 1024


class BuildFailed(Exception):
    """The build cannot go on; the message says why and what to change (the build's ``error``)."""


@dataclass(frozen=True)
class BuildRequest:
    """What one build needs: the wheel, the index and cut-off to resolve against, and where to work.

    ``exclude_newer`` is an RFC 3339 timestamp (the version's push time, or a rebuild's snapshot);
    ``python`` the engine's interpreter the environment is built for; ``sandbox`` whether the
    import step runs in bubblewrap (``sandbox_command``); ``cache`` uv's cache (default beside the wheelhouse).
    """

    wheel: Path
    index_url: str
    exclude_newer: str
    wheelhouse: Path
    workdir: Path
    python: str = sys.executable
    uv: str = ""
    sandbox: bool = False
    cache: Path | None = None


def log(message: str) -> None:
    print(f"[build {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _run(command: list[str], *, timeout: float = STEP_TIMEOUT_S, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``command``, its output (both streams) captured as text; the caller reads ``returncode``."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"'{Path(command[0]).name} {command[1] if len(command) > 1 else ''}' took longer than {timeout:.0f} s") from None


def _uv_environment(request: BuildRequest) -> dict[str, str]:
    """A minimal environment for uv: no ``UV_*``/``PIP_*`` setting of the host, its cache in the wheelhouse's parent."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY")
    environment = {name: os.environ[name] for name in keep if name in os.environ}
    environment["UV_NO_CONFIG"] = "1"
    environment["UV_CACHE_DIR"] = str(request.cache or request.wheelhouse.parent / "uv-cache")
    environment["UV_PYTHON_DOWNLOADS"] = "never"
    return environment


def _engine_python_version(python: str) -> str:
    if Path(python).resolve() == Path(sys.executable).resolve():
        return ".".join(map(str, sys.version_info[:3]))
    result = _run([python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"], timeout=60)
    return result.stdout.strip()


def check_python(info: WheelInfo, python_version: str) -> None:
    """Refuse a ``Requires-Python`` that ``python_version`` (the engine's) does not satisfy."""
    if not info.requires_python:
        return
    try:
        specifier = SpecifierSet(info.requires_python)
    except InvalidSpecifier:
        raise BuildFailed(f"its Requires-Python '{info.requires_python}' is not a valid specifier (PEP 440)") from None
    if not specifier.contains(python_version, prereleases=True):
        raise BuildFailed(
            f"it needs Python {info.requires_python} (its Requires-Python), and Lab's engine runs Python {python_version}: "
            f"publish a version whose Requires-Python admits Python {python_version}"
        )


def module_source(wheel: Path, module: str) -> str:
    """The source of the package's top-level module (``module/__init__.py`` or ``module.py``), or ``""``."""
    with zipfile.ZipFile(wheel) as archive:
        for name in (f"{module}/__init__.py", f"{module}.py"):
            try:
                return archive.read(name).decode("utf-8", errors="replace")
            except KeyError:
                continue
    return ""


def is_load_environment_module(source: str) -> bool:
    """Whether a module defines or imports ``load_environment`` at top level and names no ``Taskset``
    (verifiers' v0 form, which verifiers 0.4.0 no longer runs), read without running it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    defines = any(
        (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment")
        or (isinstance(node, ast.ImportFrom) and any((alias.asname or alias.name) == "load_environment" for alias in node.names))
        for node in tree.body
    )
    return defines and "Taskset" not in source


def resolve(request: BuildRequest, info: WheelInfo, *, cap_verifiers: bool) -> list[dict[str, Any]]:
    """Resolve the package's ``Requires-Dist`` with uv; return the lock: one entry per distribution,
    ``{"name", "version", "filename", "url", "sha256"}``, the wheel for the engine's Python."""
    for line in info.dependencies:
        if Requirement(line).url:
            raise BuildFailed(
                f"its requirement '{line[:200]}' is a direct reference (a URL or a path), and builds resolve "
                "requirements from the package index only: require the distribution by name and version"
            )
    requirements = [line for line in info.dependencies if Requirement(line).marker is None or "extra" not in str(Requirement(line).marker)]
    if not requirements:
        log("no requirements: the lock is empty")
        return []
    (request.workdir / "requirements.in").write_text("".join(f"{line}\n" for line in requirements))
    command = [
        request.uv, "pip", "compile", str(request.workdir / "requirements.in"),
        "--index-url", request.index_url,
        "--exclude-newer", request.exclude_newer,
        "--only-binary", ":all:",
        "--python", request.python,
        "--format", "pylock.toml",
        "--output-file", str(request.workdir / "pylock.toml"),
        "--no-header", "--quiet",
    ]
    if cap_verifiers:
        (request.workdir / "constraints.txt").write_text(f"{V0_VERIFIERS_CAP}\n")
        command += ["--constraint", str(request.workdir / "constraints.txt")]
    log(f"resolving {len(requirements)} requirements against {request.index_url} as of {request.exclude_newer}"
        + (f", with {V0_VERIFIERS_CAP}" if cap_verifiers else ""))
    result = _run(command, env=_uv_environment(request))
    print(result.stdout + result.stderr, end="", flush=True)
    if result.returncode != 0:
        message = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("warning:")).strip()
        raise BuildFailed(
            f"its requirements cannot be met from {request.index_url} as of {request.exclude_newer} "
            f"(wheels for Python {_engine_python_version(request.python)} only): {message[-2000:]}"
        )
    lock = tomllib.loads((request.workdir / "pylock.toml").read_text())
    return [_locked_wheel(package) for package in lock.get("packages", [])]


def _locked_wheel(package: dict[str, Any]) -> dict[str, Any]:
    """The wheel of a pylock.toml package entry that the engine's interpreter installs (its best tag)."""
    rank = {tag: index for index, tag in enumerate(sys_tags())}
    candidates = []
    for wheel in package.get("wheels", []):
        location = wheel.get("url") or wheel.get("path", "")
        filename = wheel.get("name") or urllib.parse.unquote(urllib.parse.urlsplit(location).path.rsplit("/", 1)[-1])
        best = min((rank[tag] for tag in parse_wheel_filename(filename)[3] if tag in rank), default=None)
        if best is not None:
            candidates.append((best, filename, location, wheel["hashes"]["sha256"]))
    if not candidates:
        raise BuildFailed(f"{package['name']} {package['version']} has no wheel for this Python and platform; Lab builds install wheels only")
    _, filename, location, sha256 = min(candidates)
    return {"name": str(canonicalize_name(package["name"])), "version": package["version"], "filename": filename, "url": location, "sha256": sha256}


def fetch(request: BuildRequest, lock: list[dict[str, Any]]) -> Path:
    """Put every locked wheel in the wheelhouse (``<sha256>/<file name>``; present ones are kept),
    checking each download's SHA-256; return a folder of links to them (a ``--find-links``)."""
    links = request.workdir / "wheels"
    links.mkdir(exist_ok=True)
    fetched = fetched_bytes = 0
    for entry in lock:
        target = request.wheelhouse / entry["sha256"] / entry["filename"]
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.part")
            digest = hashlib.sha256()
            with urllib.request.urlopen(entry["url"], timeout=120) as response, partial.open("wb") as out:
                while chunk := response.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != entry["sha256"]:
                partial.unlink()
                raise BuildFailed(f"{entry['filename']} from the index does not have the SHA-256 the index gave for it")
            partial.replace(target)
            fetched += 1
            fetched_bytes += target.stat().st_size
        (links / entry["filename"]).unlink(missing_ok=True)
        (links / entry["filename"]).symlink_to(target)
    log(f"wheelhouse: {len(lock)} wheels, {fetched} fetched ({fetched_bytes / 1e6:.1f} MB), {len(lock) - fetched} already there")
    return links


def install(request: BuildRequest, lock: list[dict[str, Any]], links: Path) -> Path:
    """Create the build's fresh venv and install the lock (offline, hashes checked), then the package; return its Python."""
    venv = request.workdir / "venv"
    environment = _uv_environment(request)
    result = _run([request.uv, "venv", "--quiet", "--python", request.python, str(venv)], env=environment)
    if result.returncode != 0:
        raise BuildFailed(f"could not create the build's virtual environment: {result.stderr.strip()[-500:]}")
    python = str(venv / "bin" / "python")
    offline = ["--python", python, "--offline", "--no-index", "--find-links", str(links), "--quiet"]
    if lock:
        (request.workdir / "lock.txt").write_text(
            "".join(f"{entry['name']}=={entry['version']} --hash=sha256:{entry['sha256']}\n" for entry in lock)
        )
        result = _run([request.uv, "pip", "install", *offline, "--require-hashes", "--no-deps", "-r", str(request.workdir / "lock.txt")], env=environment)
        if result.returncode != 0:
            raise BuildFailed(f"installing the locked wheels failed: {result.stderr.strip()[-1500:]}")
    result = _run([request.uv, "pip", "install", *offline, "--no-deps", str(request.wheel)], env=environment)
    if result.returncode != 0:
        raise BuildFailed(f"installing the package's wheel failed: {result.stderr.strip()[-1500:]}")
    log(f"installed {len(lock)} distributions and the package into a fresh environment")
    return Path(python)


def _site_packages(venv_python: Path) -> Path:
    return next((venv_python.parent.parent / "lib").glob("python*/site-packages"))


#: System folders the import step sees, read-only, where present (programs, libraries, certificates, the loader's cache);
#: of /etc/ssl only the certificates and OpenSSL's configuration, never ``private`` (the host's keys).
_SANDBOX_SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates", "/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")


def sandbox_command(readable: list[Path], writable: Path, *, frozen: Path | None = None) -> list[str]:
    """The ``bwrap`` prefix the import step runs under: its own namespaces of every kind (so no
    network at all: the package is installed already), an empty root with only the system's
    programs and libraries, the Python installations in ``readable`` read-only and the build's
    own ``writable`` folder but ``frozen`` in it, read-only: the build's venv, whose files uv
    hard-links from the cache that later builds install from; nothing of Lab's data,
    configuration or other builds."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise BuildFailed(
            "bubblewrap (bwrap) is not installed, and builds import packages in its sandbox: install it "
            "(apt-get install bubblewrap), or set LAB_LOCAL_ISOLATION=none where every package is trusted"
        )
    args = [bwrap, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    for path in _SANDBOX_SYSTEM:
        args += ["--ro-bind-try", path, path]
    for path in sorted({path.resolve() for path in readable}):
        args += ["--ro-bind", str(path), str(path)]
    args += ["--bind", str(writable), str(writable)]
    if frozen is not None:
        args += ["--ro-bind", str(frozen), str(frozen)]
    return [*args, "--chdir", str(writable), "--"]


def probe(request: BuildRequest, info: WheelInfo, venv_python: Path) -> dict[str, Any]:
    """Import the module and load the environment with its defaults (``probe.py``); return its summary."""
    folder = request.workdir / "probe"
    folder.mkdir(exist_ok=True)
    script = folder / "lab_build_probe.py"
    shutil.copyfile(Path(__file__).with_name("probe.py"), script)
    out = folder / "summary.json"
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8", "TMPDIR": str(folder),
                   "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "UV_OFFLINE": "1", "PIP_NO_INDEX": "1"}
    pythons = [Path(sys.base_prefix), Path(sys.prefix), Path(request.python).resolve().parent.parent]
    if info.kind == "lab":
        # A Lab-protocol package runs in the engine's own process: probe it with the engine's Python,
        # the engine's code first on its path and the package's environment after it.
        engine_root = Path(__file__).resolve().parents[2]
        environment["PYTHONPATH"] = os.pathsep.join([str(engine_root), str(_site_packages(venv_python))])
        command = [request.python, str(script)]
        pythons += [engine_root / "engine", engine_root / "sdk"]
    else:
        command = [str(venv_python), "-I", str(script)]
    command += [info.module, info.kind, info.entry_point, str(out)]
    sandbox = sandbox_command(pythons, request.workdir, frozen=request.workdir / "venv") if request.sandbox else []
    log(f"importing {info.module} and loading it with its defaults" + (" (in bubblewrap, no network)" if sandbox else ""))
    started = time.monotonic()
    result = _run([*sandbox, *command], timeout=PROBE_TIMEOUT_S, env=environment)
    print(result.stdout + result.stderr, end="", flush=True)
    if result.returncode != 0 or not out.is_file():
        raise BuildFailed(f"importing and loading the environment crashed (exit {result.returncode}); the build log has its output")
    summary = json.loads(out.read_text())
    if summary.get("error"):
        raise BuildFailed(summary["error"])
    log(f"loaded in {time.monotonic() - started:.1f} s: {summary['api']} {summary['environment_class']}")
    return summary


def run_build(request: BuildRequest) -> dict[str, Any]:
    """Run every step; return the result object (the package docstring's), ``failed`` with the error on ``BuildFailed``."""
    request.workdir.mkdir(parents=True, exist_ok=True)
    request.wheelhouse.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {"status": "failed", "error": None, "python": _engine_python_version(request.python), "lock": [], "summary": {}}
    try:
        try:
            with request.wheel.open("rb") as handle:
                info = read_wheel(handle, filename=request.wheel.name)
        except InvalidWheel as error:
            raise BuildFailed(f"not an acceptable environment wheel: {error}") from None
        log(f"{info.name} {info.version} ({info.kind}), engine Python {result['python']}")
        check_python(info, result["python"])
        cap = info.kind == "verifiers" and is_load_environment_module(module_source(request.wheel, info.module))
        lock = resolve(request, info, cap_verifiers=cap)
        result["lock"] = [{key: entry[key] for key in ("name", "version", "filename", "sha256")} for entry in lock]
        links = fetch(request, lock)
        venv_python = install(request, lock, links)
        result["summary"] = probe(request, info, venv_python)
        result["status"] = "ready"
    except BuildFailed as error:
        result["error"] = str(error)
        log(f"failed: {error}")
    log(f"{result['status']} in {time.monotonic() - started:.1f} s")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m environments.builder", description="Build one environment package.")
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--index-url", required=True)
    parser.add_argument("--exclude-newer", required=True, help="RFC 3339 time: the index as it was then")
    parser.add_argument("--wheelhouse", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True, help="where the result JSON is written")
    parser.add_argument("--python", default=sys.executable, help="the engine's Python (default: this one)")
    parser.add_argument("--uv", default=shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv")
    parser.add_argument("--sandbox", choices=["bubblewrap", "none"], default="bubblewrap", help="where the import step runs")
    parser.add_argument("--cache", type=Path, default=None, help="uv's cache folder")
    args = parser.parse_args(argv)
    request = BuildRequest(
        wheel=args.wheel.resolve(), index_url=args.index_url, exclude_newer=args.exclude_newer,
        wheelhouse=args.wheelhouse.resolve(), workdir=args.workdir.resolve(), python=args.python, uv=args.uv,
        sandbox=args.sandbox == "bubblewrap", cache=args.cache,
    )
    result = run_build(request)
    args.result.write_text(json.dumps(result))
    return 0
