"""One environment build (the steps are the package docstring's): ``run_build`` and its command line.

Errors that the package's author can fix end the build ``failed`` with a message naming the fix
(``BuildFailed``); the log (stdout) holds the details: the resolver's whole message, the package's
traceback. Paths: ``workdir`` is this build's own scratch folder (its venv, lock files, probe
output), ``wheelhouse`` the shared folder of wheels by SHA-256.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

from lab_environments import __version__ as PROTOCOL_VERSION
from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from engine.environments import probe as package_probe
from engine.environments import smoke_rollout
from engine.environments.probe import is_load_environment_module, module_source, not_in_engine
from engine.environments.verifiers_taskset import verifiers_python
from environments.builder import hub_datasets, network
from environments.builder.downloads import download as _download
from environments.builder.sandbox import sandbox_command
from environments.builder.sources import build_source_distributions
from environments.builder.steps import (
    NETWORK_VARIABLES,
    STEP_TIMEOUT_S,
    BuildFailed,
    BuildRequest,
    engine_python_version,
    log,
    run_step,
    uv_environment,
)
from environments.wheels import InvalidWheel, WheelInfo, read_wheel

#: The distribution of Lab's environment protocol, which the engine provides to Lab packages.
PROTOCOL_DISTRIBUTION = "lab-environments"
#: verifiers' last release with the ``load_environment`` API (0.4.0 removed it).
V0_VERIFIERS_CAP = "verifiers<0.4"
#: The longest loading the environment with its defaults and its smoke rollout may take, in seconds.
PROBE_TIMEOUT_S = 300
_CHUNK = 1024 * 1024


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


def without_engine_provided(info: WheelInfo) -> WheelInfo:
    """``info`` without the requirement a Lab package's engine meets itself: the environment
    protocol (``lab-environments``), which Lab's engine imports for the package (it is on no
    package index). Raises BuildFailed for a specifier the engine's protocol version does not meet."""
    if info.kind != "lab":
        return info
    kept = []
    for line in info.dependencies:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) != PROTOCOL_DISTRIBUTION:
            kept.append(line)
        elif not requirement.specifier.contains(PROTOCOL_VERSION, prereleases=True):
            raise BuildFailed(
                f"it needs {line}, and Lab's engine provides {PROTOCOL_DISTRIBUTION} {PROTOCOL_VERSION}: "
                f"require a version range that admits {PROTOCOL_VERSION}"
            )
        else:
            log(f"{PROTOCOL_DISTRIBUTION}: provided by the engine ({PROTOCOL_VERSION})")
    return dataclasses.replace(info, dependencies=kept)


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
    options = []
    if cap_verifiers:
        (request.workdir / "constraints.txt").write_text(f"{V0_VERIFIERS_CAP}\n")
        options = ["--constraint", str(request.workdir / "constraints.txt")]

    def command(index_url: str) -> list[str]:
        return [request.uv, "pip", "compile", str(request.workdir / "requirements.in"), "--index-url", index_url,
                "--exclude-newer", request.exclude_newer, "--python", request.python, "--format", "pylock.toml",
                "--output-file", str(request.workdir / "pylock.toml"), "--no-header", "--quiet", *options]

    log(f"resolving {len(requirements)} requirements against {request.index_url} as of {request.exclude_newer}"
        + (f", with {V0_VERIFIERS_CAP}" if cap_verifiers else ""))
    # Reading a source archive's metadata may run its setup code: in bubblewrap, with a uv cache of
    # this build's own (never the one other builds share) and the index reached from a network
    # namespace of its own (environments.builder.network).
    environment = uv_environment(request)
    if request.sandbox:
        environment["UV_CACHE_DIR"] = str(request.workdir / "resolve-cache")
    result = network.index_step(request, command, environment=environment, cwd=request.workdir, timeout=STEP_TIMEOUT_S,
                                what="resolving its requirements", refuse=False)
    print(result.stdout + result.stderr, end="", flush=True)
    if result.returncode != 0:
        message = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("warning:")).strip()
        if "certificate" in message.lower():
            message = "\n".join(line for line in message.splitlines() if not line.startswith("hint:")).strip()
            message += (
                f"\n{request.index_url} could not be verified: the build reaches the index with the CA bundle and proxies "
                "of the environment Lab's worker runs in (SSL_CERT_FILE, SSL_CERT_DIR, HTTPS_PROXY, NO_PROXY): set "
                "SSL_CERT_FILE there to the bundle that verifies it (a company proxy's), then lab envs rebuild"
            )
        raise BuildFailed(
            f"its requirements cannot be met from {request.index_url} as of {request.exclude_newer} "
            f"(for Python {engine_python_version(request.python)}): {message[-2000:]}"
        )
    lock = tomllib.loads((request.workdir / "pylock.toml").read_text())
    return [_locked_distribution(package) for package in lock.get("packages", [])]


