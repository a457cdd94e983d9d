"""The ``slow`` tier (tests/conftest.py): the tests tests/support/test_costs.json records at
``SLOW_TEST_S`` seconds or more, and no other, are what ``make test-slow`` selects and what
``make test`` leaves out; the record names only tests that exist."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.conftest import SLOW_TEST_S
from tests.support.module_costs import TESTS_RECORD, recorded

ROOT = Path(__file__).resolve().parents[1]


def collected(*args: str) -> set[str]:
    """The ids of the tests a child pytest collects with ``args``."""
    found = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env={**os.environ, "PYTEST_ADDOPTS": ""}, capture_output=True, text=True, timeout=300,
    )
    assert found.returncode == 0, found.stdout[-3000:] + found.stderr[-3000:]
    return {line for line in found.stdout.splitlines() if "::" in line}


def test_make_test_slow_selects_the_recorded_slow_tests_and_make_test_the_others():
    costs = recorded(TESTS_RECORD)
    slow = {test for test, seconds in costs.items() if seconds >= SLOW_TEST_S}
    assert slow, "tests/support/test_costs.json records no slow test"
    # The module with most slow tests among those the record shows holding a faster one too, so
    # that both selections are seen to split it.
    split = {test.split("::")[0] for test, seconds in costs.items() if seconds < SLOW_TEST_S}
    module = Counter(test.split("::")[0] for test in slow if test.split("::")[0] in split).most_common(1)[0][0]
    everything = collected(module)
    assert slow & everything, f"the record names tests of {module} that it no longer has"
    assert collected(module, "-m", "slow") == slow & everything
    assert collected(module, "-m", "not slow") == everything - slow


def test_the_record_names_only_modules_that_exist():
    gone = sorted({test.split("::")[0] for test in recorded(TESTS_RECORD)} - {p.relative_to(ROOT).as_posix() for p in ROOT.glob("tests/**/test_*.py")})
    assert gone == [], f"tests/support/test_costs.json names modules that no longer exist: {gone}; record a new run"
