"""Fixtures for sandbox tests: a local runtime of its own under the test's temporary folder."""

from __future__ import annotations

import shutil

import pytest

from sandboxes import services
from sandboxes.runtime.local import LocalRuntime


@pytest.fixture
def runtime(tmp_path, monkeypatch) -> LocalRuntime:
    """The runtime every sandbox service of the test uses (work dirs under ``tmp_path``)."""
    if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
        pytest.skip("bubblewrap and prlimit are needed to run sandboxes")
    local = LocalRuntime(tmp_path / "sandboxes", max_processes=64, max_open_files=256)
    monkeypatch.setattr(services, "runtime", lambda: local)
    return local
