"""engine.environments.probe records the keys a load_environment module reads: a client made on
OpenAI's default key (a judge's ``AsyncOpenAI()``) loads at build with a placeholder and is
recorded as reading ``OPENAI_API_KEY``; any other failure of loading still fails the probe; a probe in a
process that goes on (a bridge's) puts back what loading changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.environments import probe

JUDGED = '''
from openai import AsyncOpenAI


class Environment:
    def __init__(self, judge):
        self.judge = judge


def load_environment(judge_model: str = "gpt-4.1-mini"):
    return Environment(AsyncOpenAI())  # OpenAI's default key: OPENAI_API_KEY
'''


def _probe(tmp_path: Path, source: str) -> dict:
    (tmp_path / "judged_env.py").write_text(source)
    out = tmp_path / "summary.json"
    environment = {name: value for name, value in os.environ.items() if name != "OPENAI_API_KEY"}
    environment["PYTHONPATH"] = str(tmp_path)
    subprocess.run([sys.executable, probe.__file__, "judged_env", "verifiers", "", str(out)], env=environment, check=True,
                   capture_output=True, timeout=120)
    return json.loads(out.read_text())


def test_a_client_on_openais_default_key_loads_with_a_placeholder_and_the_key_is_recorded(tmp_path):
    summary = _probe(tmp_path, JUDGED)
    assert (summary["api"], summary["secrets"]) == ("v0", ["OPENAI_API_KEY"])
    assert summary["parameters"] == [{"name": "judge_model", "default": "gpt-4.1-mini", "type": "str", "required": False}]


def test_another_failure_of_loading_still_fails_the_probe(tmp_path):
    summary = _probe(tmp_path, JUDGED.replace("return Environment(AsyncOpenAI())", "raise ValueError('no dataset')"))
    assert summary == {"error": "loading it raised ValueError: no dataset"}


IN_PLACE = '''
import os

import verifiers as vf
from openai import AsyncOpenAI


def load_environment():
    vf.ensure_keys(["NC_PROBE_KEY"])
    return {"key": os.environ["NC_PROBE_KEY"], "judge": AsyncOpenAI()}
'''

#: verifiers' v0 ``ensure_keys``, as a package reaches it: it raises for a key that is not set.
ENSURE_KEYS = '''
import os


def ensure_keys(keys):
    missing = [key for key in keys if not os.environ.get(key)]
    if missing:
        raise ValueError(f"missing {missing}")
'''


def test_a_probe_in_a_process_that_goes_on_puts_back_what_loading_changed(tmp_path, monkeypatch):
    """A bridge probes a package in its own process, then loads it as a job would: the keys read
    placeholders and ensure_keys never raised while it was probed, and no longer afterwards."""
    (tmp_path / "verifiers").mkdir()
    (tmp_path / "verifiers" / "__init__.py").write_text(ENSURE_KEYS)
    (tmp_path / "probed_in_place.py").write_text(IN_PLACE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("NC_PROBE_KEY", raising=False)
    before = dict(os.environ)
    try:
        found = probe.summary("probed_in_place", "verifiers", "", as_job=False)
        import probed_in_place
        import verifiers
    finally:
        imported = [sys.modules.pop(name, None) for name in ("probed_in_place", "verifiers")]
    assert (found["api"], found["secrets"]) == ("v0", ["NC_PROBE_KEY", "OPENAI_API_KEY"])
    assert dict(os.environ) == before
    assert imported == [probed_in_place, verifiers]
    assert probed_in_place.vf.ensure_keys is verifiers.ensure_keys
    with pytest.raises(ValueError, match="NC_PROBE_KEY"):
        verifiers.ensure_keys(["NC_PROBE_KEY"])
