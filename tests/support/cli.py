"""The lab command line run as a subprocess against a live Lab."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LAB_SCRIPT = Path(sys.executable).with_name("lab")


def lab_cli(*argv: str, key: str | None, base_url: str) -> subprocess.CompletedProcess:
    """Run ``lab ARGV`` against ``base_url`` with ``key`` (none when ``None``)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LAB_")}
    env["LAB_BASE_URL"] = base_url
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    if key is not None:
        env["LAB_API_KEY"] = key
    command = [str(LAB_SCRIPT)] if LAB_SCRIPT.exists() else [sys.executable, "-m", "labsdk.cli"]
    return subprocess.run([*command, *argv], env=env, capture_output=True, text=True, timeout=60)
