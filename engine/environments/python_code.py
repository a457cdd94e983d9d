"""`lab/python-code`: write a small Python function; the reward runs it in a Lab sandbox.

The model's program never runs in the engine's process: it runs in a sandbox of the job's
organization (``engine.sandboxes``), one per environment and attempt, created at the first
reply scored and deleted when the attempt ends. Each reply runs in a fresh ``python3 -I``
process with a timeout: the sandbox defines the program's function, calls it on the example's
arguments and prints what it returned as JSON; the engine compares those values with the
expected ones, which never enter the sandbox, so a program can only score by computing them.
"""

from __future__ import annotations

import json
import random
import re
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine import sandboxes
from engine.catalog import list_environments
from engine.environments.base import Environment, EnvironmentFailed, Example, InvalidEnvironment, RewardFunction, Scores

#: The program that runs in the sandbox: define the reply's code, call its function on each
#: argument list, print the results as one JSON line last (``os._exit`` skips the program's own
#: exit handlers). A call that raises or returns what JSON cannot hold gives ``null``.
RUNNER = r"""
import io, json, os, sys
program, name, calls = os.environ["LAB_PROGRAM"], os.environ["LAB_FUNCTION"], json.loads(os.environ["LAB_CALLS"])
out = sys.stdout
sys.stdout = io.StringIO()
results = [None] * len(calls)
try:
    namespace = {"__name__": "solution"}
    exec(compile(program, "solution.py", "exec"), namespace)
    function = namespace[name]
    for index, arguments in enumerate(calls):
        try:
            results[index] = json.loads(json.dumps({"value": function(*arguments)}))
        except BaseException:
            pass
except BaseException:
    pass
out.write("\n" + json.dumps(results) + "\n")
out.flush()
os._exit(0)
"""

_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Task:
    """One function to write: its ``name`` and arguments, what it does, a reference
    implementation, and how to draw an argument list."""

    name: str
    parameters: str
    description: str
    reference: Callable
    arguments: Callable[[random.Random], list]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))


def _fizzbuzz(n: int) -> str:
    return "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)


def _factorial(n: int) -> int:
    result = 1
    for factor in range(2, n + 1):
        result *= factor
    return result


TASKS = (
    Task("add", "a, b", "returns the sum of the integers a and b", lambda a, b: a + b,
         lambda rng: [rng.randint(-50, 50), rng.randint(-50, 50)]),
    Task("square", "x", "returns x multiplied by itself", lambda x: x * x, lambda rng: [rng.randint(-20, 20)]),
    Task("reverse_string", "s", "returns the string s reversed", lambda s: s[::-1], lambda rng: [_word(rng)]),
    Task("count_vowels", "s", "returns how many of the characters of s are vowels (a, e, i, o, u)",
         lambda s: sum(c in "aeiou" for c in s), lambda rng: [_word(rng)]),
    Task("maximum", "numbers", "returns the largest number of the non-empty list numbers", max,
         lambda rng: [[rng.randint(-99, 99) for _ in range(rng.randint(1, 6))]]),
    Task("is_even", "n", "returns True when the integer n is even, else False", lambda n: n % 2 == 0,
         lambda rng: [rng.randint(-100, 100)]),
    Task("factorial", "n", "returns n! (1 for n = 0)", _factorial, lambda rng: [rng.randint(0, 8)]),
    Task("fizzbuzz", "n", 'returns "FizzBuzz" when n is a multiple of 15, "Fizz" of 3, "Buzz" of 5, else str(n)',
         _fizzbuzz, lambda rng: [rng.randint(1, 60)]),
)


#: The longest program run (characters): an environment variable holds it, and Linux caps one at 128 KiB.
MAX_PROGRAM_CHARS = 32_768


def program_of(completion: str) -> str:
    """Return the code of a reply: its first fenced code block, else the whole reply; without the
    NULs and unpaired surrogates no environment variable can hold, cut at ``MAX_PROGRAM_CHARS``."""
    match = _CODE_BLOCK.search(completion)
    code = (match.group(1) if match else completion).strip().replace("\x00", "")
    return code.encode("utf-8", "replace").decode("utf-8")[:MAX_PROGRAM_CHARS]


def _unbound(completion: str, example: Example) -> float:
    raise TypeError("lab/python-code's reward functions are bound to an environment (PythonCode.__init__)")


