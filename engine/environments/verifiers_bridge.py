"""The verifiers bridge: a small program run with the verifiers environment's Python
(``.venv-verifiers``, requirements-verifiers.txt) that loads a job's verifiers v1 tasksets and
scores completions with them, for an engine that cannot import verifiers itself (its
transformers and mcp pins clash with the engine's: docs/environments.md).

It imports only the standard library and verifiers, never the engine: the engine starts it as
``python -I verifiers_bridge.py --site <dir>`` (isolated: no PYTHONPATH, no user site, not even
this file's directory on ``sys.path``), in the attempt's work dir, with a minimal environment
and in its own process group (``engine/environments/verifiers_taskset.py``). ``--site`` is the
directory the job's packages were installed into; it is *appended* to ``sys.path``, so a package
can never shadow verifiers or one of its dependencies.

The protocol is JSON lines: one request object per line on stdin, one answer per line on stdout,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"code", "message"[, "module"]}}``.
On start, before reading anything, it writes ``{"ok": true, "result": {"verifiers_version",
"python"}}``. Requests (``op``):

- ``describe {taskset}``: the taskset's arguments (its ``TasksetConfig`` fields with a JSON
  default other than null, but ``id``, ``task`` and ``system_prompt``) and description;
- ``open {taskset, args}``: build the run's ``Env`` as verifiers does
  (``resolve_env_config`` + ``load_environment``, with ``harness.id = "null"`` and
  ``runtime.type = "subprocess"`` so nothing defaults to Prime's sandbox), check that it is a
  single-turn one, and answer ``{handle, rewards: [{name, weight}], bounded, sizes}`` (``sizes``:
  tasks per split, null for an infinite taskset);
- ``tasks {handle, split, start, n, seed}``: ``n`` tasks from position ``start`` as chat
  ``messages`` (the task's ``system_prompt`` as a system message, then its prompt, as verifiers'
  ``null`` harness sends them) with an opaque ``id`` for ``score``;
- ``score {handle, task_id, completion}``: a trace of the prompt and one sampled assistant
  message, scored offline by ``await task.score(trace)`` as ``vf-replay`` does, answering
  ``{reward, functions: {name: score}, weights: {name: weight}}``; ``reward`` is
  ``trace.reward``, the sum of score x weight.

Splits: verifiers v1 tasksets have none, so the bridge makes Lab's three disjoint ones with the
engine's own rule (``engine.environments.split_of``): a task belongs to the split its prompt's
messages hash to (SHA-256 of canonical JSON, modulo 16: 0 eval, 1 val, else train). ``eval`` and
``val`` read their tasks in the taskset's load order; ``train`` reads a bounded taskset's in one
shuffled order per pass (``random.Random(f"{seed}:{pass}")``) and an infinite one's in load
order. Positions past the end of a bounded split wrap around. A bounded taskset none of whose
tasks falls in a split uses all its tasks for that split (they then overlap; said on stderr).
An end of stdin ends the program.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import inspect
import itertools
import json
import os
import random
import signal
import sys
import traceback

#: Fields of every TasksetConfig that a job's args never set.
_CONFIG_FIELDS_NOT_ARGS = frozenset({"id", "task", "system_prompt"})
#: Most tasks of a bounded taskset read into memory (a larger one is refused).
MAX_TASKS = 1_000_000


class BridgeError(Exception):
    """A refusal answered to the engine: ``code`` is one of missing_module, not_single_turn,
    invalid_args, invalid_taskset, invalid_request, scoring_failed."""

    def __init__(self, code: str, message: str, module: str | None = None):
        super().__init__(message)
        self.code, self.module = code, module


def _missing_module(error: ModuleNotFoundError, what: str) -> BridgeError:
    name = error.name or str(error)
    return BridgeError("missing_module", f"{what} needs the module '{name}'", module=name)


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:500]


SPLITS = ("train", "eval", "val")
#: The split rule of the engine's own environments (engine.environments.split_of): the SHA-256 of
#: a prompt's messages as canonical JSON, modulo 16: 0 is eval's, 1 val's, the rest train's.
SPLIT_BUCKETS, EVAL_BUCKET, VAL_BUCKET = 16, 0, 1
#: Tasks of an infinite taskset read in a row without one of the split before the split gives up
#: being disjoint and reads the taskset in load order.
MAX_SPLIT_SCAN = 4096


def split_of(messages: list[dict]) -> str:
    """Return the split ("train", "eval" or "val") a prompt's chat messages belong to."""
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":")).encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % SPLIT_BUCKETS
    return "eval" if bucket == EVAL_BUCKET else "val" if bucket == VAL_BUCKET else "train"


