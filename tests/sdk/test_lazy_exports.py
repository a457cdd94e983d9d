"""``labsdk`` exports its names lazily (PEP 562): a process that reads only ``labsdk.spec`` (the
engine) does not import the HTTP client, and every exported name still resolves."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import labsdk

SDK = Path(labsdk.__file__).parent


def test_reading_the_spec_module_leaves_the_client_and_its_types_unimported():
    probe = "import sys, labsdk.spec; print(sorted(m for m in sys.modules if m.startswith('labsdk')))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=SDK.parent, capture_output=True, text=True, check=True)
    loaded = result.stdout
    assert "labsdk.spec" in loaded
    assert "labsdk.client" not in loaded and "labsdk.types" not in loaded and "labsdk.webhooks" not in loaded


def test_every_exported_name_resolves_and_is_listed_in_dir():
    for name in labsdk.__all__:
        assert getattr(labsdk, name) is not None, name
    assert set(labsdk.__all__) <= set(dir(labsdk))
    assert labsdk.Lab.__module__ == "labsdk.client" and labsdk.webhooks.__name__ == "labsdk.webhooks"


def test_no_submodule_imports_the_package_namespace_so_the_lazy_table_hides_no_circle():
    offenders = []
    for path in SDK.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == SDK:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "labsdk" and node.level == 0:
                offenders.append(f"{path.relative_to(SDK)}:{node.lineno}")
            if isinstance(node, ast.Import) and any(alias.name == "labsdk" for alias in node.names):
                offenders.append(f"{path.relative_to(SDK)}:{node.lineno}")
    assert not offenders
