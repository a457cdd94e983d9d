"""``load_environment`` packages as the Environments Hub's are written (verifiers' v0 API:
``def load_environment(**kwargs) -> vf.Environment``, an unbounded ``verifiers>=0.1.0``), built
as wheels in tests."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.support.wheelbuilder import build_wheel

#: Packages laid out as the Environments Hub's are (``pyproject.toml`` and one module defining
#: ``load_environment``), one folder each: ``number-guess`` (a ``vf.MultiTurnEnv`` game),
#: ``tool-arithmetic`` (a ``vf.ToolEnv`` with Python functions as tools) and ``vault-lookup`` (a
#: ``vf.StatefulToolEnv`` whose tool takes an argument the environment supplies from its state).
FIXTURES = Path(__file__).resolve().parents[1] / "environments" / "fixtures"


def fixture_wheel(name: str) -> tuple[str, bytes]:
    """The package in ``tests/environments/fixtures/<name>`` as a wheel, ``(file name, bytes)``: its module, and its
    pyproject's name, version and dependencies as the wheel's metadata."""
    root = FIXTURES / name
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    module = f"{project['name'].replace('-', '_')}.py"
    return build_wheel(project["name"], project["version"], files={module: (root / module).read_text()}, requires=project["dependencies"])


#: A single-turn environment on an in-memory dataset, scored by a two-function rubric.
TINY_SINGLE_TURN = '''"""Say the number after the given one."""
import verifiers as vf
from datasets import Dataset


def correct(completion, answer, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return 1.0 if text.strip() == answer else 0.0


def short(completion, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return 1.0 if len(text) <= 4 else 0.0


def load_environment(num_examples: int = 10, system_prompt: str = "Answer with a number.", **kwargs) -> vf.Environment:
    vf.ensure_keys(["TINY_JUDGE_KEY"])
    dataset = Dataset.from_list(
        [{"question": f"What comes after {n}?", "answer": str(n + 1)} for n in range(num_examples)]
    )
    rubric = vf.Rubric(funcs=[correct, short], weights=[1.0, 0.25])
    return vf.SingleTurnEnv(dataset=dataset, system_prompt=system_prompt, rubric=rubric, **kwargs)
'''


def tiny_single_turn_wheel(name: str = "tiny-count", version: str = "0.1.0", requires: list[str] | None = None) -> tuple[str, bytes]:
    """The single-turn package: ``(file name, wheel bytes)``, requiring ``verifiers>=0.1.0`` and ``datasets``."""
    module = name.replace("-", "_")
    return build_wheel(
        name, version, files={f"{module}/__init__.py": TINY_SINGLE_TURN},
        requires=["verifiers>=0.1.0", "datasets"] if requires is None else requires,
    )


#: A single-turn environment written as Hub environments are: an XML parser, a rubric of two
#: weighted functions that read the parsed answer and the reply's length, no secrets.
DOUBLE_IT = '''"""Double the given number, answering in <answer> tags."""
import verifiers as vf
from datasets import Dataset

parser = vf.XMLParser(["answer"])


def exact(completion, answer, **kwargs) -> float:
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def length_penalty(completion, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return max(0.0, 1.0 - len(text or "") / 64)


def load_environment(num_examples: int = 8, **kwargs) -> vf.Environment:
    dataset = Dataset.from_list(
        [{"question": f"What is {n} doubled?", "answer": str(2 * n)} for n in range(num_examples)]
    )
    rubric = vf.Rubric(funcs=[exact, length_penalty], weights=[1.0, 0.1], parser=parser)
    return vf.SingleTurnEnv(
        dataset=dataset, system_prompt="Answer inside <answer></answer>.", parser=parser, rubric=rubric, **kwargs
    )
'''


def double_it_wheel(name: str = "double-it", version: str = "0.1.0") -> tuple[str, bytes]:
    """The ``DOUBLE_IT`` package: ``(file name, wheel bytes)``, requiring ``verifiers>=0.1.0`` and ``datasets``."""
    return build_wheel(name, version, files={f"{name.replace('-', '_')}/__init__.py": DOUBLE_IT}, requires=["verifiers>=0.1.0", "datasets"])


#: A single-turn environment whose dataset is loaded by name, as most Hub environments load
#: theirs (``load_dataset("owner/name", split="train")``): Lab's builds and jobs find it only
#: once the organization pushed ``acme/arith`` (``lab datasets push``), offline.
ARITH_BY_NAME = '''"""Add two numbers from the acme/arith dataset."""
import verifiers as vf
from datasets import load_dataset


def correct(completion, answer, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return 1.0 if (text or "").strip() == answer else 0.0


def brief(completion, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return 1.0 if len(text or "") <= 6 else 0.0


def load_environment(**kwargs) -> vf.Environment:
    dataset = load_dataset("acme/arith", split="train")
    rubric = vf.Rubric(funcs=[correct, brief], weights=[1.0, 0.2])
    return vf.SingleTurnEnv(dataset=dataset, system_prompt="Answer with the sum only.", rubric=rubric, **kwargs)
'''

#: The rows of ``acme/arith`` (JSON lines with ``question`` and ``answer``), as its ``train.jsonl``.
ARITH_ROWS = "".join(f'{{"question": "What is {a} + {b}?", "answer": "{a + b}"}}\n' for a in range(3) for b in range(4))


def arith_by_name_wheel(name: str = "arith-by-name", version: str = "0.1.0") -> tuple[str, bytes]:
    """The environment that loads ``acme/arith`` by name: ``(file name, wheel bytes)``."""
    return build_wheel(name, version, files={f"{name.replace('-', '_')}/__init__.py": ARITH_BY_NAME}, requires=["verifiers>=0.1.0", "datasets"])


#: A single-turn environment on a real PyPI package's tasks, written as the Environments Hub's
#: ``reasoning_gym`` environments are: ``reasoning_gym.create_dataset(name, size=..., seed=...)``
#: wrapped into a ``vf.SingleTurnEnv``, scored by the task's own ``score_answer``. reasoning-gym's
#: closure has three source archives only (cellpylib, pycosat, zss) that a build makes wheels of.
REASONING_GYM = '''"""Tasks of reasoning-gym, answered inside <answer> tags and scored by the task itself."""
import reasoning_gym
import verifiers as vf
from datasets import Dataset


def load_environment(gym: str = "basic_arithmetic", num_examples: int = 16, seed: int = 0, **kwargs) -> vf.Environment:
    tasks = reasoning_gym.create_dataset(gym, size=num_examples, seed=seed)
    entries = list(tasks)
    dataset = Dataset.from_list(
        [{"question": entry["question"], "answer": str(entry["answer"]), "info": {"index": index}} for index, entry in enumerate(entries)]
    )
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def task_score(completion, info, **kwargs) -> float:
        return float(tasks.score_answer(parser.parse_answer(completion), entries[info["index"]]))

    rubric = vf.Rubric(funcs=[task_score, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    return vf.SingleTurnEnv(
        dataset=dataset, system_prompt="Answer inside <answer></answer>.", parser=parser, rubric=rubric, **kwargs
    )
'''


def reasoning_gym_wheel(name: str = "rg-arithmetic", version: str = "0.1.0") -> tuple[str, bytes]:
    """The ``REASONING_GYM`` package: ``(file name, wheel bytes)``, requiring ``verifiers>=0.1.0``,
    ``reasoning-gym`` and ``datasets``."""
    return build_wheel(
        name, version, files={f"{name.replace('-', '_')}/__init__.py": REASONING_GYM},
        requires=["verifiers>=0.1.0", "reasoning-gym", "datasets"],
    )


DOUBLE_IT_PYPROJECT = """[project]
name = "double-it"
version = "{version}"
description = "Double the given number, answering in <answer> tags."
requires-python = ">=3.10"
dependencies = ["verifiers>=0.1.0", "datasets"]

[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[tool.setuptools]
py-modules = ["double_it"]
"""


def double_it_dir(parent: Path, version: str = "0.1.0") -> Path:
    """An environment's directory as Hub environments are laid out: ``pyproject.toml`` and the
    module defining ``load_environment`` (the ``DOUBLE_IT`` fixture package's source)."""
    folder = parent / "double_it"
    folder.mkdir(exist_ok=True)
    (folder / "pyproject.toml").write_text(DOUBLE_IT_PYPROJECT.format(version=version))
    (folder / "double_it.py").write_text(DOUBLE_IT)
    return folder
