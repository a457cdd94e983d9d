"""labsdk stands alone: it imports neither Django, torch nor Lab's server or engine code."""

import subprocess
import sys


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
