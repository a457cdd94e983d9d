"""Run ``lab envs try`` as a user runs it, and read docs/environments.md's listings, for the tests
that try an environment package or a listing of the docs as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.cli import LAB_SCRIPT

REPO = Path(__file__).resolve().parents[2]
PACKAGE_INDEX = REPO / "var" / "package-index"


def lab_try(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``lab envs try ARGV`` from ``cwd``, outside the repository, with no Lab to talk to."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LAB_") and name != "PYTHONPATH"}
    env.update(NO_COLOR="1", COLUMNS="200", LAB_BASE_URL="http://127.0.0.1:9")  # nothing listens there
    return subprocess.run([str(LAB_SCRIPT), "envs", "try", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def docs_listing(after: str, language: str = "python") -> str:
    """The first ``language`` code block of docs/environments.md after the text ``after``."""
    page = (REPO / "docs" / "environments.md").read_text()
    assert after in page, after
    return page.split(after, 1)[1].split(f"```{language}\n", 1)[1].split("```", 1)[0]


def v0_folder(tmp_path: Path, name: str, code: str, *, dependencies: tuple[str, ...] = (), description: str | None = None) -> Path:
    """A package folder of ``code`` as the module of ``name``, with double-it's ``pyproject.toml``
    from the docs renamed (and ``dependencies`` added to its own, ``description`` as its own)."""
    module = name.replace("-", "_")
    folder = tmp_path / name
    folder.mkdir()
    (folder / f"{module}.py").write_text(code)
    pyproject = docs_listing("`lab envs push` build from its folder", "toml")
    listed = 'dependencies = ["verifiers>=0.1.0", "datasets"]'
    assert listed in pyproject
    wanted = ", ".join(f'"{name}"' for name in ("verifiers>=0.1.0", "datasets", *dependencies))
    pyproject = pyproject.replace(listed, f"dependencies = [{wanted}]")
    pyproject = pyproject.replace("double-it", name).replace("double_it", module)
    if description is not None:
        pyproject = pyproject.replace("Double a number.", description)
    (folder / "pyproject.toml").write_text(pyproject)
    return folder


def make_v0_python(venv: Path) -> Path:
    """Make at ``venv`` the Python of an environment holding a load_environment package's
    requirements (verifiers 0.3.1, datasets and openai, from the local package index), as a user's
    own would be, and return it."""
    if not (PACKAGE_INDEX / ".filled").is_file():
        raise RuntimeError("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    uv = Path(sys.executable).with_name("uv")
    env = {**os.environ, "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env, timeout=300)
    subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--index-url",
         (PACKAGE_INDEX / "simple").as_uri(), "--only-binary", ":all:", "verifiers==0.3.1", "datasets", "openai"],
        check=True, env=env, timeout=600,
    )
    return venv / "bin" / "python"
