"""Sandbox images: root file systems Lab knows by name, built once on the machine of the sandbox
agent from Debian's packages (docs/sandboxes.md "Images"), never downloaded when a sandbox starts.

Each image of ``IMAGES`` is a folder ``<images dir>/<folder>`` holding a Debian root file system
made by ``mmdebstrap`` (Debian's package of that name) from the apt sources this machine is
configured with (``/etc/apt/sources.list.d/debian.sources`` when present), and beside it
``<folder>.json``, written last, saying what it was built from. No file of an image keeps a
setuid or setgid bit (``strip_set_id_bits``): nothing in a sandbox runs with another user's or
group's rights. The agent gives a sandbox that folder as its ``/``, under an overlay of the
sandbox's own (``sandboxes.runtime.rootfs``; bound read-only where it cannot mount one), and never
writes to it (``sandboxes.runtime.local``); a sandbox sees nothing of the host.

``python -m sandboxes.images [--dir DIR] [--check]`` (what ``make sandbox-images`` runs) builds
every image whose folder is missing or was built from another definition, and does nothing, in
milliseconds, when all are current; ``--check`` only says which are not. The images folder is
``LAB_SANDBOX_IMAGES_DIR`` (default ``var/sandbox-images`` in the repository). Builds run as
root (tested; another user gets the unshare mode mmdebstrap picks, untested), take about a
minute per image, and replace an image atomically (a new folder renamed into place); two builds
at once wait for each other (a lock file).

This module uses the standard library alone: the agent and the Makefile import it without Django.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What builds the images (a Debian package); ``make sandbox-images`` installs it when missing.
MMDEBSTRAP = "mmdebstrap"
#: The host's apt sources handed to mmdebstrap (its mirrors, its snapshot); without it, Debian's.
HOST_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
#: What the sandbox's user (uid 1000 inside) is called in the image's /etc/passwd.
SANDBOX_USER = "sandbox"
#: How a sandbox-facing message says to build the images.
BUILD_HINT = "build it on the sandbox agent's machine with `make sandbox-images` (docs/sandboxes.md \"Images\")"
#: The mode bits no file of an image keeps.
SET_ID_BITS = stat.S_ISUID | stat.S_ISGID


@dataclass(frozen=True)
class Image:
    """An image: its ``folder`` under the images folder, the Debian ``suite`` and the
    ``packages`` installed on top of the suite's essential ones (with their dependencies)."""

    folder: str
    suite: str
    packages: tuple[str, ...]

    def definition(self) -> dict:
        # "builder" counts changes of how images are built (4: setuid and setgid bits stripped),
        # so that images built before one are rebuilt.
        return {**asdict(self), "packages": list(self.packages), "builder": 4}


#: The images of this Lab by the name a sandbox asks for.
IMAGES = {
    "python:3.11": Image(
        folder="python-3.11", suite="bookworm",
        packages=("python3", "python-is-python3", "python3-numpy", "python3-pytest", "ca-certificates"),
    ),
}


class ImageNotBuilt(Exception):
    """An image's folder is missing on this machine (``make sandbox-images`` was not run)."""


def images_dir() -> Path:
    """Return the folder holding the images: ``LAB_SANDBOX_IMAGES_DIR``, else ``var/sandbox-images``."""
    return Path(os.environ.get("LAB_SANDBOX_IMAGES_DIR") or REPO / "var" / "sandbox-images").absolute()


def rootfs(directory: Path, name: str) -> Path:
    """Return the root file system of image ``name`` under ``directory``; ImageNotBuilt (saying
    how to build it) when it has not been built, KeyError for a name Lab does not know."""
    image = IMAGES[name]
    path = Path(directory) / image.folder
    if not (Path(directory) / f"{image.folder}.json").is_file() or not (path / "usr" / "bin").is_dir():
        raise ImageNotBuilt(f"The image {name!r} is not built on this machine (no {path}): {BUILD_HINT}.")
    return path


def current(directory: Path, name: str) -> bool:
    """Return whether image ``name`` is built under ``directory`` from its present definition."""
    image = IMAGES[name]
    try:
        built = json.loads((Path(directory) / f"{image.folder}.json").read_text())
    except (OSError, ValueError):
        return False
    return built.get("definition") == image.definition() and (Path(directory) / image.folder / "usr" / "bin").is_dir()


