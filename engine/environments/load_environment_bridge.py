"""The ``load_environment`` bridge: a small program run with the Python of an environment's own
build (the virtual environment ``engine.build_envs`` installs from the build's lock, verifiers
0.3.1 among its packages) that loads a verifiers v0 environment, scores completions with it and
runs its multi-turn episodes, for an engine that never imports verifiers.

It imports only the standard library and verifiers' v0 API (``verifiers.legacy``, which 0.3.1
also answers as ``import verifiers as vf``; on verifiers 0.3.0 the same API at the top level
(``verifiers.clients``, ``verifiers.types``: 0.3.1 moved those modules unchanged); on verifiers
0.1.9, which has neither, its top-level API and ``openai``'s types, single-turn environments
only), never the engine: the engine starts it as
``python -I load_environment_bridge.py --site <dir>`` (``--site`` is the folder the job's package
was installed into, appended to ``sys.path``), in the attempt's work dir, with the minimal
environment of the verifiers bridge plus the job secrets the environment reads (its build's).

It speaks the verifiers bridge's protocol (JSON lines; its docstring,
``engine/environments/verifiers_bridge.py``), so the engine drives it with the same class
(``engine.environments.verifiers_taskset.VerifiersTaskset``):

- on start it writes ``{"ok": true, "result": {"verifiers_version", "python"}}``;
- ``describe {taskset}``: ``load_environment``'s keyword parameters with their defaults as
  ``args`` (a parameter without a JSON default, or with none, answers ``null``: any JSON value),
  and the module's docstring as ``description``;
- ``open {taskset, args}``: ``load_environment(**args)``, with a dataset; answers ``{handle,
  rewards: [{name, weight}], bounded: true, sizes, multi_turn, agents, tools}``. A single-turn
  environment (a ``vf.SingleTurnEnv``, or one of ``max_turns`` 1) is scored (``score``); any other
  ``vf.MultiTurnEnv`` (``ToolEnv``, ``StatefulToolEnv``, a game's own ``env_response``) is
  multi-turn, its one agent ``agent``; ``tools`` says whether it has tools. A ``vf.EnvGroup`` runs
  each row with the member its route names (``info["env_id"]``): single-turn when every member is,
  else every row an episode (a single-turn member's of one turn); its reward functions are every
  member's. Refused (``unsupported``): sandboxed environments Lab gives no sandbox yet (CLI agents,
  ``SandboxMixin``; a ``SandboxEnv`` and a ``PythonEnv`` run), environments that are no
  ``MultiTurnEnv`` with a rollout of their own, and EnvGroups on verifiers before 0.3;
- ``tasks {handle, split, start, n, seed}``: rows of the environment's ``dataset`` (``train``) or
  ``eval_dataset`` (``eval`` and ``val``; the dataset when it has none) as chat ``messages``: the
  row's ``prompt`` column as verifiers formats it (its system prompt, few-shot messages and
  question, ``Environment._format_dataset``), with the row's ``answer`` (``""`` where it has none)
  and an ``id`` for ``score`` and ``start``. ``train``
  is read in one shuffled order per pass (``random.Random(f"{seed}:{pass}")``), the others in
  dataset order; positions past the end wrap around;
- ``score {handle, task_id, completion[, timeout_s]}``: verifiers' own rollout of the row
  (``env.run_rollout``) with a client that answers the prompt with ``completion``, so the
  environment's parser, completion rendering and rubric (``rubric.score_rollout``) run as in
  verifiers; answers ``{reward, functions: {name: score}, weights: {name: weight}}``, ``reward``
  the rubric's weighted sum; past ``timeout_s`` seconds ``{timeout: true, message}``. A reward
  function that raised (a judge unreachable; verifiers logs it and scores 0) fails the scoring
  (``scoring_failed``, or an episode's ``error``), naming the error;
- ``start {handle, task_ids[, limits][, timeout_s]}`` and ``reply {handle, answers}``: a
  multi-turn environment's episodes (``Episodes``), each verifiers' own rollout of its row
  (``setup_state``, ``env_response``, tool calls, stop conditions, rubric) whose every model call
  is a request the engine answers (``lab_client``); answers and results as the verifiers
  bridge's, ``timeout_s`` replacing the environment's ``timeout_seconds``.

Errors answer ``{"ok": false, "error": {"code", "message"[, "module"]}}`` (codes as the verifiers
bridge's). An end of stdin ends the program.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import sys
import types
from pathlib import Path

# The protocol (bridge_protocol.py, beside this file), loaded by its path alone: under ``python -I``
# this directory is not on sys.path, and the engine's modules in it must stay out of reach.
_spec = importlib.util.spec_from_file_location("bridge_protocol", Path(__file__).resolve().with_name("bridge_protocol.py"))
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)
BridgeError, SPLITS = protocol.BridgeError, protocol.SPLITS

#: The name of a load_environment environment's one agent, the policy (its requests' ``agent``).
AGENT = "agent"
#: The model name verifiers' rollouts see.
MODEL = "lab-policy"
#: verifiers classes whose tools or agent run in a sandbox Lab does not give these environments yet: the
#: CLI agents' and ``SandboxMixin``'s are not verified. A ``SandboxEnv`` (a bash tool) and a ``PythonEnv``
#: (its sandbox's start command runs verifiers' Python worker, which its ``python`` tool talks to) run on
#: Lab's sandboxes through the attempt's key (docs/sandboxes.md "Sandboxes of a job").
SANDBOX_CLASSES = frozenset({"SandboxMixin", "CliAgentEnv"})

#: The errors verifiers' rubrics log while the current rollout is scored: a reward function that
#: raised (a judge's endpoint unreachable, its key refused), which verifiers scores 0 and passes
#: over; Lab fails that scoring instead, naming the error (retried per ``[[env]] retries``).
_REWARD_ERRORS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("reward_errors", default=None)


class _RewardErrors(logging.Handler):
    """Adds each error record of verifiers' rubrics to the list of the rollout being scored."""

    def emit(self, record: logging.LogRecord) -> None:
        errors = _REWARD_ERRORS.get()
        if errors is not None and record.levelno >= logging.ERROR:
            errors.append(" ".join(record.getMessage().split())[:500])


