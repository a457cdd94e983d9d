"""labsdk stands alone: it imports neither Django, torch nor Lab's server or engine code."""

import subprocess
import sys
from pathlib import Path


def test_importing_the_sdk_and_cli_pulls_in_no_server_or_engine_code():
    code = (
        "import sys, labsdk, labsdk.cli, labsdk.spec; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'django', 'rest_framework', 'torch', 'engine', 'jobs', 'lab', 'billing'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/", check=False
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_what_pip_install_of_the_sdks_leaves_behind_is_ignored():
    """``pip install ./sdk`` and ``pip install ./sdk/lab-environments`` write build/ beside their
    sources; git ignores both, so a user's checkout shows nothing untracked."""
    root = Path(__file__).resolve().parents[2]
    paths = ["sdk/build/lib/labsdk/client.py", "sdk/lab-environments/build/lib/lab_environments/__init__.py"]
    result = subprocess.run(["git", "check-ignore", *paths], cwd=root, capture_output=True, text=True, check=False)
    assert result.stdout.split() == paths, result.stderr
