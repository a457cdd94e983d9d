"""An engine stand-in for the local launcher tests."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine_stand_in(tmp_path) -> Path:
    """An interpreter for the launcher that runs the supervisor for real and, in place of the
    engine, prints its own environment as JSON."""
    script = tmp_path / "python"
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "engine" ]; then exec "{sys.executable}" -c "{dump}"; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script