class Opened:
    """One opened taskset: its Env's taskset and the tasks of each split read so far."""

    def __init__(self, env, taskset_id: str):
        self.env = env
        self.taskset = env.taskset
        self.taskset_id = taskset_id
        self.bounded = bool(self.taskset.bounded)
        self._splits: dict[str, list] | None = None
        self._streams: dict[str, tuple] = {}
        self._orders: dict[tuple[int, int], list[int]] = {}
        self.issued: dict[str, object] = {}
        self.reward_names: set[str] = set()

    def _bounded_splits(self) -> dict[str, list]:
        if self._splits is None:
            tasks = list(itertools.islice(iter(self.taskset), MAX_TASKS + 1))
            if len(tasks) > MAX_TASKS:
                raise BridgeError("invalid_taskset", f"taskset {self.taskset_id} has more than {MAX_TASKS} tasks")
            if not tasks:
                raise BridgeError("invalid_taskset", f"taskset {self.taskset_id} yields no task")
            splits = {split: [] for split in SPLITS}
            for task in tasks:
                splits[split_of(_messages(task, self.taskset_id))].append(task)
            for split, chosen in splits.items():
                if not chosen:
                    print(f"taskset {self.taskset_id}: none of its {len(tasks)} tasks falls in the {split} split; "
                          f"its {split} split is the whole taskset", file=sys.stderr)
                    splits[split] = tasks
            self._splits = splits
        return self._splits

    def _streamed(self, split: str, position: int):
        if split not in self._streams:
            self._streams[split] = (iter(self.taskset), [], [True])
        stream, kept, disjoint = self._streams[split]
        while len(kept) <= position:
            for scanned in itertools.count():
                try:
                    task = next(stream)
                except StopIteration:
                    raise BridgeError("invalid_taskset", f"taskset {self.taskset_id} ended after {len(kept)} {split} tasks") from None
                if not disjoint[0] or split_of(_messages(task, self.taskset_id)) == split:
                    kept.append(task)
                    break
                if scanned >= MAX_SPLIT_SCAN:
                    print(f"taskset {self.taskset_id}: {MAX_SPLIT_SCAN} tasks in a row outside its {split} split; "
                          f"its {split} split reads the taskset in load order", file=sys.stderr)
                    disjoint[0] = False
        return kept[position]

    @property
    def sizes(self) -> dict[str, int | None]:
        """Tasks per split (None for an infinite taskset)."""
        if not self.bounded:
            return {split: None for split in SPLITS}
        return {split: len(tasks) for split, tasks in self._bounded_splits().items()}

    def task_at(self, split: str, position: int, seed: int):
        """The task at ``position`` of ``split`` (see the module docstring)."""
        if not self.bounded:
            return self._streamed(split, position)
        tasks = self._bounded_splits()[split]
        rounds, offset = divmod(position, len(tasks))
        if split != "train":
            return tasks[offset]
        key = (seed, rounds)
        if key not in self._orders:
            order = list(range(len(tasks)))
            random.Random(f"{seed}:{rounds}").shuffle(order)
            self._orders[key] = order
        return tasks[self._orders[key][offset]]


def _messages(task, taskset_id: str) -> list[dict]:
    """The chat messages verifiers' null harness opens with: system prompt, then the prompt."""
    from verifiers.v1.types import AssistantMessage, SystemMessage, TextContentPart, UserMessage

    data = task.data
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if data.prompt is None:
        raise BridgeError("not_single_turn", f"taskset {taskset_id}: a task has no prompt (the user opens the conversation)")
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    for message in data.prompt:
        if not isinstance(message, (SystemMessage, UserMessage, AssistantMessage)) or getattr(message, "tool_calls", None):
            raise BridgeError("not_single_turn", f"taskset {taskset_id}: a prompt holds a {message.role} message with tools")
        content = message.content
        if not isinstance(content, str):
            if any(not isinstance(part, TextContentPart) for part in content or []):
                raise BridgeError("not_single_turn", f"taskset {taskset_id}: a prompt holds images or other non-text parts")
            content = "\n".join(part.text for part in content or [])
        messages.append({"role": message.role, "content": content or ""})
    return messages


def _prompt_nodes(messages: list[dict]):
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage

    kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
    return [
        MessageNode(parent=index - 1 if index else None, message=kinds[message["role"]](content=message["content"]))
        for index, message in enumerate(messages)
    ]


