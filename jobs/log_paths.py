"""Keep this server's file system out of the logs users read: an engine run by the local launcher
prints paths under Lab's data dir, its model cache, the repository and the Python environment
(tracebacks, warnings, checkpoint paths), which say nothing useful to a user and much about the
server. Each such prefix is replaced by a placeholder naming what it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

#: A prefix this short (``/usr``, ``/opt``) is too general to stand for a server directory.
MIN_PREFIX_PARTS = 3


def server_path_prefixes() -> tuple[tuple[str, str], ...]:
    """Return ``(prefix, placeholder)`` pairs, longest prefix first: ``LAB_MODEL_DIR`` →
    ``$LAB_MODEL_DIR``, ``LAB_DATA_DIR`` → ``$LAB_DATA_DIR``, the repository → ``<lab>``, the
    Python environment (``sys.prefix``, ``sys.base_prefix``) → ``<python>``."""
    candidates = [
        (settings.LAB_MODEL_DIR, "$LAB_MODEL_DIR"),
        (settings.LAB_DATA_DIR, "$LAB_DATA_DIR"),
        (settings.BASE_DIR, "<lab>"),
        (sys.prefix, "<python>"),
        (sys.base_prefix, "<python>"),
    ]
    pairs = {}
    for path, placeholder in candidates:
        resolved = str(Path(path).resolve())
        if len(Path(resolved).parts) >= MIN_PREFIX_PARTS:
            pairs.setdefault(resolved, placeholder)
    return tuple(sorted(pairs.items(), key=lambda pair: -len(pair[0])))


def path_hider() -> Callable[[str], str]:
    """Return a function that replaces, in a line, every prefix of :func:`server_path_prefixes`
    (read once, for a batch of lines): ``/srv/lab/var/runs/job_1/...`` →
    ``$LAB_DATA_DIR/runs/job_1/...``."""
    prefixes = server_path_prefixes()

    def hide(line: str) -> str:
        for prefix, placeholder in prefixes:
            if prefix in line:
                line = line.replace(prefix, placeholder)
        return line

    return hide
