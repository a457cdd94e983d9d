"""The bubblewrap sandbox build steps that run a package's code run in (its import, building a
source archive): ``sandbox_command``."""

from __future__ import annotations

import shutil
from pathlib import Path

from environments.builder.steps import BuildFailed
from lab.lib import seccomp

#: System folders the import step sees, read-only, where present (programs, libraries, certificates, the loader's cache);
#: of /etc/ssl only the certificates and OpenSSL's configuration, never ``private`` (the host's keys).
_SANDBOX_SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates", "/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")


def sandbox_command(
    readable: list[Path], writable: Path, *, frozen: Path | None = None, chdir: Path | None = None,
) -> list[str]:
    """The ``bwrap`` prefix the import step runs under: its own namespaces of every kind (so no
    network at all: the package is installed already), an empty root with only the system's
    programs and libraries, the Python installations in ``readable`` read-only and the build's
    own ``writable`` folder but ``frozen`` in it, read-only: the build's venv, whose files uv
    hard-links from the cache that later builds install from; nothing of Lab's data,
    configuration or other builds. It starts in ``chdir`` (one of those folders; default ``writable``).
    A step that must reach an endpoint gets a network namespace of its own behind a firewall
    (``environments.builder.network``), never the host's network."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise BuildFailed(
            "bubblewrap (bwrap) is not installed, and builds import packages in its sandbox: install it "
            "(apt-get install bubblewrap), or set LAB_LOCAL_ISOLATION=none where every package is trusted"
        )
    # Lab's seccomp filter (lab.lib.seccomp), which bwrap reads from the descriptor file_prefix opens.
    args = [*seccomp.file_prefix(), bwrap, "--seccomp", str(seccomp.FILE_FD),
            "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
            "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    for path in _SANDBOX_SYSTEM:
        args += ["--ro-bind-try", path, path]
    for path in sorted({path.resolve() for path in readable}):
        args += ["--ro-bind", str(path), str(path)]
    args += ["--bind", str(writable), str(writable)]
    if frozen is not None:
        args += ["--ro-bind", str(frozen), str(frozen)]
    return [*args, "--chdir", str(chdir or writable), "--"]
