"""A Hub environment that loads its dataset from the Hugging Face Hub by name, and that dataset as
a repository for the stand-in hub (``tests.support.model_dirs.HubServer``)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.load_environment_wheels import ARITH_BY_NAME
from tests.support.wheelbuilder import build_wheel

#: The stand-in hub's dataset repository and the commit it serves it at.
TINY_MATH = "someorg/tiny-math"
TINY_MATH_COMMIT = "5" * 40

#: A single-turn environment written as the Environments Hub's are: ``load_dataset`` of a Hub
#: dataset by name (no organization of Lab pushed it), a ``vf.SingleTurnEnv`` and a rubric.
TINY_MATH_ENVIRONMENT = (
    ARITH_BY_NAME.replace('"""Add two numbers from the acme/arith dataset."""', '"""Double a number, from the someorg/tiny-math dataset on the Hub."""')
    .replace('load_dataset("acme/arith"', 'load_dataset("someorg/tiny-math"')
    .replace("Answer with the sum only.", "Answer with the number only.")
)


def tiny_math_wheel(name: str = "tiny-math-env", version: str = "0.1.0") -> tuple[str, bytes]:
    """The environment that loads ``someorg/tiny-math`` from the Hub: ``(file name, wheel bytes)``."""
    return build_wheel(name, version, files={f"{name.replace('-', '_')}/__init__.py": TINY_MATH_ENVIRONMENT}, requires=["verifiers>=0.1.0", "datasets"])


def tiny_math_repository(folder: Path) -> Path:
    """Write ``someorg/tiny-math`` as a Hub dataset repository is laid out (``data/train.jsonl``,
    ``data/test.jsonl``: "What is twice N?" rows) into ``folder``; return it."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    rows = [{"question": f"What is twice {number}?", "answer": str(2 * number)} for number in range(10)]
    (folder / "data" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:8]))
    (folder / "data" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[8:]))
    return folder


#: A ``load_environment`` environment with an eval dataset only (as benchmark environments are):
#: it builds, evaluations run on it, and a training job naming it is refused at submit.
EVAL_ONLY_ENVIRONMENT = '''"""Answer a few sums; an evaluation benchmark, with no train split."""
import verifiers as vf
from datasets import Dataset


def correct(completion, answer, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return 1.0 if (text or "").strip() == answer else 0.0


def load_environment(**kwargs) -> vf.Environment:
    rows = [{"question": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(4)]
    rubric = vf.Rubric(funcs=[correct], weights=[1.0])
    return vf.SingleTurnEnv(eval_dataset=Dataset.from_list(rows), system_prompt="Answer with the sum only.", rubric=rubric, **kwargs)
'''


def eval_only_wheel(name: str = "sums-benchmark", version: str = "0.1.0") -> tuple[str, bytes]:
    """The environment with an eval dataset only: ``(file name, wheel bytes)``."""
    return build_wheel(name, version, files={f"{name.replace('-', '_')}/__init__.py": EVAL_ONLY_ENVIRONMENT}, requires=["verifiers>=0.1.0", "datasets"])
