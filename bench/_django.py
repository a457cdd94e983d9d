"""Set Django up for a benchmark on its own, fresh PostgreSQL database.

``DATABASE_URL`` names the server (default ``postgres://postgres@127.0.0.1:5432/lab``); the
benchmark uses the database ``<name>_bench`` on it, dropped and migrated anew on every run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def setup(data_dir: Path | None = None) -> str:
    """Point Django at a fresh bench database, migrate it, and return its URL."""
    import psycopg

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lab")
    server, _, name = base.rpartition("/")
    bench_name = f"{name}_bench"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{bench_name}"')
    url = f"{server}/{bench_name}"
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("LAB_DATA_DIR", str(data_dir or Path(tempfile.mkdtemp(prefix="lab-bench-"))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
    sys.path[:0] = [str(REPO), str(REPO / "sdk")]
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return url


def report(name: str, value: float, unit: str, baseline: float | None, **extra) -> None:
    """Print one docs/architecture.md "Tests and benchmarks" JSON line; ``ratio`` is value / baseline."""
    line = {
        "name": name,
        "value": round(value, 3),
        "unit": unit,
        "baseline": baseline,
        "ratio": round(value / baseline, 3) if baseline else None,
        **extra,
    }
    print(json.dumps(line), flush=True)
