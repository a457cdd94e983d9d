"""Imports point one way, in layers (docs/architecture.md "Layout").

``dashboard`` → ``jobs`` → (``billing``, ``environments``) → ``lab``. ``billing`` and
``environments`` are independent of each other. ``lab`` names the apps above it only in its
composition root. ``engine`` and ``labsdk`` are libraries that any app may use and that never
import Django or an app. ``demo`` is a client program: it may import anything, nothing imports it.

The walk reads every import statement (those inside functions too) and the dotted paths handed
to ``include()``, ``import_module()`` and ``import_string()``, and reports every offending
file:line at once.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Where each part of the code lives, relative to the repository root.
PACKAGES = {
    "lab": "lab",
    "dashboard": "dashboard",
    "jobs": "jobs",
    "billing": "billing",
    "environments": "environments",
    "engine": "engine",
    "labsdk": "sdk/labsdk",
    "demo": "demo",
}
DJANGO = {"django", "rest_framework"}
APPS = {"dashboard", "jobs", "billing", "environments"}
LIBRARIES = {"engine", "labsdk"}

#: What each part may import besides itself, the standard library and third-party packages.
ALLOWED = {
    "dashboard": {"jobs", "billing", "environments", "lab"} | LIBRARIES | DJANGO,
    "jobs": {"billing", "environments", "lab"} | LIBRARIES | DJANGO,
    "billing": {"lab"} | LIBRARIES | DJANGO,
    "environments": {"lab"} | LIBRARIES | DJANGO,
    "lab": LIBRARIES | DJANGO,
    "engine": {"labsdk"},
    # The SDK is installed on its own (sdk/pyproject.toml): nothing else of this repository.
    "labsdk": set(),
    "demo": set(PACKAGES) | DJANGO,
}
#: Watched names: an import of anything else (stdlib, third party) is never a layer problem.
WATCHED = set(PACKAGES) | DJANGO

#: lab's composition root, which may name every app (never the demo).
COMPOSITION_ROOT = {"lab/settings.py", "lab/urls.py", "lab/asgi.py", "lab/wsgi.py", "lab/celery.py"}

#: Calls whose first argument is a dotted module path imported at run time.
DYNAMIC_IMPORTS = {"include", "import_module", "import_string"}


def _module_name(path: Path, package_dir: Path, package: str) -> list[str]:
    relative = path.relative_to(package_dir).with_suffix("")
    parts = [package, *relative.parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path, *, package: str, package_dir: Path) -> list[tuple[int, str]]:
    """Return ``(line, dotted module)`` for every import in the file at ``path``.

    Relative imports are resolved against the file's own package; dynamic imports count when
    their module is a string literal.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module_parts = _module_name(path, package_dir, package)
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.lineno, node.module or ""))
            else:
                base = module_parts if is_package else module_parts[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
        elif isinstance(node, ast.Call) and node.args:
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            first = node.args[0]
            if name in DYNAMIC_IMPORTS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value))
    return found


def layer_violations(root: Path = ROOT) -> list[str]:
    """Return ``"path:line: what is wrong"`` for every import that breaks the layers under ``root``."""
    problems = []
    for package, directory in PACKAGES.items():
        package_dir = root / directory
        for path in sorted(package_dir.rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            allowed = ALLOWED[package]
            if relative in COMPOSITION_ROOT:
                allowed = allowed | APPS
            for line, module in imported_modules(path, package=package, package_dir=package_dir):
                target = module.split(".")[0]
                if target == package or target not in WATCHED or target in allowed:
                    continue
                problems.append(f"{relative}:{line}: {package} imports {module}")
    return problems


def test_it_keeps_every_import_in_its_layer():
    problems = layer_violations()
    if problems:
        pytest.fail("imports that break the layers (docs/architecture.md):\n" + "\n".join(problems), pytrace=False)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path


def test_it_reports_imports_inside_functions_and_dynamic_ones(tmp_path):
    root = _tree(
        tmp_path,
        {
            "lab/__init__.py": "",
            "lab/ops.py": "import os\n\ndef count():\n    from jobs.models import Job\n    return Job\n",
            "lab/api/urls.py": "from django.urls import include\nurls = [include('jobs.api.urls')]\n",
            "lab/urls.py": "from django.urls import include\nurls = [include('dashboard.urls')]\n",
            "billing/models.py": "import environments.models\n",
            "engine/run.py": "def main():\n    import django\n",
            "sdk/labsdk/client.py": "from engine import catalog\n",
            "jobs/services.py": "from . import models\nfrom ..demo import program\n",
            "demo/program.py": "import jobs.models\nimport dashboard\n",
        },
    )
    assert layer_violations(root) == [
        "lab/api/urls.py:2: lab imports jobs.api.urls",
        "lab/ops.py:4: lab imports jobs.models",
        "jobs/services.py:2: jobs imports demo",
        "billing/models.py:1: billing imports environments.models",
        "engine/run.py:2: engine imports django",
        "sdk/labsdk/client.py:1: labsdk imports engine",
    ]
