"""The ``load_environment`` bridge: a small program run with the Python of an environment's own
build (the virtual environment ``engine.build_envs`` installs from the build's lock, verifiers
0.3.1 among its packages) that loads a verifiers v0 environment and scores completions with it,
for an engine that never imports verifiers.

It imports only the standard library and verifiers' v0 API (``verifiers.legacy``, which 0.3.1
also answers as ``import verifiers as vf``), never the engine: the engine starts it as
``python -I load_environment_bridge.py --site <dir>`` (``--site`` is the folder the job's package
was installed into, appended to ``sys.path``), in the attempt's work dir, with the minimal
environment of the verifiers bridge plus ``HF_DATASETS_OFFLINE``.

It speaks the single-turn part of the verifiers bridge's protocol (JSON lines; its docstring,
``engine/environments/verifiers_bridge.py``), so the engine drives it with the same class
(``engine.environments.verifiers_taskset.VerifiersTaskset``):

- on start it writes ``{"ok": true, "result": {"verifiers_version", "python"}}``;
- ``describe {taskset}``: ``load_environment``'s keyword parameters with their defaults as
  ``args`` (a parameter without a JSON default, or with none, answers ``null``: any JSON value),
  and the module's docstring as ``description``;
- ``open {taskset, args}``: ``load_environment(**args)``; refused (``unsupported``) unless the
  environment is single-turn (a ``vf.SingleTurnEnv``, or a ``MultiTurnEnv`` of ``max_turns`` 1)
  with a dataset; answers ``{handle, rewards: [{name, weight}], bounded: true, sizes, multi_turn:
  false, agents: [], tools: false}``;
- ``tasks {handle, split, start, n, seed}``: rows of the environment's ``dataset`` (``train``) or
  ``eval_dataset`` (``eval`` and ``val``; the dataset when it has none) as chat ``messages``: the
  row's ``prompt`` column as verifiers formats it (its system prompt, few-shot messages and
  question, ``Environment._format_dataset``), with an ``id`` for ``score``. ``train`` is read in
  one shuffled order per pass (``random.Random(f"{seed}:{pass}")``), the others in dataset order;
  positions past the end wrap around;
- ``score {handle, task_id, completion[, timeout_s]}``: verifiers' own rollout of the row
  (``env.run_rollout``) with a client that answers the prompt with ``completion``, so the
  environment's parser, completion rendering and rubric (``rubric.score_rollout``) run as in
  verifiers; answers ``{reward, functions: {name: score}, weights: {name: weight}}``, ``reward``
  the rubric's weighted sum; past ``timeout_s`` seconds ``{timeout: true, message}``.

Errors answer ``{"ok": false, "error": {"code", "message"[, "module"]}}`` (codes as the verifiers
bridge's). An end of stdin ends the program.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import sys
from pathlib import Path

# The protocol (bridge_protocol.py, beside this file), loaded by its path alone: under ``python -I``
# this directory is not on sys.path, and the engine's modules in it must stay out of reach.
_spec = importlib.util.spec_from_file_location("bridge_protocol", Path(__file__).resolve().with_name("bridge_protocol.py"))
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)
BridgeError, SPLITS = protocol.BridgeError, protocol.SPLITS


def _module_name(taskset_id: str) -> str:
    """The module of ``<org>/<name>@<version>``: the name with ``-`` and ``.`` as ``_``."""
    return taskset_id.split("/", 1)[-1].split("@", 1)[0].replace("-", "_").replace(".", "_")


def _json_default(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return None


def _chat_message(message, where: str) -> dict:
    """A prompt message as ``{"role", "content"}`` with text content, or BridgeError."""
    if hasattr(message, "model_dump"):
        message = message.model_dump()
    if not isinstance(message, dict):
        raise BridgeError("unsupported", f"{where}: a prompt message is not a chat message: {message!r:.100}")
    content = message.get("content")
    if not isinstance(content, str):
        raise BridgeError("unsupported", f"{where}: a prompt message holds non-text content, which Lab does not run yet")
    if message.get("tool_calls"):
        raise BridgeError("unsupported", f"{where}: a prompt message holds tool calls, which Lab does not run yet")
    return {"role": message.get("role", "user"), "content": content}


def replay_client(completion: str):
    """A verifiers client whose every response is ``completion`` (the engine's sampled text)."""
    from verifiers.legacy.clients.client import Client
    from verifiers.legacy.types import Response, ResponseMessage

    class ReplayClient(Client):
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, *args, **kwargs):
            return None

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

        async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            message = ResponseMessage(role="assistant", content=completion, finish_reason="stop", is_truncated=False)
            return Response(id="lab-replay", created=0, model=model, message=message)

    return ReplayClient(None)


class Opened:
    """One loaded environment: its datasets by split and the reward functions of its rubric."""

    def __init__(self, env, taskset_id: str):
        self.env, self.taskset_id = env, taskset_id
        train = env.get_dataset()
        evaluation = env.eval_dataset if getattr(env, "eval_dataset", None) is not None else None
        if evaluation is None and getattr(env, "eval_dataset_source", None) is not None:
            evaluation = env.build_eval_dataset()
        self.datasets = {"train": train, "eval": evaluation if evaluation is not None else train}
        self.datasets["val"] = self.datasets["eval"]
        for split, dataset in self.datasets.items():
            if len(dataset) == 0:
                raise BridgeError("invalid_taskset", f"environment {taskset_id}: its {split} dataset is empty")
        rubric = env.rubric
        self.names = list(rubric._get_reward_func_names())
        self.weights = [float(weight) for weight in rubric._get_reward_weights()]
        self._train_order = protocol.TrainOrder()

    def row_index(self, split: str, position: int, seed: int) -> int:
        size = len(self.datasets[split])
        return self._train_order.index(position, size, seed) if split == "train" else position % size


