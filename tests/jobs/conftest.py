"""Fixtures the jobs tests share: one web process per module for the live-stream tests."""

from __future__ import annotations

import pytest

from tests.support.stack import LabStack
from tests.support.stream import _web


@pytest.fixture(scope="module")
def module_web(tmp_path_factory, django_db_setup) -> LabStack:
    """A LabStack's web process (uvicorn serving lab.asgi) for a whole module: it reads the rows
    each test commits, so starting it once per module instead of per test changes no answer."""
    stack = _web(tmp_path_factory.mktemp("web"))
    yield stack
    stack.stop()


@pytest.fixture
def web(module_web: LabStack) -> LabStack:
    """The module's web process, started again first if the previous test stopped it."""
    process = module_web.processes.get("web")
    if process is None or process.poll() is not None:
        module_web.start_web()
    return module_web