class PythonCode(Environment):
    """Prompts "Write a Python function f(...) that ..."; reward is the fraction of the example's
    calls whose result, computed in a Lab sandbox, equals the expected value."""

    info = list_environments()["lab/python-code"]
    rubric = (
        RewardFunction("passed", 1.0, _unbound),
        RewardFunction("all_passed", 0.0, _unbound),
    )

    def __init__(self, args: dict, seed: int) -> None:
        super().__init__(args, seed)
        self._lock = threading.Lock()
        self._sandbox: sandboxes.Sandbox | None = None
        # One run of the program gives both scores (``score``); alone, each runs it.
        self.rubric = tuple(
            RewardFunction(f.name, f.weight, lambda completion, example, name=f.name: self.score(completion, example).functions[name])
            for f in type(self).rubric
        )

    def check_args(self) -> None:
        if (not 1 <= self.args["num_tests"] <= 20 or not 0.5 <= self.args["timeout_s"] <= 60
                or not 0.125 <= self.args["memory_gb"] <= 4):
            raise InvalidEnvironment("lab/python-code needs 1 <= num_tests <= 20, 0.5 <= timeout_s <= 60 and 0.125 <= memory_gb <= 4")

    def make_example(self, rng: random.Random) -> Example:
        task = rng.choice(TASKS)
        calls = [task.arguments(rng) for _ in range(self.args["num_tests"])]
        shown = ", ".join(repr(argument) for argument in calls[0])
        return Example(
            messages=[
                {"role": "system", "content": "You write Python. Reply with the code only, in one ```python block."},
                {"role": "user", "content": (
                    f"Write a Python function {task.name}({task.parameters}) that {task.description}. "
                    f"For example, {task.name}({shown}) returns {task.reference(*calls[0])!r}."
                )},
            ],
            answer=json.dumps([task.reference(*arguments) for arguments in calls]),
            info={"function": task.name, "calls": calls},
        )

    def score(self, completion: str, example: Example) -> Scores:
        """Run the reply's function on the example's calls in the sandbox and compare each result
        with the expected value; ``passed`` is the fraction equal, ``all_passed`` 1 when all are.
        A program that fails, prints nothing we can read or runs past ``timeout_s`` passes none.
        Raises EnvironmentFailed when no sandbox can be had (the attempt's retries apply)."""
        expected = json.loads(example.answer)
        results = self._run(program_of(completion), example.info["function"], example.info["calls"])
        # Compared as JSON, so that 1 is no True and 2.0 no 2.
        right = sum(
            1 for result, value in zip(results, expected)
            if isinstance(result, dict) and "value" in result and json.dumps(result["value"]) == json.dumps(value)
        )
        functions = {"passed": right / len(expected), "all_passed": 1.0 if right == len(expected) else 0.0}
        return Scores(reward=sum(f.weight * functions[f.name] for f in self.rubric), functions=functions)

    def _run(self, program: str, function: str, calls: list) -> list:
        """Return the results the sandbox printed (``None`` for each call when it printed none);
        a sandbox that is gone is replaced once."""
        environment = {"LAB_PROGRAM": program, "LAB_FUNCTION": function, "LAB_CALLS": json.dumps(calls)}
        for retry in (False, True):
            sandbox = self._ensure_sandbox()
            try:
                result = sandbox.run(["python3", "-I", "-c", RUNNER], timeout_s=float(self.args["timeout_s"]), environment=environment)
                break
            except sandboxes.SandboxError as error:
                if not error.gone or retry:
                    raise EnvironmentFailed(f"lab/python-code: {error}") from None
                with self._lock:
                    self._sandbox = None
        if result.timed_out or result.exit_code != 0:
            return [None] * len(calls)
        lines = result.stdout.rstrip("\n").rsplit("\n", 1)
        try:
            results = json.loads(lines[-1])
        except ValueError:
            return [None] * len(calls)
        return results if isinstance(results, list) and len(results) == len(calls) else [None] * len(calls)

    def _ensure_sandbox(self) -> sandboxes.Sandbox:
        with self._lock:
            if self._sandbox is None:
                try:
                    self._sandbox = sandboxes.current().create(
                        name="lab/python-code", image="python:3.11", cpu_cores=1.0,
                        memory_gb=float(self.args["memory_gb"]), disk_gb=0.05, network="none",
                    )
                except sandboxes.SandboxError as error:
                    raise EnvironmentFailed(f"lab/python-code: {error}") from None
            return self._sandbox
