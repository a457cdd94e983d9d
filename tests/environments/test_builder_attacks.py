"""The builder (environments.builder.build) against what code of an earlier sandboxed step of the
same build (a source archive's setup code, which may write the build's folder) leaves there: a
link planted where the builder writes a download must not make it write through the link."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from environments.builder.build import _download


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
