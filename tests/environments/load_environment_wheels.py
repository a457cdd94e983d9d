"""``load_environment`` packages as the Environments Hub's are written (verifiers' v0 API:
``def load_environment(**kwargs) -> vf.Environment``, an unbounded ``verifiers>=0.1.0``), built
as wheels in tests."""

from __future__ import annotations

from tests.support.wheelbuilder import build_wheel

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
