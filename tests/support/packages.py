"""Environment packages built and run by the engine in the environment tests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import build_envs, packages
from tests.support.load_environment_wheels import fixture_wheel

REPO = Path(__file__).resolve().parents[2]


TINY = {
    "model": "lab/tiny-random-llama",
    "max_steps": 2,
    "batch_size": 4,
    "rollouts_per_example": 2,
    "sampling": {"max_tokens": 4},
    "checkpoints": {"interval": 0},
}


def run_engine(tmp_path: Path, env_id: str, wheels: list[tuple[str, bytes]], *, args=None, sha256=None, extra_env=None,
               block=None, spec=None, build=None) -> subprocess.CompletedProcess:
    """Run the engine on a tiny job over one uploaded environment (``block``: more keys of its
    ``[[env]]``; ``spec``: more keys of the spec; ``build``: the package's build as a launch hands
    it over, ``{"number", "api", "lock"[, "secrets"]}``) and return the finished process."""
    packages = []
    for (filename, data), package_id in zip(wheels, [env_id] * len(wheels)):
        path = tmp_path / filename
        path.write_bytes(data)
        packages.append({"id": package_id, "sha256": sha256 or hashlib.sha256(data).hexdigest(), "url": path.as_uri(), "filename": filename,
                         **({"build": build} if build is not None else {})})
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({**TINY, **(spec or {}), "env": [{"id": env_id, "args": args or {}, **(block or {})}]}))
    environment = {
        **os.environ,
        "LAB_MODEL_DIR": str(tmp_path / "models"),
        "LAB_ENGINE_THREADS": "1",
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'sdk'}",
        "LAB_JOB_ENVIRONMENT_PACKAGES": json.dumps(packages),
        **(extra_env or {}),
    }
    command = [sys.executable, "-m", "engine", "run", "--offline", "--job-id", "job_1", "--attempt", "1",
               "--workdir", str(tmp_path / "work"), "--spec", str(spec_path)]
    return subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300, check=False)


def build_example(tmp_path: Path, target: str = "example-verifiers-env") -> Path:
    """Build an example package's wheel with its make target into ``tmp_path/dist``; return it."""
    dist = tmp_path / "dist"
    built = subprocess.run(
        ["make", "-s", target, f"EXAMPLE_DIST={dist}"], cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("*.whl")
    return wheel


PACKAGE_INDEX = REPO / "var" / "package-index"


def local_index_url() -> str:
    """The ``simple/`` URL of the local package index (``make package-index``) for
    ``LAB_PACKAGE_INDEX_URL``; fails the test when it was never filled (never a remote index)."""
    if not (PACKAGE_INDEX / ".filled").is_file():
        raise AssertionError("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    return (PACKAGE_INDEX / "simple").as_uri()


def build_on_local_index(root: Path, wheel: Path) -> dict:
    """Build ``wheel`` with Lab's builder against the local package index (``make package-index``;
    never a remote one), its wheelhouse and uv cache under ``root``; return the result
    (``{"status", "error", "lock", "summary"}``), each lock entry with its wheelhouse ``url``."""
    index = local_index_url()
    result = root / f"{wheel.stem}.json"
    subprocess.run(
        [sys.executable, "-m", "environments.builder", "build", "--wheel", str(wheel), "--index-url", index,
         "--exclude-newer", "2100-01-01T00:00:00Z", "--wheelhouse", str(root / "wheelhouse"), "--workdir", str(root / f"build-{wheel.stem}"),
         "--result", str(result), "--cache", str(root / "uv-cache"), "--sandbox", "none"],
        cwd=REPO, check=True, capture_output=True, timeout=600,
    )
    built = json.loads(result.read_text())
    built["lock"] = [{**entry, "url": (root / "wheelhouse" / entry["sha256"] / entry["filename"]).as_uri()} for entry in built.get("lock") or []]
    return built


def build_fixture(root: Path, name: str) -> dict:
    """Build the fixture package ``name`` (tests/environments/fixtures, ``fixture_wheel``) in
    ``root`` with ``build_on_local_index``, which must end ready; return ``{"root", "lock",
    "summary", "sha256", "filename", "data"}``."""
    filename, data = fixture_wheel(name)
    (root / filename).write_bytes(data)
    result = build_on_local_index(root, root / filename)
    assert result["status"] == "ready", result
    return {"root": root, "lock": result["lock"], "summary": result["summary"], "sha256": hashlib.sha256(data).hexdigest(),
            "filename": filename, "data": data}


def install_build(built: dict, package_id: str) -> Path:
    """Install the environment of ``built`` (``build_fixture``'s) as a job does (``engine.build_envs``,
    its cache and install folders under the build's root); return its Python."""
    package = packages.Package(id=package_id, sha256=built["sha256"], url="", filename=built["filename"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(build_envs.CACHE_VARIABLE, str(built["root"] / "cache"))
        python, _ = build_envs.ensure_environment(package_id, built["lock"], built["root"] / "install",
                                                  packages._fetch_locked(package), log=print)
    return python
