"""A package index in a folder: ``python -m environments.builder.package_index DIR`` writes
``DIR/simple/`` (PEP 503's simple repository API, static HTML) over the wheels and source
distributions (``.tar.gz``, ``.zip``) in ``DIR/files/``.

Builds resolve against a package index (``LAB_PACKAGE_INDEX_URL``); the tests point it at such a
folder (``file://<DIR>/simple``), which ``make package-index`` fills once from PyPI, so no test
reaches a remote index. Each link carries its file's ``#sha256=`` fragment, as PyPI's do, and its upload time
(``data-upload-time``, PEP 700's field, which uv reads: a resolve ``--exclude-newer`` a time
skips files without one): the time the file was added to ``files/``, its modification time.
Standard library only (it runs before anything is installed).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

#: The file names the index lists: wheels and source distributions.
_PATTERNS = ("*.whl", "*.tar.gz", "*.zip")


def _project(filename: str) -> str:
    """The normalized project name (PEP 503) of a wheel's file name (PEP 427: ``name-version-...``)
    or a source distribution's (``name-version.tar.gz``, where older ones keep ``-`` in the name:
    the name ends before the first ``-`` followed by a digit)."""
    if filename.endswith(".whl"):
        name = filename.split("-", 1)[0]
    else:
        name = re.split(r"-(?=\d)", filename, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _uploaded(path: Path) -> str:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_index(root: Path) -> int:
    """Write ``root/simple`` over the wheels and source distributions in ``root/files``; return how many projects it lists."""
    projects: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(path for pattern in _PATTERNS for path in (root / "files").glob(pattern)):
        projects[_project(path.name)].append(path)
    simple = root / "simple"
    simple.mkdir(parents=True, exist_ok=True)
    for name, paths in projects.items():
        links = "".join(
            f'<a data-upload-time="{_uploaded(path)}" href="../../files/{html.escape(path.name)}#sha256={_sha256(path)}">'
            f"{html.escape(path.name)}</a>\n"
            for path in paths
        )
        (simple / name).mkdir(exist_ok=True)
        (simple / name / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    listing = "".join(f'<a href="{name}/">{name}</a>\n' for name in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{listing}</body></html>\n")
    return len(projects)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the folder whose files/ holds the wheels")
    count = write_index(parser.parse_args().root)
    print(f"package index: {count} projects")


if __name__ == "__main__":
    main()