def _locked_distribution(package: dict[str, Any]) -> dict[str, Any]:
    """A pylock.toml package entry as a lock entry: its wheel for the engine's interpreter, or,
    where the index has only its source archive, that archive (``"sdist": True``), which
    ``build_source_distributions`` turns into a wheel."""
    if package.get("wheels") or not package.get("sdist"):
        return _locked_wheel(package)
    sdist = package["sdist"]
    location = sdist.get("url") or sdist.get("path", "")
    filename = sdist.get("name") or urllib.parse.unquote(urllib.parse.urlsplit(location).path.rsplit("/", 1)[-1])
    return {
        "name": str(canonicalize_name(package["name"])), "version": package["version"], "filename": filename,
        "url": location, "sha256": sdist["hashes"]["sha256"], "sdist": True,
    }


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


_MISSING_DISTRIBUTIONS = (
    "import importlib.metadata, sys\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        importlib.metadata.distribution(name)\n"
    "    except importlib.metadata.PackageNotFoundError:\n"
    "        print(name)\n"
)


def check_runtime(info: WheelInfo, lock: list[dict[str, Any]], python: Path) -> None:
    """Refuse a package that needs distributions ``python`` (the environment a job imports it in)
    lacks: for a Lab package, any of its lock, against the engine's; for a v1 taskset, any it
    requires itself, against the verifiers environment's. A job installs the package with
    --no-deps, so it would fail at start. Raises BuildFailed naming
    every missing distribution (``engine.environments.probe.not_in_engine``)."""
    if info.kind == "lab":
        names = [entry["name"] for entry in lock]
    else:  # the verifiers environment holds verifiers' imports, not its whole closure: check what the package names
        names = [Requirement(line).name for line in info.dependencies if Requirement(line).marker is None]
    if not names:
        return
    if not python.exists():
        log(f"{python} does not exist: the lock is not checked against the job's environment")
        return
    result = run_step([str(python), "-I", "-c", _MISSING_DISTRIBUTIONS, *names])
    if result.returncode != 0:
        raise BuildFailed(f"reading the job's environment ({python}) failed: {result.stderr.strip()[-500:]}")
    missing = result.stdout.split()
    if missing:
        listed = ", ".join(f"'{name}'" for name in missing)
        noun = "distributions" if len(missing) > 1 else "distribution"
        raise BuildFailed(not_in_engine(f"it depends on the {noun} {listed}", plural=len(missing) > 1))
    log(f"{len(names)} locked distributions: all in the job's environment ({python})")


def fetch(request: BuildRequest, lock: list[dict[str, Any]]) -> Path:
    """Put every locked wheel in the wheelhouse (``<sha256>/<file name>``; present ones are kept),
    checking each download's SHA-256; return a folder of links to them (a ``--find-links``)."""
    links = request.workdir / "wheels"
    links.mkdir(exist_ok=True)
    fetched = fetched_bytes = 0
    for entry in lock:
        target = request.wheelhouse / entry["sha256"] / entry["filename"]
        if not target.is_file():
            _download(entry["url"], target, entry["sha256"])
            fetched += 1
            fetched_bytes += target.stat().st_size
        (links / entry["filename"]).unlink(missing_ok=True)
        (links / entry["filename"]).symlink_to(target)
    log(f"wheelhouse: {len(lock)} wheels, {fetched} fetched ({fetched_bytes / 1e6:.1f} MB), {len(lock) - fetched} already there")
    return links


def install(request: BuildRequest, lock: list[dict[str, Any]], links: Path) -> Path:
    """Create the build's fresh venv and install the lock (offline, hashes checked), then the package; return its Python."""
    venv = request.workdir / "venv"
    environment = uv_environment(request)
    result = run_step([request.uv, "venv", "--quiet", "--python", request.python, str(venv)], env=environment)
    if result.returncode != 0:
        raise BuildFailed(f"could not create the build's virtual environment: {result.stderr.strip()[-500:]}")
    python = str(venv / "bin" / "python")
    offline = ["--python", python, "--offline", "--no-index", "--find-links", str(links), "--quiet"]
    if lock:
        (request.workdir / "lock.txt").write_text(
            "".join(f"{entry['name']}=={entry['version']} --hash=sha256:{entry['sha256']}\n" for entry in lock)
        )
        result = run_step([request.uv, "pip", "install", *offline, "--require-hashes", "--no-deps", "-r", str(request.workdir / "lock.txt")], env=environment)
        if result.returncode != 0:
            raise BuildFailed(f"installing the locked wheels failed: {result.stderr.strip()[-1500:]}")
    result = run_step([request.uv, "pip", "install", *offline, "--no-deps", str(request.wheel)], env=environment)
    if result.returncode != 0:
        raise BuildFailed(f"installing the package's wheel failed: {result.stderr.strip()[-1500:]}")
    log(f"installed {len(lock)} distributions and the package into a fresh environment")
    return Path(python)


