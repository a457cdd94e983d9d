"""The lab command line run as a subprocess against a live Lab."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LAB_SCRIPT = Path(sys.executable).with_name("lab")


def _command_and_env(argv: tuple[str, ...], key: str | None, base_url: str, env: dict[str, str] | None):
    """``lab ARGV``'s command line and environment: this one without its ``LAB_*`` variables,
    then ``base_url``, ``key`` (none when ``None``) and ``env``."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("LAB_")}
    environment["LAB_BASE_URL"] = base_url
    environment["NO_COLOR"] = "1"
    environment["COLUMNS"] = "200"
    if key is not None:
        environment["LAB_API_KEY"] = key
    environment.update(env or {})
    command = [str(LAB_SCRIPT)] if LAB_SCRIPT.exists() else [sys.executable, "-m", "labsdk.cli"]
    return [*command, *argv], environment


def lab_cli(*argv: str, key: str | None, base_url: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``lab ARGV`` against ``base_url`` with ``key`` (none when ``None``) and the variables ``env``."""
    command, environment = _command_and_env(argv, key, base_url, env)
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)


def lab_cli_started(*argv: str, key: str | None, base_url: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``lab ARGV`` as ``lab_cli`` runs it, without waiting (for a command that waits,
    ``--wait``); its output is text on pipes (``communicate``)."""
    command, environment = _command_and_env(argv, key, base_url, env)
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
