"""The builder (environments.builder.build) against what code of an earlier sandboxed step of the
same build (a source archive's setup code, which may write the build's folder) leaves there: a
link planted where the builder writes a download must not make it write through the link, and a
build backend poisoned in uv's cache must not build the next archive's wheel, which the shared
wheelhouse's ``built/`` record hands to every organization."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from environments.builder.downloads import download as _download
from environments.builder.sources import build_source_distributions
from environments.builder.steps import BuildRequest

PACKAGE_INDEX = Path(__file__).resolve().parents[2] / "var" / "package-index"
UV = str(Path(sys.executable).parent / "uv")


def test_a_download_never_writes_through_a_link_planted_at_its_partial_file(tmp_path):
    victim = tmp_path / "shared-wheelhouse" / "numpy-2.0-py3-none-any.whl"  # what another organization's jobs install
    victim.parent.mkdir()
    victim.write_bytes(b"the real wheel")
    source = tmp_path / "index" / "evil-1.0.tar.gz"
    source.parent.mkdir()
    source.write_bytes(b"the attacker's archive, as the index lists it")
    folder = tmp_path / "build" / "sdists"
    folder.mkdir(parents=True)
    target = folder / source.name
    # The builder's pid is the test's here; from inside its sandbox an attacker sprays every pid.
    for pid in {os.getpid(), *range(1, 400)}:
        (folder / f".{target.name}.{pid}.part").symlink_to(victim)

    _download(source.as_uri(), target, hashlib.sha256(source.read_bytes()).hexdigest())

    assert victim.read_bytes() == b"the real wheel"
    assert target.read_bytes() == source.read_bytes() and not target.is_symlink()
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert not [path for path in folder.iterdir() if path.name.endswith(".part") and not path.is_symlink()]


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_a_download_whose_digest_differs_leaves_nothing(tmp_path):
    source = tmp_path / "x.tar.gz"
    source.write_bytes(b"x")
    target = tmp_path / "out" / "x.tar.gz"
    try:
        _download(source.as_uri(), target, "0" * 64)
    except Exception as error:  # BuildFailed
        assert "does not have the SHA-256" in str(error)
    assert not target.exists() and list(Path(target.parent).iterdir()) == []


POISON = '''
import os, pathlib
PATCH = """
# lab-poison
_lab_build_wheel = _BuildMetaBackend.build_wheel
def _lab_poisoned(self, wheel_directory, *args, **kwargs):
    name = _lab_build_wheel(self, wheel_directory, *args, **kwargs)
    import os, zipfile
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "a") as archive:
        archive.writestr("lab_poisoned.txt", "poisoned")
    return name
_BuildMetaBackend.build_wheel = _lab_poisoned
build_wheel = _BACKEND.build_wheel
"""
roots = [pathlib.Path(os.environ.get("UV_CACHE_DIR", "/nonexistent")), pathlib.Path.cwd().parent]
import setuptools.build_meta
roots.append(pathlib.Path(setuptools.build_meta.__file__).parent)
for root in roots:
    for path in (root.rglob("setuptools/build_meta.py") if root.is_dir() else []):
        try:
            if "lab-poison" not in path.read_text():
                with open(path, "a") as backend:  # in place: uv links its cache's files into build environments
                    backend.write(PATCH)
        except OSError:
            pass
from setuptools import setup
setup(name="aaa-poison", version="1.0", py_modules=[])
'''


def test_a_source_archives_setup_code_cannot_poison_the_wheel_built_from_the_next_one(tmp_path):
    """A package whose lock holds a hostile source archive before a popular one (zss): the hostile
    setup code appends to the setuptools uv cached, so that the next archive's wheel, which the
    wheelhouse's ``built/`` record then hands every organization locking it, carries its file."""
    if not (PACKAGE_INDEX / ".filled").is_file():
        pytest.fail("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is needed (make install)")
    source = tmp_path / "src" / "aaa-poison-1.0"
    source.mkdir(parents=True)
    (source / "setup.py").write_text(POISON)
    (source / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: aaa-poison\nVersion: 1.0\n")
    hostile = tmp_path / "aaa-poison-1.0.tar.gz"
    with tarfile.open(hostile, "w:gz") as archive:
        archive.add(source, arcname=source.name)
    request = BuildRequest(wheel=tmp_path / "x.whl", index_url=(PACKAGE_INDEX / "simple").as_uri(), exclude_newer="2099-01-01T00:00:00Z",
                           wheelhouse=tmp_path / "wheelhouse", workdir=tmp_path / "work", uv=UV, cache=tmp_path / "uv-cache", sandbox=True)
    request.workdir.mkdir()
    zss = PACKAGE_INDEX / "files" / "zss-1.2.0.tar.gz"
    entries = [{"name": name, "version": version, "filename": path.name, "url": path.as_uri(),
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "sdist": True}
               for name, version, path in (("aaa-poison", "1.0", hostile), ("zss", "1.2.0", zss))]

    _, built = build_source_distributions(request, entries)

    names = zipfile.ZipFile(request.wheelhouse / built["sha256"] / built["filename"]).namelist()
    assert "zss/compare.py" in names and "lab_poisoned.txt" not in names, names