def _site_packages(venv_python: Path) -> Path:
    return next((venv_python.parent.parent / "lib").glob("python*/site-packages"))


def loading_environment(request: BuildRequest, folder: Path, host) -> dict[str, str]:
    """The environment loading and the smoke rollout run in (``folder`` their home): offline, or,
    with ``request.hf_endpoint``, the Hub at that endpoint with the proxies and CA bundle of
    ``host`` (the builder's environment), the loopback never through a proxy; the Hugging Face
    caches in ``hf_home(request)`` either way."""
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8", "TMPDIR": str(folder),
                   "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "UV_OFFLINE": "1", "PIP_NO_INDEX": "1",
                   "HF_HOME": str(hf_home(request))}
    if request.hf_endpoint:
        # Loading may fetch Hub datasets (packed afterwards: hub_datasets.pack); huggingface_hub reads
        # TRANSFORMERS_OFFLINE as HF_HUB_OFFLINE, so all three go. No token: public datasets only.
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            environment.pop(name)
        environment["HF_ENDPOINT"] = request.hf_endpoint
        environment.update({name: host[name] for name in NETWORK_VARIABLES if host.get(name)})
        if any(name.lower().endswith("_proxy") and name.lower() != "no_proxy" for name in environment):
            # The smoke rollout's stub model is on the sandbox's loopback: never through the host's proxy.
            bypass = ",".join(part for part in (environment.get("NO_PROXY") or environment.get("no_proxy"), "127.0.0.1", "localhost") if part)
            environment["NO_PROXY"] = environment["no_proxy"] = bypass
    return environment


def probe(request: BuildRequest, info: WheelInfo, venv_python: Path) -> dict[str, Any]:
    """Import the module, load the environment with its defaults and run a smoke rollout of a few
    examples against a stub OpenAI-compatible model served inside the sandbox
    (``engine.environments.probe``); return its summary (``rollout``: the examples run, their
    rewards and its seconds). A rollout that raises fails the build naming the exception; the
    log has its traceback."""
    folder = request.workdir / "probe"
    folder.mkdir(exist_ok=True)
    script = folder / "lab_build_probe.py"
    shutil.copyfile(package_probe.__file__, script)
    # The probe loads the smoke rollout from its own folder, and the smoke rollout the bridges from its own.
    for module in ("smoke_rollout.py", "verifiers_bridge.py", "load_environment_bridge.py", "bridge_protocol.py"):
        shutil.copyfile(Path(smoke_rollout.__file__).with_name(module), folder / module)
    out = folder / "summary.json"
    reach = None
    if request.hf_endpoint and request.sandbox:
        # The package's code reaches the Hub from a network namespace of its own, never the host's.
        if (why := network.available()) is not None:
            log(f"the Hub is not reached while loading: a network namespace of its own cannot be set up here ({why}); "
                "loading runs offline")
            request = dataclasses.replace(request, hf_endpoint="")
        else:
            reach = network.reach([request.hf_endpoint])
    hub = bool(request.hf_endpoint)
    environment = loading_environment(request, folder, os.environ)
    if reach is not None:
        # As the namespace reaches it (a local Hub at slirp4netns's gateway); messages name it as configured.
        environment["HF_ENDPOINT"] = reach.urls.get(request.hf_endpoint, request.hf_endpoint)
        environment["LAB_HF_ENDPOINT"] = request.hf_endpoint
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
    command += [info.module, info.kind, info.entry_point, str(out), "rollout"]
    # Loading runs in the folder of the organization's pushed datasets, where load_dataset("owner/name")
    # finds "owner/name/" (environments.datasets); read-only in the sandbox.
    datasets = request.datasets or request.workdir / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    if request.datasets is not None:
        pythons.append(datasets)
        found = sorted(f"{owner.name}/{name.name}" for owner in datasets.iterdir() if owner.is_dir() for name in owner.iterdir() if name.is_dir())
        log(f"pushed datasets load_dataset finds by name: {', '.join(found) or 'none'}")
    sandbox = sandbox_command(pythons, request.workdir, frozen=request.workdir / "venv", chdir=datasets) if request.sandbox else []
    log(f"importing {info.module}, loading it with its defaults and running {smoke_rollout.ROLLOUT_EXAMPLES} examples against a stub model"
        + (f" (in bubblewrap{', a network namespace of its own reaching the Hub' if hub else ', no network'})" if sandbox else "")
        + (f"; Hugging Face datasets from {request.hf_endpoint}" if hub else ""))
    started = time.monotonic()
    if reach is not None:
        result = network.run_in_namespace(sandbox, command, reach_=reach, timeout=PROBE_TIMEOUT_S, env=environment, cwd=datasets)
    else:
        result = run_step([*sandbox, *command], timeout=PROBE_TIMEOUT_S, env=environment, cwd=datasets)
    print(result.stdout + result.stderr, end="", flush=True)
    if result.returncode != 0 or not out.is_file():
        raise BuildFailed(f"importing and loading the environment crashed (exit {result.returncode}); the build log has its output")
    summary = json.loads(out.read_text())
    if summary.get("error"):
        raise BuildFailed(summary["error"])
    rollout = summary["rollout"]
    log(f"loaded in {time.monotonic() - started - rollout['seconds']:.1f} s: {summary['api']} {summary['environment_class']}; "
        f"smoke rollout of {rollout['examples']} examples in {rollout['seconds']:.1f} s, rewards {rollout['rewards']}")
    return summary


