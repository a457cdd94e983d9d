"""What every subcommand of the engine's command line shares: its exit codes (docs/api.md
"Engine exit codes") and how a role process ends with the engine that started it."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import traceback

EXIT_SUCCEEDED = 0
EXIT_CRASHED = 1
EXIT_INVALID = 2
EXIT_STOPPED = 3
EXIT_OOM = 4

logger = logging.getLogger("engine")

#: The variable that carries the token callers of `serve` must present (taken out of the environment at start).
SERVING_TOKEN_VARIABLE = "LAB_SERVING_TOKEN"

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4  # linux/prctl.h


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines too) made one space."""
    return " ".join(str(text).split())


def exception_line(error: BaseException) -> str:
    """The last line of `error`'s traceback, the exception line (`KeyError: 'data_plane_url'`),
    as one line of at most 500 characters: what a crashed attempt reports as its error."""
    return one_line(traceback.format_exception_only(error)[-1])[:500]


def prctl(option: int, value: int) -> None:
    """Linux `prctl(option, value)`; nothing elsewhere."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass


def exit_with_parent(parent: int) -> None:
    """Have Linux end this process when `parent` (the engine that started it) dies, however it
    dies (SIGTERM on `PR_SET_PDEATHSIG`); exit at once when that engine is already gone."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # not Linux: the engine's own stop still ends it
    if os.getppid() != parent:
        sys.exit(EXIT_CRASHED)
