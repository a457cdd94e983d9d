"""engine.build_envs: a build's lock installed offline with uv into an environment keyed by the
lock's hash, found there by the next job, refused when a wheel is not the locked one."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from engine import build_envs, packages
from engine.environments.base import InvalidEnvironment
from tests.support.wheelbuilder import build_wheel


@pytest.fixture
def lock(tmp_path):
    """A one-wheel lock (a small pure-Python distribution) whose wheel lies in a wheelhouse folder."""
    filename, data = build_wheel("tiny-dep", "1.2.0", files={"tiny_dep/__init__.py": "VALUE = 42\n"}, requires=[])
    sha256 = hashlib.sha256(data).hexdigest()
    wheel = tmp_path / "wheelhouse" / sha256 / filename
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(data)
    return [{"name": "tiny-dep", "version": "1.2.0", "filename": filename, "sha256": sha256, "url": wheel.as_uri()}]


def _fetch(calls: list):
    package = packages.Package(id="acme/x@1.0", sha256="", url="", filename="x-1.0-py3-none-any.whl")
    fetch = packages._fetch_locked(package)

    def counted(entry, folder):
        calls.append(entry["filename"])
        return fetch(entry, folder)

    return counted


def test_the_first_job_installs_the_lock_and_the_next_finds_it_installed(tmp_path, lock, monkeypatch):
    monkeypatch.setenv(build_envs.CACHE_VARIABLE, str(tmp_path / "cache"))
    calls: list = []
    python, installed = build_envs.ensure_environment("acme/x@1.0", lock, tmp_path / "attempt-1", _fetch(calls))
    assert installed and calls == [lock[0]["filename"]]
    assert python.parent.parent == tmp_path / "cache" / build_envs.lock_hash(lock)
    assert subprocess.run([str(python), "-I", "-c", "import tiny_dep; print(tiny_dep.VALUE)"], capture_output=True, text=True).stdout == "42\n"
    again, installed = build_envs.ensure_environment("acme/x@1.0", lock, tmp_path / "attempt-2", _fetch(calls))
    assert (again, installed) == (python, False) and len(calls) == 1  # nothing fetched or installed
    assert not list((tmp_path / "cache").glob("*.tmp"))  # the staging venv was renamed into place


def test_a_wheel_that_is_not_the_locked_one_is_refused_and_nothing_is_cached(tmp_path, lock, monkeypatch):
    monkeypatch.setenv(build_envs.CACHE_VARIABLE, str(tmp_path / "cache"))
    forged = [{**lock[0], "sha256": "0" * 64}]
    with pytest.raises(InvalidEnvironment, match="SHA-256"):
        build_envs.ensure_environment("acme/x@1.0", forged, tmp_path / "attempt-1", _fetch([]))
    assert not (tmp_path / "cache" / build_envs.lock_hash(forged)).exists()


def test_the_lock_hash_ignores_order_and_changes_with_any_wheel():
    a = {"name": "a", "version": "1", "sha256": "1" * 64}
    b = {"name": "b", "version": "2", "sha256": "2" * 64}
    assert build_envs.lock_hash([a, b]) == build_envs.lock_hash([b, a])
    assert build_envs.lock_hash([a, b]) != build_envs.lock_hash([a, {**b, "sha256": "3" * 64}])