def hf_home(request: BuildRequest) -> Path:
    """The Hugging Face caches' folder loading writes to (``HF_HOME``), in the build's own folder."""
    return request.workdir / "hf"


def run_build(request: BuildRequest) -> dict[str, Any]:
    """Run every step; return the result object (the package docstring's), ``failed`` with the error on ``BuildFailed``."""
    request.workdir.mkdir(parents=True, exist_ok=True)
    request.wheelhouse.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {"status": "failed", "error": None, "python": engine_python_version(request.python), "lock": [], "summary": {}}
    try:
        try:
            with request.wheel.open("rb") as handle:
                info = read_wheel(handle, filename=request.wheel.name)
        except InvalidWheel as error:
            raise BuildFailed(f"not an acceptable environment wheel: {error}") from None
        log(f"{info.name} {info.version} ({info.kind}), engine Python {result['python']}")
        check_python(info, result["python"])
        info = without_engine_provided(info)
        cap = info.kind == "verifiers" and is_load_environment_module(module_source(request.wheel, info.module))
        lock = resolve(request, info, cap_verifiers=cap)
        lock = build_source_distributions(request, lock)
        if not cap:  # a v0 package runs on its build's own environment; the others beside the engine's
            check_runtime(info, lock, Path(request.python) if info.kind == "lab" else verifiers_python())
        result["lock"] = [{key: entry[key] for key in ("name", "version", "filename", "sha256")} for entry in lock]
        links = fetch(request, lock)
        venv_python = install(request, lock, links)
        result["summary"] = probe(request, info, venv_python)
        if request.hub_datasets is not None:
            result["summary"]["hub_datasets"] = hub_datasets.pack(
                hf_home(request), request.hub_datasets, max_bytes=request.hub_datasets_max_bytes,
            )
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
    parser.add_argument("--datasets", type=Path, default=None, help="the folder of pushed datasets (<owner>/<name>/...) loading runs in")
    parser.add_argument("--hf-endpoint", default="", help="the Hugging Face Hub loading may fetch datasets from (default: none, offline)")
    parser.add_argument("--hub-datasets", type=Path, default=None, help="where the tar of the Hub datasets loading fetched is written")
    parser.add_argument("--hub-datasets-max-bytes", type=int, default=2**31, help="the most those datasets may come to")
    args = parser.parse_args(argv)
    request = BuildRequest(
        wheel=args.wheel.resolve(), index_url=args.index_url, exclude_newer=args.exclude_newer,
        wheelhouse=args.wheelhouse.resolve(), workdir=args.workdir.resolve(), python=args.python, uv=args.uv,
        sandbox=args.sandbox == "bubblewrap", cache=args.cache, datasets=args.datasets.resolve() if args.datasets else None,
        hf_endpoint=args.hf_endpoint, hub_datasets=args.hub_datasets.resolve() if args.hub_datasets else None,
        hub_datasets_max_bytes=args.hub_datasets_max_bytes,
    )
    result = run_build(request)
    args.result.write_text(json.dumps(result))
    return 0