def build(directory: Path, name: str, *, log=print) -> None:
    """Build image ``name`` under ``directory`` with mmdebstrap into a new folder, then rename it
    into place (the old one deleted) and write its ``.json`` (see the module's docstring)."""
    image = IMAGES[name]
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)  # sandboxes' own host uids pass through it to the image
    building = directory / f".{image.folder}.building"
    shutil.rmtree(building, ignore_errors=True)
    sources = [str(HOST_SOURCES)] if HOST_SOURCES.is_file() and _host_suite() == image.suite else []
    hook = (
        'mkdir -p "$1/workspace" && chmod 0755 "$1/workspace" && echo sandbox > "$1/etc/hostname" && '
        f'echo "{SANDBOX_USER}:x:1000:1000:{SANDBOX_USER}:/workspace:/bin/bash" >> "$1/etc/passwd" && '
        f'echo "{SANDBOX_USER}:x:1000:" >> "$1/etc/group" && printf "127.0.0.1 localhost sandbox\\n::1 localhost\\n" > "$1/etc/hosts" && '
        # The resolver of a sandbox allowed egress: slirp4netns's DNS forwarder (lab.lib.egress).
        'echo "nameserver 10.0.2.3" > "$1/etc/resolv.conf" && '
        # No one logs in to a sandbox: no password files, no root's home.
        'rm -f "$1/etc/shadow" "$1/etc/shadow-" "$1/etc/gshadow" "$1/etc/gshadow-" && rm -rf "$1/root"'
    )
    command = [
        MMDEBSTRAP, "--quiet", "--variant=essential", f"--include={','.join(image.packages)}",
        "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        f"--customize-hook={hook}", image.suite, str(building), *sources,
    ]
    log(f"building the sandbox image {name} in {directory / image.folder} (mmdebstrap, about a minute)")
    started = time.monotonic()
    subprocess.run(command, check=True)
    stripped = strip_set_id_bits(building)
    log(f"stripped the setuid and setgid bits of {', '.join(stripped) or 'no file'}")
    building.chmod(0o755)
    stamp = directory / f"{image.folder}.json"
    stamp.unlink(missing_ok=True)
    old = directory / f".{image.folder}.old"
    shutil.rmtree(old, ignore_errors=True)
    if (directory / image.folder).exists():
        (directory / image.folder).rename(old)
    building.rename(directory / image.folder)
    shutil.rmtree(old, ignore_errors=True)
    stamp.write_text(json.dumps({"definition": image.definition(), "built_at": time.time()}, indent=1) + "\n")
    stamp.chmod(0o644)
    log(f"built the sandbox image {name} in {time.monotonic() - started:.0f} s")


def strip_set_id_bits(root: Path) -> list[str]:
    """Clear the setuid and setgid bits of every file and folder under ``root`` (Debian ships
    ``su``, ``newgrp`` and ``unix_chkpwd`` with them, and setgid folders), staying on ``root``'s
    file system and never following a symlink; return the paths changed as the image sees them
    (``/usr/bin/su``), sorted. A sandbox runs them all as its own user then, whatever no_new_privs would allow."""
    changed = []
    device = root.lstat().st_dev
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if os.lstat(os.path.join(folder, name)).st_dev == device]
        for path in [folder, *(os.path.join(folder, name) for name in files)]:
            info = os.lstat(path)
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & SET_ID_BITS:
                os.chmod(path, stat.S_IMODE(info.st_mode) & ~SET_ID_BITS)
                relative = os.path.relpath(path, root)
                changed.append("/" if relative == "." else f"/{relative}")
    return sorted(changed)


def _host_suite() -> str:
    """Return this machine's Debian codename ('' when it is not Debian or does not say)."""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandboxes.images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="the images folder (default: LAB_SANDBOX_IMAGES_DIR or var/sandbox-images)")
    parser.add_argument("--check", action="store_true", help="only say which images are not built (exit 1 when any)")
    args = parser.parse_args(argv)
    directory = (args.dir or images_dir()).absolute()
    stale = [name for name in IMAGES if not current(directory, name)]
    if args.check or not stale:
        for name in stale:
            print(f"the sandbox image {name} is not built in {directory}: run make sandbox-images")
        return 1 if stale else 0
    if shutil.which(MMDEBSTRAP) is None:
        print(f"{MMDEBSTRAP} is missing: install it (apt-get install mmdebstrap) to build the sandbox images", file=sys.stderr)
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build may have finished meanwhile
        for name in IMAGES:
            if not current(directory, name):
                build(directory, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
