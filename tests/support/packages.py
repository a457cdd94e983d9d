"""Environment packages built and run by the engine in the environment tests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

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
               block=None, spec=None) -> subprocess.CompletedProcess:
    """Run the engine on a tiny job over one uploaded environment (``block``: more keys of its
    ``[[env]]``; ``spec``: more keys of the spec) and return the finished process."""
    packages = []
    for (filename, data), package_id in zip(wheels, [env_id] * len(wheels)):
        path = tmp_path / filename
        path.write_bytes(data)
        packages.append({"id": package_id, "sha256": sha256 or hashlib.sha256(data).hexdigest(), "url": path.as_uri(), "filename": filename})
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
