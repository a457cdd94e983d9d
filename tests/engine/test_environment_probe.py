"""engine.environments.probe records the keys a load_environment module reads: a client made on
OpenAI's default key (a judge's ``AsyncOpenAI()``) loads at build with a placeholder and is
recorded as reading ``OPENAI_API_KEY``; any other failure of loading still fails the probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