def _module_name(taskset_id: str) -> str:
    """The module of ``<org>/<name>@<version>``: the name with ``-`` and ``.`` as ``_``."""
    return taskset_id.split("/", 1)[-1].split("@", 1)[0].replace("-", "_").replace(".", "_")


def _json_default(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return None


def _classes(env) -> set[str]:
    """The names of ``env``'s class and its bases."""
    return {base.__name__ for base in type(env).__mro__}


def _is_group(env) -> bool:
    """Whether ``env`` is a ``vf.EnvGroup``: a mixture whose rows each name the member environment
    that runs them (``info["env_id"]``, a name or a route of names through nested groups)."""
    return "EnvGroup" in _classes(env) and isinstance(getattr(env, "env_map", None), dict)


def members(env) -> list:
    """The environments whose rollouts run ``env``'s rows: ``env`` itself, or every member of an
    ``EnvGroup``, nested groups flattened."""
    return [member for child in env.envs for member in members(child)] if _is_group(env) else [env]


def _one_call(env) -> bool:
    """Whether each rollout of ``env`` (no ``EnvGroup``) is one model call: a ``SingleTurnEnv``, or
    any environment of ``max_turns`` 1."""
    return getattr(env, "max_turns", None) == 1 or "SingleTurnEnv" in _classes(env)


def is_single_turn(env) -> bool:
    """Whether ``env`` is scored (single-turn: each member's rollout one model call) rather than
    played in episodes (multi-turn), as the bridge, the build's probe and its smoke rollout tell."""
    return all(_one_call(member) for member in members(env))


def reward_functions(env) -> list[tuple[str, float]]:
    """``env``'s reward functions as ``(name, weight)`` in its rubric's order; an ``EnvGroup``'s are
    every member's (``EnvGroupRubric``), each weighted as by the first member that has it."""
    rubric = getattr(env, "rubric", None)
    names = list(rubric._get_reward_func_names()) if hasattr(rubric, "_get_reward_func_names") else []
    weights: dict[str, float] = {}
    for member in reversed(members(env)):
        own = getattr(member, "rubric", None)
        if hasattr(own, "_get_reward_func_names") and hasattr(own, "_get_reward_weights"):
            weights.update(zip(own._get_reward_func_names(), own._get_reward_weights(), strict=False))
    return [(name, float(weights.get(name, 0.0))) for name in names]


def _route(row: dict) -> list[str]:
    """The route of an ``EnvGroup`` row: its ``info["env_id"]`` as a list of names ([] for none)."""
    info = row.get("info")
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except ValueError:
            info = None
    value = info.get("env_id") if isinstance(info, dict) else None
    return [value] if isinstance(value, str) else [str(name) for name in value] if isinstance(value, list) else []


class Opened:
    """One loaded environment: its datasets by split and the reward functions of its rubric; a
    multi-turn one's episodes (``Episodes``, made on its first ``start``) and its members' own
    bounds. An ``EnvGroup``'s reward functions are every member's (a function's weight the first
    member's that has it), each rollout scored by its own member's rubric, the others' functions 0
    (verifiers' ``EnvGroupRubric``)."""

    def __init__(self, env, taskset_id: str, *, multi_turn: bool = False):
        self.env, self.taskset_id, self.multi_turn = env, taskset_id, multi_turn
        self.episodes: Episodes | None = None
        self.members = members(env)
        # Each member with its own bounds (turns, output tokens, timeout), which the job's limits and timeout may only tighten.
        self.own_bounds = [
            (member, getattr(member, "max_turns", -1), getattr(member, "max_total_completion_tokens", -1), getattr(member, "timeout_seconds", None))
            for member in self.members
        ]
        evaluation = env.eval_dataset if getattr(env, "eval_dataset", None) is not None else None
        if evaluation is None and getattr(env, "eval_dataset_source", None) is not None:
            evaluation = env.build_eval_dataset()
        # An eval dataset only (a benchmark): evaluations use it, and its train split is refused (``rows``).
        eval_only = evaluation is not None and getattr(env, "dataset", None) is None and getattr(env, "dataset_source", None) is None
        train = None if eval_only else env.get_dataset()
        self.datasets = {"eval": evaluation if evaluation is not None else train}
        if train is not None:
            self.datasets["train"] = train
        self.datasets["val"] = self.datasets["eval"]
        for split, dataset in self.datasets.items():
            if len(dataset) == 0:
                raise BridgeError("invalid_taskset", f"environment {taskset_id}: its {split} dataset is empty")
        functions = reward_functions(env)
        self.names, self.weights = [name for name, _ in functions], [weight for _, weight in functions]
        self._train_order = protocol.TrainOrder()

    def member(self, row: dict):
        """The environment whose rollout runs ``row``: the opened one, or the member of an
        ``EnvGroup`` its route names (BridgeError ``invalid_taskset`` for a route naming none)."""
        env = self.env
        for name in _route(row) if _is_group(env) else []:
            if not _is_group(env) or name not in env.env_map:
                raise BridgeError("invalid_taskset", f"environment {self.taskset_id}: a row routes to {name!r}, which is none of its EnvGroup's members")
            env = env.env_map[name]
        return env

    def scores(self, output: dict) -> dict:
        """A scored rollout's ``{reward, functions: {name: score}, weights: {name: weight}}``:
        ``reward`` the rubric's weighted sum, a function missing from its metrics 0."""
        metrics = output.get("metrics") or {}
        return {
            "reward": float(output.get("reward") or 0.0),
            "functions": {name: float(metrics.get(name, 0.0)) for name in self.names},
            "weights": dict(zip(self.names, self.weights, strict=False)),
        }

    def rows(self, split: str):
        """The dataset of ``split``; BridgeError ``invalid_taskset`` for the train split of an environment with an eval dataset only."""
        if split not in self.datasets:
            raise BridgeError(
                "invalid_taskset",
                f"environment {self.taskset_id} has no train dataset (its load_environment gives an eval_dataset only): it can be evaluated, not trained on",
            )
        return self.datasets[split]

    def row(self, task_id: str) -> dict:
        """The dataset row of a task id that ``tasks`` handed out (``<split>:<index>``)."""
        split, _, index = str(task_id).partition(":")
        if split not in SPLITS or not index.isdigit() or int(index) >= len(self.rows(split)):
            raise BridgeError("invalid_request", f"unknown task id {task_id!r}")
        return dict(self.rows(split)[int(index)])

    def row_index(self, split: str, position: int, seed: int) -> int:
        size = len(self.rows(split))
        return self._train_order.index(position, size, seed) if split == "train" else position % size


class Bridge:
    """The request handlers; ``handle`` numbers the opened environments."""

    def __init__(self, site: str | None):
        if site and site not in sys.path:
            sys.path.append(site)
        import verifiers  # noqa: F401 - fails early (missing_module) when the build lacks it

        try:
            import verifiers.legacy.clients.client  # noqa: F401 - the v0 API's client and types, as 0.3.1 ships them

            self.openai_clients = False
        except ModuleNotFoundError:
            self.openai_clients = not _top_level_clients()
        if self.openai_clients:
            # verifiers before 0.3 (0.1.9's Hub environments): the same v0 API, its model calls made
            # on an AsyncOpenAI client (``client.chat.completions.create``), no verifiers.legacy.
            if not _openai_client_api():
                raise BridgeError(
                    "unsupported",
                    f"its build holds verifiers {importlib.metadata.version('verifiers')}, whose Environment.run_rollout "
                    "is neither 0.3.1's (verifiers.legacy) nor 0.1.9's (an AsyncOpenAI client, gen_sampling_args): "
                    "require verifiers>=0.3.1,<0.4",
                ) from None
            self.openai_clients = True
        self.opened: dict[int, Opened] = {}
        self.loop = asyncio.new_event_loop()
        rubrics = f"{_v0_package()}.rubrics"
        logging.getLogger(rubrics).addHandler(_RewardErrors(logging.ERROR))

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
        if _is_group(env) and self.openai_clients:
            raise BridgeError(
                "unsupported",
                f"environment {taskset} is an EnvGroup on verifiers {importlib.metadata.version('verifiers')}: Lab runs "
                "the EnvGroups of load_environment environments on verifiers 0.3.1: require verifiers>=0.3.1,<0.4",
            )
        for member in members(env):
            kind, classes = type(member).__name__, _classes(member)
            what = f"environment {taskset} is a {kind}" if member is env else f"environment {taskset} has a {kind} in its EnvGroup"
            sandboxed = classes & SANDBOX_CLASSES
            if sandboxed:
                raise BridgeError(
                    "unsupported",
                    f"{what} ({sorted(sandboxed)[0]}): it runs its tools or agent in a sandbox Lab does not give "
                    "load_environment environments yet (a SandboxEnv's bash tool and a PythonEnv's python tool run)",
                )
            if not _one_call(member) and "MultiTurnEnv" not in classes:
                raise BridgeError(
                    "unsupported",
                    f"{what}, whose own rollout Lab does not run yet: Lab runs SingleTurnEnv, MultiTurnEnv, ToolEnv and "
                    "StatefulToolEnv environments (and their subclasses), and EnvGroups of them",
                )
        kind, single_turn = type(env).__name__, is_single_turn(env)
        if self.openai_clients and not single_turn:
            raise BridgeError(
                "unsupported",
                f"environment {taskset} is a {kind} on verifiers {importlib.metadata.version('verifiers')}: Lab runs "
                "the multi-turn episodes of load_environment environments on verifiers 0.3.1 and 0.3.0 only (their "
                "v0 clients), and single-turn ones on 0.1.9 too: require verifiers>=0.3.1,<0.4",
            )
        opened = Opened(env, taskset, multi_turn=not single_turn)
        handle = len(self.opened) + 1
        self.opened[handle] = opened
        return {
            "handle": handle,
            "rewards": [{"name": name, "weight": weight} for name, weight in zip(opened.names, opened.weights, strict=False)],
            "bounded": True,
            "sizes": {split: len(dataset) for split, dataset in opened.datasets.items()},
            "multi_turn": opened.multi_turn,
            "agents": [{"name": AGENT}] if opened.multi_turn else [],
            "tools": any(getattr(member, "tool_defs", None) for member in opened.members),
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
            row = opened.rows(split)[index]
            prompt = row.get("prompt")
            if not isinstance(prompt, list):
                raise BridgeError("unsupported", f"environment {opened.taskset_id}: its rows' prompt is not a list of chat messages")
            where = f"environment {opened.taskset_id}, {split} row {index}"
            tasks.append({
                "id": f"{split}:{index}", "key": f"{split}:{index}", "idx": index,
                "messages": [protocol.chat_message(message, where) for message in prompt],
                "answer": row["answer"] if isinstance(row.get("answer"), str) else "",
            })
        return {"tasks": tasks}

    def score(self, handle: int, task_id: str, completion: str, timeout_s: float | None = None) -> dict:
        opened = self._opened(handle)
        row = opened.row(task_id)
        if self.openai_clients:
            free = contextlib.nullcontext()
            rollout = opened.env.run_rollout(
                input=row, client=openai_replay_client(completion), model=MODEL, gen_sampling_args={},
                gen_sem=free, score_sem=free, score=True,
            )
        else:
            rollout = opened.env.run_rollout(input=row, client=replay_client(completion), model=MODEL, sampling_args={})
        errors: list[str] = []
        reset = _REWARD_ERRORS.set(errors)  # the task run_until_complete makes runs in a copy of this context
        try:
            output = self.loop.run_until_complete(asyncio.wait_for(rollout, timeout=timeout_s))
        except TimeoutError:
            return {"timeout": True, "message": f"scoring took longer than its {timeout_s:g} s timeout"}
        finally:
            _REWARD_ERRORS.reset(reset)
        failure = output.get("error") or (errors[-1] if errors else None)
        if failure:
            raise BridgeError("scoring_failed", f"environment {opened.taskset_id}: scoring failed: {failure}")
        return opened.scores(output)

    def _episodes(self, handle) -> Episodes:
        opened = self._opened(handle)
        if not opened.multi_turn:
            raise BridgeError("invalid_request", f"environment {opened.taskset_id} is single-turn: score its completions")
        if opened.episodes is None:
            opened.episodes = Episodes(opened, self.loop)
        return opened.episodes

    def start(self, handle: int, task_ids: list, limits: dict | None = None, timeout_s: float | None = None) -> dict:
        episodes = self._episodes(handle)
        rows = [episodes.opened.row(task_id) for task_id in task_ids]
        episodes.bound(protocol.limits(limits or {}), protocol.seconds(timeout_s))
        started = [episodes.start(row) for row in rows]
        return {"episodes": started, **self.loop.run_until_complete(episodes.advance())}

    def reply(self, handle: int, answers: list) -> dict:
        episodes = self._episodes(handle)
        for answer in answers:
            episodes.answer(answer)
        return self.loop.run_until_complete(episodes.advance())

    def close(self) -> None:
        self.loop.close()


class Episodes(protocol.Rounds):
    """The episodes of one opened multi-turn environment (a ``MultiTurnEnv``: ``ToolEnv`` and
    ``StatefulToolEnv`` among them). Each is verifiers' own rollout of its row (``env.run_rollout``:
    ``setup_state``, then model calls and ``env_response``s until a stop condition fires, then the
    rubric), whose model calls are requests the engine answers (``lab_client``)."""

    def __init__(self, opened: Opened, loop: asyncio.AbstractEventLoop):
        super().__init__(loop)
        self.opened = opened
        self.max_input_tokens: int | None = None

    def bound(self, limits: dict[str, int], timeout: float | None) -> None:
        """Bound the episodes started next: the job's ``max_turns`` and ``max_output_tokens``
        tighten the environment's own (verifiers' ``max_turns`` and
        ``set_max_total_completion_tokens``, checked by its stop conditions after each reply),
        ``max_input_tokens`` refuses a turn once the tokens fed in reach it, and ``timeout``
        (seconds) replaces the environment's ``timeout_seconds``, verifiers' deadline on a rollout."""
        for env, own_max_turns, own_max_output_tokens, own_timeout in self.opened.own_bounds:  # an EnvGroup's members run its rows
            env.max_turns = _tighter(own_max_turns, limits.get("max_turns"))
            env.set_max_total_completion_tokens(_tighter(own_max_output_tokens, limits.get("max_output_tokens")))
            env.timeout_seconds = own_timeout if timeout is None else timeout
        self.max_input_tokens = limits.get("max_input_tokens")

    def start(self, row: dict) -> str:
        """Start one episode of ``row``; return its id."""
        episode_id = self.new_id("e")
        client = lab_client(self, episode_id)
        member = self.opened.member(row)

        async def run() -> dict:
            errors: list[str] = []
            _REWARD_ERRORS.set(errors)  # this episode's task's own context
            output = await self.opened.env.run_rollout(input=row, client=client, model=MODEL, sampling_args={})
            return self._result(episode_id, output, client, errors, member.timeout_seconds)

        self.launch(episode_id, run())
        return episode_id

    def _result(self, episode_id: str, output: dict, client, errors: list[str], timeout_s: float) -> dict:
        if output.get("stop_condition") == "timeout_reached":
            return {"episode": episode_id, "timeout": True, "error": f"the episode ran past its {timeout_s:g} s timeout"}
        error = output.get("error") or (errors[-1] if errors else None)
        if error:
            text = protocol.one_line(error) if isinstance(error, BaseException) else " ".join(str(error).split())[:500]
            print(f"episode {episode_id} failed: {error!r}", file=sys.stderr, flush=True)
            return {"episode": episode_id, "error": text}
        return {
            "episode": episode_id, "agent": AGENT, **self.opened.scores(output), "turns": client.turns,
            "stop_condition": client.refused or output.get("stop_condition"),
        }


def _tighter(own, job: int | None) -> int:
    """verifiers' bound ``own`` (0 or less, or None: none) tightened by the job's ``job`` (None: none); -1 for none."""
    own = own if isinstance(own, int) and own > 0 else -1
    if job is None:
        return own
    return job if own < 0 else min(own, job)


def _reply_key(message) -> tuple:
    """What identifies an assistant message: its text and its tool calls' names and arguments."""
    if hasattr(message, "model_dump"):
        message = message.model_dump()
    calls = tuple((call.get("name"), call.get("arguments")) for call in message.get("tool_calls") or [] if isinstance(call, dict))
    return message.get("content") or "", calls


_CLIENTS: dict[str, type] = {}


def replay_client(completion: str):
    """A verifiers (v0) client whose every response is ``completion`` (the engine's sampled text)."""
    return _client_classes()["replay"](completion)


def _openai_client_api() -> bool:
    """Whether the installed verifiers runs a rollout as 0.1.9 does: ``Environment.run_rollout(input,
    client, model, gen_sampling_args, gen_sem, score_sem, score)``, its client an ``AsyncOpenAI``."""
    import verifiers

    run_rollout = getattr(getattr(verifiers, "Environment", None), "run_rollout", None)
    if run_rollout is None:
        return False
    parameters = inspect.signature(run_rollout).parameters
    return {"input", "client", "model", "gen_sampling_args", "gen_sem", "score_sem", "score"} <= set(parameters)


def openai_replay_client(completion: str):
    """An ``AsyncOpenAI`` look-alike for verifiers before 0.3 whose every chat completion is
    ``completion`` (the engine's sampled text), as an ``openai`` ``ChatCompletion``: what 0.1.9's
    ``get_model_response`` calls (``client.chat.completions.create``) and reads."""
    from openai.types.chat import ChatCompletion

    async def create(*, model, messages, **kwargs):
        return ChatCompletion.model_validate({
            "id": "lab-replay", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": completion}}],
        })

    completions = types.SimpleNamespace(create=create)
    return types.SimpleNamespace(chat=types.SimpleNamespace(completions=completions), base_url="lab-replay")


def lab_client(episodes: Episodes, episode_id: str):
    """Return a verifiers (v0) client for one episode whose every model call is a request to the
    engine: ``messages`` the call's prompt as chat messages, each reply the policy sampled earlier
    as the very text it sampled (tool calls included, so the engine extends its token sequence),
    tool results as ``tool`` messages; ``tools`` the environment's tools as OpenAI function specs,
    for the chat template. The text comes back as verifiers' ``Response``, its tool calls parsed in
    the Hermes convention (``protocol.parse_tool_calls``). A refused turn (the engine's ``stop``,
    or the job's ``max_input_tokens`` reached) raises verifiers' ``OverlongPromptError``, which ends
    the rollout (``prompt_too_long``) and leaves it scored, as verifiers ends an overlong prompt."""
    return _client_classes()["lab"](episodes, episode_id)


def _top_level_clients() -> bool:
    """Whether verifiers' v0 client API is at the top level (0.3.0's ``verifiers.clients.client``,
    which 0.3.1 moved unchanged under ``verifiers.legacy``)."""
    try:
        return hasattr(importlib.import_module("verifiers.clients.client"), "Client")
    except ImportError:
        return False


def _v0_package() -> str:
    """The package of verifiers' v0 API: ``verifiers.legacy`` (0.3.1), else ``verifiers`` (0.3.0, 0.1.9)."""
    return "verifiers.legacy" if importlib.util.find_spec("verifiers.legacy") is not None else "verifiers"


def _client_classes() -> dict[str, type]:
    """The bridge's verifiers ``Client`` classes (``replay``, ``lab``), made once verifiers is imported."""
    if _CLIENTS:
        return _CLIENTS
    v0 = _v0_package()
    Client = importlib.import_module(f"{v0}.clients.client").Client
    OverlongPromptError = importlib.import_module(f"{v0}.errors").OverlongPromptError
    v0_types = importlib.import_module(f"{v0}.types")
    Response, ResponseMessage, ToolCall, Usage = v0_types.Response, v0_types.ResponseMessage, v0_types.ToolCall, v0_types.Usage

    class Offline(Client):
        """A client that calls no provider: ``get_response`` answers, nothing native is used."""

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

    class Replay(Offline):
        def __init__(self, completion: str):
            super().__init__(None)
            self.completion = completion

        async def get_response(self, prompt, model, sampling_args=None, tools=None, **kwargs):
            message = ResponseMessage(role="assistant", content=self.completion, finish_reason="stop", is_truncated=False)
            return Response(id="lab-replay", created=0, model=model, message=message)

    class Lab(Offline):
        def __init__(self, episodes: Episodes, episode: str):
            super().__init__(None)
            self.episodes, self.episode = episodes, episode
            self.sampled: list[tuple[tuple, str]] = []  # (reply key, sampled text) per reply
            self.turns = self.input_tokens = 0
            self.refused: str | None = None

        def _messages(self, prompt) -> list[dict]:
            where = f"environment {self.episodes.opened.taskset_id}, episode {self.episode}"
            position, messages = 0, []
            for message in prompt:
                role = message.get("role") if isinstance(message, dict) else getattr(message, "role", None)
                if role == "assistant" and position < len(self.sampled) and _reply_key(message) == self.sampled[position][0]:
                    messages.append({"role": "assistant", "content": self.sampled[position][1]})
                    position += 1
                else:
                    messages.append(protocol.chat_message(message, where))
            return messages

        def _refuse(self, reason: str) -> Exception:
            self.refused = reason
            return OverlongPromptError(f"Lab refused the turn: {reason}")

        async def get_response(self, prompt, model, sampling_args=None, tools=None, **kwargs):
            cap = self.episodes.max_input_tokens
            if cap is not None and self.input_tokens >= cap:
                raise self._refuse("max_input_tokens")
            request = {"episode": self.episode, "agent": AGENT, "trainable": True, "messages": self._messages(prompt)}
            if tools:
                request["tools"] = [protocol.function_spec(tool) for tool in tools]
            answer = await self.episodes.request(request)
            if "stop" in answer:
                raise self._refuse(str(answer["stop"]))
            fed, sampled = int(answer.get("input_tokens") or 0), int(answer.get("output_tokens") or 0)
            self.input_tokens += fed
            self.turns += 1
            content, calls = protocol.parse_tool_calls(answer["text"], f"call_{self.turns}") if tools else (answer["text"], [])
            message = ResponseMessage(
                role="assistant", content=content, tool_calls=[ToolCall(**call) for call in calls] or None,
                finish_reason="tool_calls" if calls else "stop", is_truncated=False,
            )
            self.sampled.append((_reply_key(message), answer["text"]))
            usage = Usage(prompt_tokens=fed, reasoning_tokens=0, completion_tokens=sampled, total_tokens=fed + sampled)
            return Response(id=f"lab-{self.episode}-{self.turns}", created=0, model=model, message=message, usage=usage)

    _CLIENTS.update(replay=Replay, lab=Lab)
    return _CLIENTS


def main(argv: list[str] | None = None) -> int:
    """Serve requests from stdin until it ends; return the exit status."""
    return protocol.serve(
        Bridge, description=__doc__.splitlines()[0], site_help="folder of the job's installed package (appended to sys.path)",
        operations=("describe", "open", "tasks", "score", "start", "reply"), what="the environment", argv=argv,
    )


if __name__ == "__main__":
    sys.exit(main())
