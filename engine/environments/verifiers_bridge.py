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
  ``runtime.type = "subprocess"`` so nothing defaults to Prime's sandbox), check that Lab runs
  it, and answer ``{handle, rewards: [{name, weight}], bounded, sizes, multi_turn, agents,
  tools, runtime_rewards}`` (``sizes``: tasks per split, null for an infinite taskset;
  ``runtime_rewards``: the names of ``rewards`` whose function takes a runtime, which score only
  once the bridge has sandboxes);
- ``sandboxes {environment}``: the attempt's sandbox access, ``{PRIME_API_BASE_URL,
  PRIME_API_KEY}`` (Lab's Prime-compatible API and the attempt's sandbox key), for verifiers'
  ``prime`` runtime;
- ``tasks {handle, split, start, n, seed}``: ``n`` tasks from position ``start`` as chat
  ``messages`` (the task's ``system_prompt`` as a system message, then its prompt, as verifiers'
  ``null`` harness sends them) with an opaque ``id`` for ``score``;
- ``score {handle, task_id, completion[, timeout_s]}``: a trace of the prompt and one sampled
  assistant message, scored by ``await task.score(trace)`` as ``vf-replay`` does (offline; with a
  box of verifiers' ``prime`` runtime per rollout when a reward function takes a runtime, as
  verifiers' own rollout makes it: ``score_trace``), answering
  ``{reward, functions: {name: score}, weights: {name: weight}}``; ``reward`` is
  ``trace.reward``, the sum of score x weight. With ``timeout_s`` (seconds, the job's ``[[env]]
  timeout``) a scoring still running past it is cancelled and the answer is ``{timeout: true,
  message}``: the environment's part of a single-turn episode took too long;

Multi-turn: a package that exports its own ``vf.Env`` subclass (an ``async def run(task,
agents)`` that drives ``agents.<name>.interaction(task)`` turn by turn, as verifiers'
TextArena env does) opens with ``multi_turn: true`` and ``agents`` (its agent fields). The bridge runs
the Env's own ``run_episode`` (``setup``, ``run``, ``finalize``, verifiers' episode timeout) with
agents of its own whose turns Lab's policy answers, and the engine answers them in rounds:

- ``start {handle, task_ids[, limits][, timeout_s]}``: one episode per entry (an ``id`` that
  ``tasks`` handed out), answering their ids as ``episodes`` too; ``limits {max_turns,
  max_input_tokens, max_output_tokens}`` (each may be null) are the job's caps on every agent of
  these episodes, on top of an agent's own config (the smaller wins); ``timeout_s`` (seconds, the
  job's ``[[env]] timeout``) replaces the Env's ``timeout.episode``, verifiers' deadline on an
  episode's ``setup`` and ``run`` (``--env.timeout.episode``);
- ``reply {handle, answers}``: for each reply the engine sampled,
  ``{request, text, input_tokens, output_tokens}`` (the tokens the turn fed in: the first prompt,
  then each environment turn, and the tokens it sampled), or ``{request, stop}`` when the engine
  cannot sample it (``stop`` names why, e.g. ``context_length``: the turn ends the exchange, as
  a refused turn does in verifiers).

