"""What each test module and each long test costs, for ordering ``make test``'s modules costliest
first and for the ``slow`` tier (tests/conftest.py).

``module_costs.json`` beside this file maps a module (relative to the repository root) to the
seconds its tests took in a recorded run (setup, call and teardown of every test summed). Only the
order matters, so a stale figure costs a little balance, never a result; a module not recorded is
estimated from its tests' tiers (tests/conftest.py). ``test_costs.json`` maps the id of each test
that took at least :data:`RECORDED_TEST_S` seconds in that run to its seconds. Record a new run
(every tier but ``real_model``) with::

    pytest -m "not real_model" -n 2 --dist loadfile --no-loadscope-reorder --durations=0 -q > run.log
    python -m tests.support.module_costs run.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

RECORD = Path(__file__).with_name("module_costs.json")
TESTS_RECORD = Path(__file__).with_name("test_costs.json")

#: The shortest test ``test_costs.json`` records, in seconds: below the ``slow`` tier's bound
#: (tests/conftest.py ``SLOW_TEST_S``), which may then move without recording again.
RECORDED_TEST_S = 5.0

#: One line of pytest's ``--durations`` report: ``1.23s call     tests/x/test_y.py::test_z[a b]``.
_DURATION = re.compile(r"^(?P<seconds>[\d.]+)s (?:setup|call|teardown)\s+(?P<test>(?P<module>[^:\s]+)::.+?)\s*$")


def recorded(path: Path = RECORD) -> dict[str, float]:
    """The seconds per module (or, from ``TESTS_RECORD``, per test id) recorded in ``path`` ({}
    when nothing is recorded)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def record(report: str, path: Path = RECORD, tests_path: Path = TESTS_RECORD) -> dict[str, float]:
    """Sum a ``--durations=0`` report per module and write it to ``path``, and per test, those of
    at least :data:`RECORDED_TEST_S` seconds, to ``tests_path``; return the modules' figures."""
    modules: Counter = Counter()
    tests: Counter = Counter()
    for line in report.splitlines():
        if match := _DURATION.match(line):
            modules[match["module"]] += float(match["seconds"])
            tests[match["test"]] += float(match["seconds"])
    figures = {module: round(seconds, 1) for module, seconds in sorted(modules.items())}
    path.write_text(json.dumps(figures, indent=0) + "\n")
    long = {test: round(seconds, 1) for test, seconds in sorted(tests.items()) if seconds >= RECORDED_TEST_S}
    tests_path.write_text(json.dumps(long, indent=0) + "\n")
    return figures


def costliest_first(items: list, root: Path, figures: dict[str, float], estimate: Callable[[object], float]) -> None:
    """Sort collected ``items`` in place: modules by cost, costliest first, each module whole and in
    its own order. A module costs its figure in ``figures`` (seconds, keyed by its path relative to
    ``root``), else the sum of ``estimate(item)`` over its items."""
    estimated: Counter = Counter()
    for item in items:
        estimated[item.path] += estimate(item)

    def order(item) -> tuple[float, str]:
        module = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        return -figures.get(module, estimated[item.path]), module

    items.sort(key=order)


if __name__ == "__main__":
    print(f"recorded {len(record(Path(sys.argv[1]).read_text()))} modules in {RECORD}, the long tests in {TESTS_RECORD}")
