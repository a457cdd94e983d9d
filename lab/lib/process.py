"""Guards every Lab process puts on itself before it holds secrets or writes data.

Lab's processes (web, worker, beat, management commands) hold ``SECRET_KEY``, ``DATABASE_URL`` and
the Stripe keys in their environment, and write tenants' data under ``LAB_DATA_DIR``. Code Lab
runs for users (environment packages, sandbox commands) runs in sandboxes; these guards are the
second line behind them, for whatever runs as the same user anyway:

- ``PR_SET_DUMPABLE`` 0 (prctl(2)): a non-dumpable process's ``/proc/<pid>/environ``, ``mem`` and
  ``fd`` belong to root, so another process of the same unprivileged user cannot read its secrets,
  and it cannot be ptraced by one;
- umask 077: every file and folder Lab creates is its user's alone (0600 and 0700).
"""

from __future__ import annotations

import ctypes
import os

#: prctl(2) option (linux/prctl.h).
PR_SET_DUMPABLE = 4
#: The umask of Lab's processes: no group or other permissions on anything they create.
PRIVATE_UMASK = 0o077


def make_private() -> None:
    """Make this process non-dumpable (Linux; elsewhere nothing) and set its umask to 077."""
    os.umask(PRIVATE_UMASK)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0)
    except (OSError, AttributeError):  # not Linux
        pass