class Bridge:
    """The requests' handlers over the opened tasksets."""

    def __init__(self, site: str | None):
        if site and site not in sys.path:
            sys.path.append(site)
        self.opened: dict[int, Opened] = {}
        self.loop = asyncio.new_event_loop()

    def hello(self) -> dict:
        import verifiers

        return {"verifiers_version": verifiers.__version__, "python": ".".join(map(str, sys.version_info[:3]))}

    def _taskset_class(self, taskset_id: str):
        from verifiers.v1.utils import loaders

        try:
            return loaders.taskset_class(taskset_id)
        except ModuleNotFoundError as error:
            # verifiers re-raises as "taskset ... not found" (no name): the import that failed is its cause.
            while error.name is None and isinstance(error.__cause__, ModuleNotFoundError):
                error = error.__cause__
            module = taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
            if error.name and error.name.split(".")[0] != module:
                raise _missing_module(error, f"taskset {taskset_id}") from None
            raise BridgeError("invalid_taskset", f"taskset {taskset_id}: its package has no module '{module}'") from None
        except (AttributeError, TypeError, ValueError) as error:
            raise BridgeError("invalid_taskset", f"taskset {taskset_id}: {error}") from None

    def describe(self, taskset: str) -> dict:
        cls = self._taskset_class(taskset)
        from verifiers.v1.utils.loaders import taskset_config_type

        config_cls = taskset_config_type(taskset)
        defaults = config_cls().model_dump(mode="json")
        args = {
            name: value for name, value in defaults.items()
            if name not in _CONFIG_FIELDS_NOT_ARGS and value is not None
        }
        description = " ".join((cls.__doc__ or "").split())[:500]
        return {"args": args, "description": description}

    def open(self, taskset: str, args: dict) -> dict:
        import verifiers.v1 as vf
        from pydantic import ValidationError

        self._taskset_class(taskset)
        data = {
            "taskset": {**args, "id": taskset},
            "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
        }
        if not issubclass(vf.environment_class(taskset), vf.SingleAgentEnv):
            raise BridgeError("not_single_turn", f"taskset {taskset}: brings its own Env (multi-agent), which Lab does not run yet")
        if vf.default_harness_id(taskset) != "bash":
            raise BridgeError("not_single_turn", f"taskset {taskset}: brings its own Harness (multi-turn), which Lab does not run yet")
        try:
            config = vf.resolve_env_config(data)
            env = vf.load_environment(config)
        except ValidationError as error:
            raise BridgeError("invalid_args", f"taskset {taskset}: {' '.join(str(error).split())[:500]}") from None
        except ModuleNotFoundError as error:
            raise _missing_module(error, f"taskset {taskset}") from None
        task_type = type(env.taskset).task_type()
        if task_type.NEEDS_CONTAINER:
            raise BridgeError("not_single_turn", f"taskset {taskset}: its tasks need a container runtime")
        if type(env.taskset).toolsets(env.taskset.config) or task_type.toolsets(env.taskset.config.task):
            raise BridgeError("not_single_turn", f"taskset {taskset}: its tasks use tools (multi-turn), which Lab does not run yet")
        handle = len(self.opened) + 1
        opened = Opened(env, taskset)
        try:
            first = opened.task_at("train", 0, 0)
            sizes = opened.sizes
        except ModuleNotFoundError as error:
            raise _missing_module(error, f"taskset {taskset}") from None
        rewards = [
            {"name": fn.__name__, "weight": float(getattr(fn, "_vf_weight", 1.0))}
            for fn in first.hooks("reward")
            if not _requires_runtime(fn)
        ] + [{"name": judge.reward_name, "weight": float(judge.config.weight)} for judge in first.plugged_judges()]
        if not rewards:
            raise BridgeError("invalid_taskset", f"taskset {taskset}: its tasks have no @vf.reward function that runs without a runtime")
        opened.reward_names = {reward["name"] for reward in rewards}
        self.opened[handle] = opened
        return {"handle": handle, "rewards": rewards, "bounded": opened.bounded, "sizes": sizes}

    def _opened(self, handle) -> Opened:
        if handle not in self.opened:
            raise BridgeError("invalid_request", f"no opened taskset {handle!r}")
        return self.opened[handle]

    def tasks(self, handle: int, split: str, start: int, n: int, seed: int) -> dict:
        opened = self._opened(handle)
        if split not in SPLITS or start < 0 or not 0 < n <= 10_000:
            raise BridgeError("invalid_request", "tasks needs split train|eval|val, start >= 0 and 1 <= n <= 10000")
        answer = []
        for position in range(start, start + n):
            task = opened.task_at(split, position, seed)
            task_id = f"{split}:{seed}:{position}"
            opened.issued[task_id] = task
            answer.append({
                "id": task_id,
                "key": task.key,
                "idx": task.data.idx,
                "name": task.data.name,
                "messages": _messages(task, opened.taskset_id),
            })
        return {"tasks": answer}

    def score(self, handle: int, task_id: str, completion: str) -> dict:
        from verifiers.v1.configs.agent import AgentConfig
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import AssistantMessage
        from verifiers.v1.graph import MessageNode

        opened = self._opened(handle)
        task = opened.issued.get(task_id)
        if task is None:
            raise BridgeError("invalid_request", f"no task {task_id!r} was handed out")
        nodes = _prompt_nodes(_messages(task, opened.taskset_id))
        nodes.append(MessageNode(parent=len(nodes) - 1, message=AssistantMessage(content=completion), sampled=True))
        agent = AgentConfig.model_validate({"harness": {"id": "null"}, "runtime": {"type": "subprocess"}})
        trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=agent),
            nodes=nodes,
            is_completed=True,
            ok=True,
            stop_condition="agent_completed",
        )
        try:
            self.loop.run_until_complete(task.score(trace))
        except Exception as error:  # the taskset's own scoring code failed
            cause = error.__cause__ or error
            if isinstance(cause, ModuleNotFoundError):
                raise _missing_module(cause, f"taskset {opened.taskset_id}") from None
            raise BridgeError("scoring_failed", f"taskset {opened.taskset_id}: scoring failed: {_one_line(cause)}") from None
        unscored = [name for name, reward in trace.rewards.items() if reward is None]
        if unscored:
            raise BridgeError("scoring_failed", f"taskset {opened.taskset_id}: rewards {unscored} were not scored")
        if set(trace.rewards) != opened.reward_names:
            raise BridgeError(
                "scoring_failed",
                f"taskset {opened.taskset_id}: scoring gave the rewards {sorted(trace.rewards)}, not its reward functions "
                f"{sorted(opened.reward_names)} (a reward function returning keyed scores is not supported yet)",
            )
        return {
            "reward": float(trace.reward),
            "functions": {name: float(reward.score) for name, reward in trace.rewards.items()},
            "weights": {name: float(reward.weight) for name, reward in trace.rewards.items()},
        }