class Bridge:
    """The request handlers; ``handle`` numbers the opened environments."""

    def __init__(self, site: str | None):
        if site and site not in sys.path:
            sys.path.append(site)
        import verifiers  # noqa: F401 - fails early (missing_module) when the build lacks it

        try:
            import verifiers.legacy.clients.client  # noqa: F401 - the v0 API's client and types, as 0.3.1 ships them
        except ModuleNotFoundError:
            raise BridgeError(
                "unsupported",
                f"its build holds verifiers {importlib.metadata.version('verifiers')}, and Lab runs load_environment "
                "environments with verifiers 0.3.1 (verifiers.legacy) so far: require verifiers>=0.3.1,<0.4",
            ) from None
        self.opened: dict[int, Opened] = {}
        self.loop = asyncio.new_event_loop()

    def hello(self) -> dict:
        return {"verifiers_version": importlib.metadata.version("verifiers"), "python": sys.version.split()[0]}

    def _module(self, taskset_id: str):
        name = _module_name(taskset_id)
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            raise BridgeError("missing_module", f"environment {taskset_id} needs the module '{error.name}'", module=error.name) from None
        if not callable(getattr(module, "load_environment", None)):
            raise BridgeError("invalid_taskset", f"environment {taskset_id}: the module '{name}' has no load_environment function")
        return module

    def describe(self, taskset: str) -> dict:
        module = self._module(taskset)
        args = {}
        for parameter in inspect.signature(module.load_environment).parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            args[parameter.name] = None if parameter.default is inspect.Parameter.empty else _json_default(parameter.default)
        return {"description": (module.__doc__ or "").strip().split("\n")[0], "args": args}

    def open(self, taskset: str, args: dict) -> dict:
        module = self._module(taskset)
        parameters = inspect.signature(module.load_environment).parameters
        # The engine sends every argument describe listed, its default filled in; a null stands for
        # a parameter with no JSON default, which keeps its own default (or stays unset).
        args = {
            name: value for name, value in args.items()
            if value is not None or (name in parameters and parameters[name].default is None)
        }
        try:
            env = module.load_environment(**args)
        except TypeError as error:
            raise BridgeError("invalid_args", f"environment {taskset}: load_environment({', '.join(args)}): {error}") from None
        kind = type(env).__name__
        single_turn = getattr(env, "max_turns", None) == 1 or any(base.__name__ == "SingleTurnEnv" for base in type(env).__mro__)
        if not single_turn:
            raise BridgeError(
                "unsupported",
                f"environment {taskset} is a {kind} (multi-turn): Lab runs single-turn load_environment environments only, so far",
            )
        opened = Opened(env, taskset)
        handle = len(self.opened) + 1
        self.opened[handle] = opened
        return {
            "handle": handle,
            "rewards": [{"name": name, "weight": weight} for name, weight in zip(opened.names, opened.weights, strict=False)],
            "bounded": True,
            "sizes": {split: len(dataset) for split, dataset in opened.datasets.items()},
            "multi_turn": False,
            "agents": [],
            "tools": False,
        }

    def _opened(self, handle) -> Opened:
        if handle not in self.opened:
            raise BridgeError("invalid_request", f"no environment is open as handle {handle!r}")
        return self.opened[handle]

    def tasks(self, handle: int, split: str, start: int, n: int, seed: int) -> dict:
        opened = self._opened(handle)
        if split not in SPLITS:
            raise BridgeError("invalid_request", f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        tasks = []
        for position in range(start, start + n):
            index = opened.row_index(split, position, seed)
            row = opened.datasets[split][index]
            prompt = row.get("prompt")
            if not isinstance(prompt, list):
                raise BridgeError("unsupported", f"environment {opened.taskset_id}: its rows' prompt is not a list of chat messages")
            where = f"environment {opened.taskset_id}, {split} row {index}"
            tasks.append({
                "id": f"{split}:{index}", "key": f"{split}:{index}", "idx": index,
                "messages": [_chat_message(message, where) for message in prompt],
            })
        return {"tasks": tasks}

    def score(self, handle: int, task_id: str, completion: str, timeout_s: float | None = None) -> dict:
        opened = self._opened(handle)
        split, _, index = str(task_id).partition(":")
        if split not in SPLITS or not index.isdigit() or int(index) >= len(opened.datasets[split]):
            raise BridgeError("invalid_request", f"unknown task id {task_id!r}")
        row = dict(opened.datasets[split][int(index)])
        rollout = opened.env.run_rollout(input=row, client=replay_client(completion), model="lab-policy", sampling_args={})
        try:
            output = self.loop.run_until_complete(asyncio.wait_for(rollout, timeout=timeout_s))
        except TimeoutError:
            return {"timeout": True, "message": f"scoring took longer than its {timeout_s:g} s timeout"}
        if output.get("error"):
            raise BridgeError("scoring_failed", f"environment {opened.taskset_id}: scoring failed: {output['error']}")
        metrics = output.get("metrics") or {}
        return {
            "reward": float(output.get("reward") or 0.0),
            "functions": {name: float(metrics.get(name, 0.0)) for name in opened.names},
            "weights": dict(zip(opened.names, opened.weights, strict=False)),
        }

    def close(self) -> None:
        self.loop.close()


def main(argv: list[str] | None = None) -> int:
    """Serve requests from stdin until it ends; return the exit status."""
    return protocol.serve(
        Bridge, description=__doc__.splitlines()[0], site_help="folder of the job's installed package (appended to sys.path)",
        operations=("describe", "open", "tasks", "score"), refused=("start", "reply"), what="the environment", argv=argv,
    )


if __name__ == "__main__":
    sys.exit(main())