Both run every live episode until each waits for a reply or is over and answer
``{requests: [{request, episode, agent, trainable, messages[, tools]}], finished: [{episode, reward,
functions, weights, turns, stop_condition, agent}]}``: ``messages`` is the agent's whole
conversation so far, as chat messages, ending with the turn to answer; ``finished`` holds each
episode that ended since the last answer, with the rewards of its one trainable agent's trace
(``trace.reward``: what the env's ``run``/``finalize`` recorded and the task's own
``task.score`` rewards, run offline when the interaction closes, as verifiers' rollout does).
An agent's turn is refused (``terminated``) once its turns reach ``max_turns`` or the tokens fed
in or sampled reach ``max_input_tokens`` / ``max_output_tokens`` (soft by one turn, as
verifiers' ``RolloutLimits``), or a task's ``@stop`` fires. An untrainable agent
(``agent.trainable = False`` in ``Env.setup``, as user-sim's user) is answered by the same
policy and never trained on. An episode that fails (the env's code raised), or that has no or
several traces of trainable agents, is finished with ``{episode, error}`` (a message) instead.
An episode past its deadline ends as ``run_episode`` ends it: verifiers cancels ``run``, the
interaction in flight is abandoned unscored (verifiers' ``Agent.interaction`` aborts its rollout
on a cancellation), the episode is flagged ``is_timeout`` and not ``ok``; it is finished with
``{episode, timeout: true, error}``. A request of an episode that ended meanwhile is not sent,
and an answer to one is dropped.

Tool-using tasksets (tasks or a taskset with MCP toolsets, ``@vf.tool`` methods of a
``vf.Toolset``, under verifiers' own ``SingleAgentEnv``) open with ``multi_turn: true`` and
``tools: true``, and their episodes are verifiers' own rollouts, driven the same way by
``start``/``reply``: ``Env.run_episode`` over its real agent, whose ``null`` harness runs its chat
program (the tool-calling loop) and whose task's tool servers start as verifiers starts them
(``python -m <module>`` in the ``subprocess`` runtime, the job's packages on their
``PYTHONPATH``). Nothing is fetched: the chat program is prepared offline
(``prepare_offline_script``: written where verifiers' subprocess runtime keeps prepared
scripts and run with this interpreter, its declared dependencies checked against what is
installed here), and every model call the program makes to verifiers' interception server is
a request to the engine (``lab_model_client``) carrying ``tools`` (OpenAI function specs) beside
``messages`` (tool results as ``tool`` messages, earlier replies as the text the engine
sampled); the engine's text comes back parsed into content and tool calls (the Hermes
``<tool_call>`` convention), which verifiers commits to the trace and the program executes.

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

import asyncio
import contextlib
import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import re
import sys
from pathlib import Path

# bridge_protocol.py is loaded from this file's directory by its path alone: ``python -I`` leaves
# the directory off sys.path, where it would also expose the engine's own modules.
_spec = importlib.util.spec_from_file_location("bridge_protocol", Path(__file__).resolve().with_name("bridge_protocol.py"))
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)
BridgeError, SPLITS, _missing_module, _one_line = protocol.BridgeError, protocol.SPLITS, protocol.missing_module, protocol.one_line

#: Fields of every TasksetConfig that a job's args never set.
_CONFIG_FIELDS_NOT_ARGS = frozenset({"id", "task", "system_prompt"})
#: Most tasks of a bounded taskset read into memory (a larger one is refused).
MAX_TASKS = 1_000_000


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
        self._train_order = protocol.TrainOrder()
        self.issued: dict[str, object] = {}
        self.reward_names: set[str] = set()
        self.multi_turn = False
        self.episodes: Episodes | None = None
        # A tool-using taskset's: its episodes run verifiers' own rollouts (Bridge._serve_tools).
        self.tools = False
        self.context = None
        self.own_limits: dict[str, int | None] = {}
        #: The reward functions (and judges) that take a runtime: scored in a box of verifiers'
        #: ``prime`` runtime on Lab's sandboxes (``score_trace``).
        self.runtime_rewards: list[str] = []

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
        if split != "train":
            return tasks[position % len(tasks)]
        return tasks[self._train_order.index(position, len(tasks), seed)]


def _messages(task, taskset_id: str, *, prompted: bool = True) -> list[dict]:
    """The chat messages verifiers' null harness opens with: system prompt, then the prompt.
    ``prompted=False`` accepts a task without a prompt (the system prompt alone: its
    conversation's user speaks first)."""
    data = task.data
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if data.prompt is None:
        if not prompted:
            return messages
        raise BridgeError("unsupported", f"taskset {taskset_id}: a task has no prompt (the user opens the conversation)")
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    return [*messages, *(_chat_message(message, f"taskset {taskset_id}: a prompt") for message in data.prompt)]


def _chat_message(message, what: str) -> dict:
    """A verifiers system, user or assistant text message as a chat message ``{role, content}``;
    refuse tools, images and other non-text parts (``what`` says where the message was)."""
    from verifiers.v1.types import AssistantMessage, SystemMessage, TextContentPart, UserMessage

    if not isinstance(message, (SystemMessage, UserMessage, AssistantMessage)) or getattr(message, "tool_calls", None):
        raise BridgeError("unsupported", f"{what} holds a {message.role!r} message with tool calls")
    content = message.content
    if not isinstance(content, str):
        if any(not isinstance(part, TextContentPart) for part in content or []):
            raise BridgeError("unsupported", f"{what} holds images or other non-text parts")
        content = "\n".join(part.text for part in content or [])
    return {"role": message.role, "content": content or ""}


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
        self.site = site
        self.opened: dict[int, Opened] = {}
        self.loop = asyncio.new_event_loop()
        self._resources: contextlib.AsyncExitStack | None = None

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
        multi_turn = not issubclass(vf.environment_class(taskset), vf.SingleAgentEnv)
        data = {"taskset": {**args, "id": taskset}}
        if not multi_turn:
            # The agents of an Env of its own keep their config's defaults (user-sim's user: null, 8 turns).
            data["agent"] = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
            # One interception server (not an elastic pool): the one a tool-using taskset's model client joins.
            data["interception"] = {"type": "server"}
        if vf.default_harness_id(taskset) != "bash":
            raise BridgeError("unsupported", f"taskset {taskset}: brings its own Harness, which Lab does not run (only verifiers' null harness runs)")
        try:
            config = vf.resolve_env_config(data)
            env = vf.load_environment(config)
        except ValidationError as error:
            raise BridgeError("invalid_args", f"taskset {taskset}: {' '.join(str(error).split())[:500]}") from None
        except ModuleNotFoundError as error:
            raise _missing_module(error, f"taskset {taskset}") from None
        task_type = type(env.taskset).task_type()
        if task_type.NEEDS_CONTAINER:
            raise BridgeError("unsupported", f"taskset {taskset}: its tasks need a container runtime")
        uses_tools = bool(type(env.taskset).toolsets(env.taskset.config) or task_type.toolsets(env.taskset.config.task))
        if uses_tools and multi_turn:
            raise BridgeError("unsupported", f"taskset {taskset}: its tasks use tools inside an Env of its own, which Lab does not run yet")
        agents = []
        if multi_turn:
            for name, spec in env._agent_specs.items():
                if spec.harness is not None and spec.harness.id != "null":
                    raise BridgeError(
                        "unsupported",
                        f"taskset {taskset}: its agent '{name}' runs the harness '{spec.harness.id}', which Lab does not run "
                        "(Lab's policy answers each agent's turns as a plain chat)",
                    )
                agents.append({"name": name})
        handle = len(self.opened) + 1
        opened = Opened(env, taskset)
        opened.multi_turn = multi_turn
        if uses_tools:
            self._serve_tools(opened)
            agents = [{"name": name} for name in env._agent_specs]
        try:
            first = opened.task_at("train", 0, 0)
            sizes = opened.sizes
        except ModuleNotFoundError as error:
            raise _missing_module(error, f"taskset {taskset}") from None
        rewards = [
            {"name": fn.__name__, "weight": float(getattr(fn, "_vf_weight", 1.0))} for fn in first.hooks("reward")
        ] + [{"name": judge.reward_name, "weight": float(judge.config.weight)} for judge in first.plugged_judges()]
        if not rewards and not multi_turn:
            raise BridgeError("invalid_taskset", f"taskset {taskset}: its tasks have no @vf.reward function")
        if not uses_tools:  # a tool-using task's rollout has its runtime (verifiers' subprocess one)
            opened.runtime_rewards = [fn.__name__ for fn in first.hooks("reward") if _requires_runtime(fn)] + [
                judge.reward_name for judge in first.plugged_judges() if _requires_runtime(judge.score)
            ]
        if multi_turn:
            from verifiers.v1.session import hook_boundary
            from verifiers.v1.trace import Trace

            for stop in first.hooks("stop"):
                if hook_boundary(stop, allow_trace=True) is not Trace:
                    raise BridgeError(
                        "unsupported",
                        f"taskset {taskset}: its @stop {stop.__name__} reads a model request or response, which only "
                        "a harness's model calls give (a @stop on the trace runs)",
                    )
        opened.reward_names = {reward["name"] for reward in rewards}
        self.opened[handle] = opened
        return {"handle": handle, "rewards": rewards, "bounded": opened.bounded, "sizes": sizes,
                "multi_turn": opened.multi_turn, "agents": agents, "tools": uses_tools, "runtime_rewards": opened.runtime_rewards}

    def sandboxes(self, environment: dict) -> dict:
        """Take the attempt's sandbox access (``PRIME_API_BASE_URL``, ``PRIME_API_KEY``), where
        verifiers' ``PrimeRuntime`` (Prime's ``prime-sandboxes`` client) makes the boxes of the
        reward functions that take a runtime."""
        if set(environment) != set(PRIME_VARIABLES) or not all(isinstance(value, str) and value for value in environment.values()):
            raise BridgeError("invalid_request", f"sandboxes needs {' and '.join(PRIME_VARIABLES)}, each a string")
        os.environ.update(environment)
        return {}

    def _serve_tools(self, opened: Opened) -> None:
        """Make a tool-using taskset's episodes run verifiers' own rollouts offline: its
        ``null`` harness's chat program prepared without uv, the job's packages importable by
        its tool servers, the Env's serving resources (shared tool servers, the interception
        server) held open, and the interception's model client Lab's (``LabModelClient``)."""
        from verifiers.v1.clients import ModelContext, TrainClientConfig

        env = opened.env
        harness = env._harnesses.get("agent")
        if harness is None or harness.config.id != "null":
            raise BridgeError("unsupported", f"taskset {opened.taskset_id}: its tasks use tools with a harness other than null, which Lab does not run")
        from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

        prepare_offline_script(CHAT_PROGRAM_SOURCE, what=f"taskset {opened.taskset_id}: verifiers' null harness")
        self._expose_site(opened.taskset_id)
        if self._resources is None:
            self._resources = contextlib.AsyncExitStack()
        self.loop.run_until_complete(self._resources.enter_async_context(env.serving()))
        # A train-type endpoint: the interception serves a streamed request from the client's
        # whole response (nothing to relay); the config only keys the server's client table.
        client = TrainClientConfig(base_url="http://127.0.0.1:9/v1", api_key_var="LAB_BRIDGE_NO_API_KEY")
        opened.context = ModelContext(model="lab-policy", client=client)
        opened.episodes = Episodes(opened, self.loop)
        env._interception.clients[client.model_dump_json()] = lab_model_client(opened.episodes)
        opened.own_limits = {key: getattr(env.config.agent, key) for key in _LIMITS}
        opened.multi_turn = opened.tools = True

    def _expose_site(self, taskset_id: str) -> None:
        """Let processes the bridge starts with its interpreter (a toolset's server, run as
        ``python -m <module>``) import the job's packages: ``PYTHONPATH`` names their directory,
        once no module of theirs would shadow one of the verifiers environment's there (the
        bridge itself only appends it)."""
        if not self.site:
            return
        import importlib.machinery

        own_path = [entry for entry in sys.path if entry != self.site]
        for entry in sorted(os.listdir(self.site)):
            name = entry.removesuffix(".py")
            if not name.isidentifier() or entry.endswith((".dist-info", ".data")):
                continue
            if importlib.machinery.PathFinder.find_spec(name, own_path) is not None:
                raise BridgeError("invalid_taskset", f"taskset {taskset_id}: its package's module '{name}' would shadow the verifiers environment's own for its tool servers")
        os.environ["PYTHONPATH"] = self.site

    def close(self) -> None:
        """Tear down what tool-using tasksets hold (their serving resources, tool servers)."""
        if self._resources is not None:
            self.loop.run_until_complete(self._resources.aclose())
            self._resources = None

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

    def score(self, handle: int, task_id: str, completion: str, timeout_s: float | None = None) -> dict:
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
        timeout = _seconds(timeout_s)
        deadlines = []

        async def scored() -> None:
            async with asyncio.timeout(timeout) as deadline:
                deadlines.append(deadline)
                await score_trace(opened, task, trace)

        try:
            self.loop.run_until_complete(scored())
        except TimeoutError as error:
            if not deadlines[0].expired():  # the scoring code's own I/O timed out: its failure
                raise BridgeError("scoring_failed", f"taskset {opened.taskset_id}: scoring failed: {_one_line(error)}") from None
            return {"timeout": True, "message": f"taskset {opened.taskset_id}: scoring took longer than its {timeout:g}s timeout"}
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


    def _episodes(self, handle) -> Episodes:
        opened = self._opened(handle)
        if not opened.multi_turn:
            raise BridgeError("invalid_request", f"taskset {opened.taskset_id} is single-turn: score its completions")
        if opened.episodes is None:
            opened.episodes = Episodes(opened, self.loop)
        return opened.episodes

    def start(self, handle: int, task_ids: list, limits: dict | None = None, timeout_s: float | None = None) -> dict:
        episodes = self._episodes(handle)
        limits = _limits(limits or {})
        timeout = _seconds(timeout_s)
        if timeout is not None:
            # verifiers' own deadline (--env.timeout.episode), read by run_episode as each episode starts.
            episodes.opened.env.config.timeout.episode = timeout
        tasks = []
        for task_id in task_ids:
            task = episodes.opened.issued.get(task_id)
            if task is None:
                raise BridgeError("invalid_request", f"no task {task_id!r} was handed out")
            tasks.append(task)
        started = [episodes.start(task, limits) for task in tasks]
        return {"episodes": started, **self.loop.run_until_complete(episodes.advance())}

    def reply(self, handle: int, answers: list) -> dict:
        episodes = self._episodes(handle)
        for answer in answers:
            episodes.answer(answer)
        return self.loop.run_until_complete(episodes.advance())


_LIMITS, _seconds, _limits = protocol.LIMITS, protocol.seconds, protocol.limits


class Episodes(protocol.Rounds):
    """The multi-turn episodes of one opened taskset, run on the bridge's event loop.

    Each episode is the Env's own ``run_episode`` over agents of ``LabAgent``; an agent's turn
    becomes a request that waits for the engine's reply (see the module docstring)."""

    def __init__(self, opened: Opened, loop: asyncio.AbstractEventLoop):
        super().__init__(loop)
        self.opened = opened
        #: Trace id -> episode id, for a tool-using taskset's model calls (they name their trace).
        self.traces: dict[str, str] = {}

    def start(self, task, limits: dict[str, int]) -> str:
        """Start one episode of ``task`` under the job's ``limits``; return its id."""
        env = self.opened.env
        episode_id = self.new_id("e")
        if self.opened.tools:
            return self._start_rollout(task, limits, episode_id)

        def episode_agents(ctx, completed, on_trace, on_discard):
            # run_episode hands its ctx (verifiers' model context) to this hook: here, the episode's id.
            from verifiers.v1.agent import Agents

            episode, limits = ctx
            return Agents(env.config, lambda name, spec: LabAgent(
                name, spec, episodes=self, episode=episode, limits=limits, completed=completed,
            ))

        async def run() -> dict:
            return self._result(episode_id, await env.run_episode(task, (episode_id, limits)))

        env._episode_agents = episode_agents  # run_episode builds its agents through this hook
        self.launch(episode_id, run())
        return episode_id

    def _start_rollout(self, task, limits: dict[str, int], episode_id: str) -> str:
        """Start one episode of a tool-using taskset: verifiers' own (``Env.run_episode`` over
        its real agent, the null harness's chat program, the task's tool servers), its model
        calls answered through ``LabModelClient``; the job's ``limits`` join the agent's own."""
        env, opened = self.opened.env, self.opened
        for key in _LIMITS:
            own, job = opened.own_limits.get(key), limits.get(key)
            setattr(env.config.agent, key, job if own is None else own if job is None else min(own, job))

        def minted(trace) -> None:
            self.traces[trace.id] = episode_id

        async def run() -> dict:
            return self._result(episode_id, await env.run_episode(task, opened.context, on_trace=minted))

        self.launch(episode_id, run())
        return episode_id

    def _result(self, episode_id: str, episode) -> dict:
        if episode.is_timeout:
            error = episode.errors[-1] if episode.errors else None
            message = _error_text(error.message, episode_id) if error else "the episode ran past its deadline"
            return {"episode": episode_id, "timeout": True, "error": message}
        if episode.errors:
            error = episode.errors[-1]
            return {"episode": episode_id, "error": _error_text(f"{error.type}: {error.message}", episode_id)}
        trainable = [trace for trace in episode.traces if trace.agent.trainable]
        if len(trainable) != 1:
            names = sorted({trace.agent.name for trace in trainable})
            return {"episode": episode_id, "error": (
                f"an episode gave {len(trainable)} traces of trainable agents ({', '.join(names) or 'none'}); "
                "Lab trains on one per rollout (mark the others untrainable in Env.setup: agents.<name>.trainable = False)"
            )}
        (trace,) = trainable
        for trace_errors in (t.errors for t in episode.traces):
            if trace_errors:
                error = trace_errors[-1]
                return {"episode": episode_id, "error": _error_text(f"{error.type}: {error.message}", episode_id)}
        unscored = [name for name, reward in trace.rewards.items() if reward is None]
        if unscored:
            return {"episode": episode_id, "error": f"rewards {unscored} were not scored"}
        return {
            "episode": episode_id,
            "agent": trace.agent.name,
            "reward": float(trace.reward),
            "functions": {name: float(reward.score) for name, reward in trace.rewards.items()},
            "weights": {name: float(reward.weight) for name, reward in trace.rewards.items()},
            "turns": trace.num_turns,
            "stop_condition": trace.stop_condition,
        }


class LabAgent:
    """One agent of one episode, standing in for verifiers' ``Agent``: its turns are answered
    by Lab's policy through the engine instead of a harness program (``interaction`` and
    ``run``; ``trainable`` as ``Env.setup`` leaves it)."""

    def __init__(self, name: str, config, *, episodes: Episodes, episode: str, limits: dict[str, int], completed: list):
        self.name, self.config = name, config
        self.trainable = True
        self.episodes, self.episode, self.completed = episodes, episode, completed
        limits = dict(limits)
        for key in _LIMITS:
            own = getattr(config, key, None)
            if own is not None:
                limits[key] = min(own, limits.get(key, own))
        self.limits = limits

    @contextlib.asynccontextmanager
    async def interaction(self, task, **_ignored):
        """Hold one exchange of ``task`` open turn by turn (verifiers' ``Agent.interaction``)."""
        interaction = LabInteraction(self, task)
        try:
            yield interaction
        except Exception as error:
            interaction.fail(error)
            raise
        except BaseException:
            # Cancelled (the episode's deadline): abandoned unscored, as verifiers aborts its rollout.
            interaction.abort()
            raise
        finally:
            await interaction.close()

    async def run(self, task, **_ignored):
        """One turn on the task's prompt, then the finished trace (verifiers' ``Agent.run``)."""
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace


class LabInteraction:
    """An agent's exchange (verifiers' ``Interaction``): ``turn(message)`` adds the caller's
    message and returns the policy's reply as a ``Segment``; ``trace`` is a verifiers ``Trace``;
    closing scores it with ``task.score`` (offline) unless the exchange failed."""

    def __init__(self, agent: LabAgent, task):
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.session import hook_boundary
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask

        self.agent, self.task = agent, task
        self.trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=AgentInfo(config=agent.config, name=agent.name, trainable=agent.trainable),
        )
        for message in _prompt_nodes(_messages(task, agent.episodes.opened.taskset_id, prompted=False)):
            self.trace.nodes.append(message)
        self._node = MessageNode
        # The @stop hooks that read the trace; those on a request or response need a harness's model calls.
        self._stops = [fn for fn in task.hooks("stop") if hook_boundary(fn, allow_trace=True) is Trace]
        self._lock = asyncio.Lock()
        self._started = self._over = self._closed = self._failed = False
        self.input_tokens = self.output_tokens = 0

    def _append(self, message, *, sampled: bool = False) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(self._node(parent=parent, message=message, sampled=sampled))

    async def _refused(self) -> str | None:
        """The limit or ``@stop`` that refuses the next turn, if any (verifiers' ``refused``)."""
        from verifiers.v1.session import call_hook
        from verifiers.v1.trace import Trace

        limits, trace = self.agent.limits, self.trace
        if "max_turns" in limits and trace.num_turns >= limits["max_turns"]:
            return "max_turns"
        if "max_input_tokens" in limits and self.input_tokens >= limits["max_input_tokens"]:
            return "max_input_tokens"
        if "max_output_tokens" in limits and self.output_tokens >= limits["max_output_tokens"]:
            return "max_output_tokens"
        for stop in self._stops:
            if await call_hook(stop, {Trace: trace}) is True:
                return stop.__name__
        return None

    async def turn(self, message=None):
        """Send one user turn (a string, messages, or None for a prompted task's opening reply)
        and return the policy's reply; a ``terminated`` Segment once the exchange is over."""
        from verifiers.v1.agent import Segment
        from verifiers.v1.dialects import parse_message
        from verifiers.v1.types import AssistantMessage, UserMessage

        async with self._lock:
            if self._closed:
                raise RuntimeError("this interaction is closed")
            if self._over:
                raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
            prompted = not self._started and self.task.data.prompt is not None
            if message is None and not prompted:
                raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
            if message is not None and prompted:
                raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
            self._started = True
            if isinstance(message, str):
                self._append(UserMessage(content=message))
            elif message is not None:
                for item in message:
                    self._append(parse_message(item) if isinstance(item, dict) else item)
            refused = await self._refused()
            if refused is None:
                conversation = [_chat_message(node.message, f"agent {self.agent.name}'s conversation") for node in self.trace.nodes]
                answer = await self.agent.episodes.request({
                    "episode": self.agent.episode, "agent": self.agent.name, "trainable": self.agent.trainable,
                    "messages": conversation,
                })
                refused = answer.get("stop")
            if refused is not None:
                self.trace.stop(str(refused))
                self._over = True
                return Segment(messages=[], terminated=True)
            self.input_tokens += int(answer.get("input_tokens") or 0)
            self.output_tokens += int(answer.get("output_tokens") or 0)
            reply = AssistantMessage(content=answer["text"])
            self._append(reply, sampled=True)
            return Segment(messages=[reply])

    def fail(self, error: Exception) -> None:
        """Record the caller's failure on the trace; the exchange is not scored."""
        self._failed = True
        self.trace.record_error(error)

    def abort(self) -> None:
        """Abandon the exchange (its episode was cancelled): never finalized, scored or
        completed, so its trace is not one of the episode's (verifiers' ``Rollout.abort``)."""
        self._closed = True

    async def close(self):
        """End the exchange: ``user_closed`` unless a limit stopped it, then the task's
        ``finalize`` and its reward functions (``score_trace``: offline, or in a sandbox when one
        takes a runtime); idempotent."""
        if self._closed:
            return self.trace
        self._closed = True
        trace = self.trace
        trace.agent.trainable = self.agent.trainable
        try:
            if not self._failed:
                trace.stop("user_closed")
                await score_trace(self.agent.episodes.opened, self.task, trace, finalize=True)
        except Exception as error:  # the task's own finalize or reward code
            self.fail(error.__cause__ or error)
        finally:
            trace.is_completed = True
            trace.ok = not self._failed
            self.agent.completed.append(trace)
        return trace


#: Characters of an episode's error the engine gets: its head (what failed) and its tail (a
#: traceback's last lines, where the cause is); the whole text goes to the bridge's log.
ERROR_HEAD, ERROR_TAIL = 200, 800


def _error_text(text: str, episode_id: str) -> str:
    """An episode's error on one line for the engine, cut in the middle past ERROR_HEAD +
    ERROR_TAIL characters (verifiers' tool-server errors end with the server log's tail); the
    whole text is written to stderr, the bridge's log."""
    print(f"episode {episode_id} failed: {text}", file=sys.stderr, flush=True)
    line = " ".join(text.split())
    if len(line) <= ERROR_HEAD + ERROR_TAIL:
        return line
    return f"{line[:ERROR_HEAD]} ... {line[-ERROR_TAIL:]}"


parse_tool_calls = protocol.parse_tool_calls


def _wire_content(wire: dict) -> dict:
    """A chat message with its content as one string (text parts joined), as the engine renders it."""
    content = wire.get("content")
    if isinstance(content, list):
        wire = {**wire, "content": "\n".join(part.get("text", "") for part in content if isinstance(part, dict))}
    elif content is None:
        wire = {**wire, "content": ""}
    return wire


_MODEL_CLIENT = None


def lab_model_client(episodes: Episodes):
    """Return a verifiers model ``Client`` whose every model call (the interception server's,
    for a rollout of a tool-using taskset) becomes one of the episodes' requests to the engine.

    The request's ``messages`` are the call's conversation as chat messages, each reply the
    policy sampled earlier as the text it sampled (so the engine extends its token sequence
    from what it sampled, never a re-rendering of parsed tool calls), tool results as ``tool``
    messages; ``tools`` the call's tools as OpenAI function specs (verifiers' ``tool_to_wire``),
    for the chat template to render. The engine's text comes back parsed into content and tool
    calls (``parse_tool_calls``) as verifiers' ``Response``, which the interception commits to
    the trace and serializes for the chat program (verifiers' ``serialize_completion``). A
    refused turn (``stop``) stops the trace there, as verifiers' limits do."""
    global _MODEL_CLIENT
    if _MODEL_CLIENT is None:
        from verifiers.v1.clients import Client
        from verifiers.v1.clients.train import serialize_completion, tool_to_wire
        from verifiers.v1.dialects.chat import message_to_wire
        from verifiers.v1.types import AssistantMessage, Response, ToolCall, Usage

        class LabModelClient(Client):
            def __init__(self, episodes: Episodes):
                self.episodes = episodes
                self.sampled: dict[str, list] = {}  # trace id -> [(parsed reply, sampled text)]

            def _messages(self, trace_id: str, prompt) -> list[dict]:
                sampled, position, messages = self.sampled.get(trace_id, []), 0, []
                for message in prompt:
                    if message.role == "assistant" and position < len(sampled) and sampled[position][0] == message:
                        messages.append({"role": "assistant", "content": sampled[position][1]})
                        position += 1
                    else:
                        messages.append(_wire_content(message_to_wire(message)))
                return messages

            async def get_response(self, dialect, body, sampling, session_id=None, turn=None, headers=None):
                if turn is None:
                    raise BridgeError("invalid_request", "a model call without a resolved turn")
                trace = turn.trace
                episode = self.episodes.traces.get(trace.id)
                if episode is None:
                    raise BridgeError("invalid_request", f"a model call of an unknown rollout {trace.id}")
                request = {
                    "episode": episode, "agent": trace.agent.name or "agent", "trainable": bool(trace.agent.trainable),
                    "messages": self._messages(trace.id, turn.prompt),
                }
                if turn.tools:
                    request["tools"] = [tool_to_wire(tool) for tool in turn.tools]
                answer = await self.episodes.request(request)
                model = body.get("model") or "lab-policy"
                if "stop" in answer:
                    trace.stop(str(answer["stop"]))  # the interception answers "rollout stopped" and commits nothing
                    response = Response(id="", created=0, model=model, message=AssistantMessage(content=""), finish_reason="stop")
                    response.raw = serialize_completion(response, model)
                    return response
                replies = self.sampled.setdefault(trace.id, [])
                content, calls = parse_tool_calls(answer["text"], f"call_{len(replies)}")
                message = AssistantMessage(content=content, tool_calls=[ToolCall(**call) for call in calls] or None)
                replies.append((message, answer["text"]))
                response = Response(
                    id=f"{trace.id}-{len(replies)}", created=0, model=model, message=message,
                    finish_reason="tool_calls" if calls else "stop",
                    usage=Usage(prompt_tokens=int(answer.get("input_tokens") or 0), completion_tokens=int(answer.get("output_tokens") or 0)),
                )
                response.raw = serialize_completion(response, model)
                return response

        _MODEL_CLIENT = LabModelClient
    return _MODEL_CLIENT(episodes)


def prepare_offline_script(source: str, *, what: str) -> str:
    """Prepare a harness's PEP 723 script as verifiers' subprocess runtime does, without uv:
    written to the runtime's content-addressed scripts directory and registered in its table of
    prepared scripts (``SubprocessRuntime._interpreters``, which ``prepare_uv_script`` reads
    before it would run ``uv sync --script``) with this interpreter, once every dependency the
    script declares is installed here at a version it accepts; return the script's path.
    Raises BridgeError naming a requirement this environment does not meet."""
    import hashlib
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    block = re.search(r"^# /// script\n((?:#.*\n)*?)# ///$", source, re.MULTILINE)
    metadata = tomllib.loads("".join(line[2:] + "\n" for line in block.group(1).splitlines())) if block else {}
    python = ".".join(map(str, sys.version_info[:3]))
    if not SpecifierSet(metadata.get("requires-python", "")).contains(python):
        raise BridgeError("unsupported", f"{what} needs Python {metadata['requires-python']}; this bridge runs {python}")
    for line in metadata.get("dependencies", []):
        requirement = Requirement(line)
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            found = f"{version} is installed" if version else "it is not installed"
            raise BridgeError("unsupported", (
                f"{what} needs {line}, and {found} in the verifiers environment (its script's dependencies come from there: "
                "Lab prepares it offline, without uv)"
            ))
    data = source.encode()
    path = f"{SubprocessRuntime.scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"
    if SubprocessRuntime._interpreters.get(path) != sys.executable:
        os.makedirs(SubprocessRuntime.scripts_dir, exist_ok=True)
        staging = f"{path}.{os.getpid()}.tmp"
        with open(staging, "wb") as file:
            file.write(data)
        os.replace(staging, path)
        SubprocessRuntime._interpreters[path] = sys.executable
    return path


#: The variables of the attempt's sandbox access, read by Prime's ``prime-sandboxes`` client.
PRIME_VARIABLES = ("PRIME_API_BASE_URL", "PRIME_API_KEY")
#: Where a reward's box works: a Lab sandbox's work directory, which is writable on every agent
#: (its root, and with it verifiers' default ``/app``, is read-only where the agent is not root).
RUNTIME_WORKDIR = "/workspace"


async def score_trace(opened: Opened, task, trace, *, finalize: bool = False) -> None:
    """Score ``trace`` with every reward function of ``task`` (``await task.score``), after the
    task's ``finalize`` when ``finalize``. Offline when none takes a runtime; else as verifiers'
    own rollout does (``Rollout.open``/``close``): one box of verifiers' ``prime`` runtime for
    this rollout (``PrimeRuntime``, on Lab's sandboxes of the attempt through the access the
    ``sandboxes`` request gave, working in ``RUNTIME_WORKDIR``) with the task's
    ``runtime_env``, the task's ``setup`` and ``finalize`` in it, the rewards scored with it,
    and the box deleted however scoring ends. Raises BridgeError when no access was given."""
    if not opened.runtime_rewards:
        if finalize:
            await task.finalize(trace, None)
        await task.score(trace)
        return
    if not all(os.environ.get(name) for name in PRIME_VARIABLES):
        # PrimeRuntime would end the process (SystemExit) without a key.
        raise BridgeError("unsupported", f"taskset {opened.taskset_id}: {protocol.runtime_rewards_phrase(opened.runtime_rewards)}, and this bridge was given no sandboxes")
    from verifiers.v1.runtimes import PrimeConfig, make_runtime
    from verifiers.v1.utils.decorators import invoke

    runtime = make_runtime(PrimeConfig(workdir=RUNTIME_WORKDIR), name=trace.id)
    runtime.env = dict(task.runtime_env())
    try:
        await runtime.start()
        await runtime.prepare_setup()
        await invoke(task.setup, {"trace": trace, "runtime": runtime})
        await invoke(task.finalize, {"trace": trace, "runtime": runtime})
        await task.score(trace, runtime)
    finally:
        await runtime.stop()


def _requires_runtime(fn) -> bool:
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def main(argv: list[str] | None = None) -> int:
    """Serve requests from stdin until it ends; return the exit status."""
    return protocol.serve(
        Bridge, description=__doc__.splitlines()[0], site_help="directory of the job's installed packages (appended to sys.path)",
        operations=("describe", "open", "sandboxes", "tasks", "score", "start", "reply"), what="the taskset", argv=argv,
    )


if __name__ == "__main__":
    sys.exit(main())