def _requires_runtime(fn) -> bool:
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _answer(handler, request: dict) -> dict:
    try:
        operation = request.get("op")
        arguments = {key: value for key, value in request.items() if key != "op"}
        method = {"describe": handler.describe, "open": handler.open, "tasks": handler.tasks, "score": handler.score}.get(operation)
        if method is None:
            raise BridgeError("invalid_request", f"unknown op {operation!r}")
        try:
            inspect.signature(method).bind(**arguments)
        except TypeError as error:
            raise BridgeError("invalid_request", f"{operation}: {error}") from None
        return {"ok": True, "result": method(**arguments)}
    except BridgeError as error:
        body = {"code": error.code, "message": str(error)}
        if error.module:
            body["module"] = error.module
        return {"ok": False, "error": body}
    except ModuleNotFoundError as error:
        missing = _missing_module(error, "the taskset")
        return {"ok": False, "error": {"code": missing.code, "message": str(missing), "module": missing.module}}
    except Exception as error:  # the package's code failed: say what, keep serving
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": {"code": "invalid_taskset", "message": _one_line(error)}}


def _die_with_parent() -> None:
    """Have Linux kill this process when the engine that started it dies, however it dies
    (``PR_SET_PDEATHSIG``); an engine already gone ends it now."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    """Serve requests from stdin until it ends; return the exit status."""
    if sys.platform == "linux":
        _die_with_parent()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", help="directory of the job's installed packages (appended to sys.path)")
    options = parser.parse_args(argv)
    output = sys.stdout
    sys.stdout = sys.stderr  # a package's prints must not break the protocol
    try:
        handler = Bridge(options.site)
        hello = {"ok": True, "result": handler.hello()}
    except ModuleNotFoundError as error:
        hello = {"ok": False, "error": {"code": "missing_module", "message": f"the bridge needs the module '{error.name}'", "module": error.name}}
        handler = None
    output.write(json.dumps(hello) + "\n")
    output.flush()
    if handler is None:
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as error:
            answer = {"ok": False, "error": {"code": "invalid_request", "message": f"not a JSON object: {error}"}}
        else:
            answer = _answer(handler, request)
        output.write(json.dumps(answer) + "\n")
        output.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
