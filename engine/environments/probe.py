"""Import an environment package and load it with its defaults; print what was found as JSON.

Run by the builder (``environments.builder.build``) with the Python of the package's own built
environment (``python -I probe.py MODULE KIND [ENTRY_POINT] OUT``), or, for a Lab-protocol package,
with the engine's Python and the built environment's ``site-packages`` appended to ``sys.path``
(as the engine runs them); ``lab envs try`` runs it the same way on a package installed in its
own folder (``engine.commands.try_environment``). Standard library only: it runs beside whatever
the package installed. `is_load_environment_module` tells verifiers' v0 form from its source,
for the builder and ``lab envs try`` alike, without running it.

It writes ``OUT`` (JSON): ``{"api": "v0"|"v1"|"lab", "environment_class": "module.Class",
"parameters": [{"name", "default", "type", "required"}], "dataset_size": int|None,
"eval_dataset_size": int|None, "reward_functions": [{"name", "weight"}], "secrets": [str],
"verifiers_version": str|None}``, or ``{"error": "..."}`` naming what is wrong and its fix.
A build asks for more (``rollout``): once loaded, ``ROLLOUT_EXAMPLES`` examples are rolled out
against a stub OpenAI-compatible chat endpoint this process serves on 127.0.0.1 (in the build's
sandbox, offline; ``stub_chat_endpoint``) and scored by the environment's rubric, recorded as
``"rollout": {"examples", "rewards", "seconds", "reply", "unscored"}``; a rollout that raises is
the error (``rollout_failed_message``), its traceback in the log.
Exit status 0 either way; anything else is a crash (its traceback is in the log). ``secrets`` are
the environment variables loading reads as keys: those it declares with ``vf.ensure_keys``, and
``OPENAI_API_KEY`` when it makes an OpenAI client on that default key (a judge's); each reads a
placeholder while it loads (``BUILD_PLACEHOLDER``), so the build needs none of them.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import threading
import time
import traceback
import typing
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ProbeError(Exception):
    """The package is not an environment Lab can build; the message says why and what to do."""


def _json_default(value: Any) -> Any:
    """A default as JSON: itself when JSON can hold it, else its repr (marked as such)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return {"repr": repr(value)[:200]}


def _annotation(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or repr(annotation)


def _parameters(function: Any) -> list[dict[str, Any]]:
    """``function``'s keyword parameters (``**kwargs`` and ``*args`` left out)."""
    parameters = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        required = parameter.default is inspect.Parameter.empty
        parameters.append({
            "name": parameter.name,
            "default": None if required else _json_default(parameter.default),
            "type": _annotation(parameter.annotation),
            "required": required,
        })
    return parameters


def _size(dataset: Any) -> int | None:
    if dataset is None:
        return None
    try:
        return len(dataset)
    except TypeError:
        return None


def _qualified(value: Any) -> str:
    cls = value if isinstance(value, type) else type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


#: What a secret the package declares reads while it loads at build: a build has no secrets, and
#: the clients a package makes (a judge's ``AsyncOpenAI``) only need one to be set, never used.
BUILD_PLACEHOLDER = "lab-build-has-no-secrets"


#: Train examples the build's smoke rollout runs once the environment has loaded (``rollout``).
ROLLOUT_EXAMPLES = 2
#: What the stub model answers every turn of the smoke rollout.
ROLLOUT_REPLY = "42"
#: The model name the smoke rollout's requests carry.
ROLLOUT_MODEL = "lab-build-stub"
#: The longest one example's rollout may take, in seconds.
ROLLOUT_TIMEOUT_S = 120

#: A rollout of the smoke run: given the stub endpoint's base URL, run ``ROLLOUT_EXAMPLES``
#: examples; return their rewards, and what it could not score offline (``_out_of_reach``).
Rollout = Callable[[str], tuple[list[float], list[str]]]


@contextlib.contextmanager
def stub_chat_endpoint(reply: str = ROLLOUT_REPLY) -> Iterator[str]:
    """Serve an OpenAI-compatible chat endpoint on a free port of 127.0.0.1, in a thread of this
    process, for the block; yield its base URL (``http://127.0.0.1:<port>/v1``). Every ``POST
    .../chat/completions`` answers ``reply`` as the assistant's message, a ``chat.completion``
    object as OpenAI's API reference shapes it (https://platform.openai.com/docs/api-reference/chat);
    ``GET .../models`` lists the one model. Any body is taken, tools and settings included: it
    stands in for a model, not for the checks of Lab's own server (engine/serving_protocol.py)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": ROLLOUT_MODEL, "object": "model", "created": 0, "owned_by": "lab"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                body = {}
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
                return
            self._send(200, {
                "id": "chatcmpl-lab-build", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or ROLLOUT_MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="stub-chat-endpoint", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def chat_reply(base_url: str, messages: list[dict]) -> str:
    """The assistant's text the chat endpoint at ``base_url`` answers ``messages`` with."""
    request = urllib.request.Request(
        f"{base_url}/chat/completions", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": ROLLOUT_MODEL, "messages": messages}).encode(),
    )
    with urllib.request.urlopen(request, timeout=ROLLOUT_TIMEOUT_S) as response:
        return json.load(response)["choices"][0]["message"]["content"] or ""


def run_rollout(rollout: Rollout) -> dict[str, Any]:
    """Run ``rollout`` against the stub endpoint; return the summary's ``rollout``:
    ``{"examples", "rewards", "seconds", "reply", "unscored"}`` (``unscored``: the judges' errors
    ``_out_of_reach`` left unscored, their rewards 0). Whatever the environment's code raised
    propagates (the caller names it)."""
    started = time.monotonic()
    with stub_chat_endpoint() as base_url:
        rewards, unscored = rollout(base_url)
    return {
        "examples": len(rewards), "rewards": rewards, "seconds": round(time.monotonic() - started, 3), "reply": ROLLOUT_REPLY,
        "unscored": unscored,
    }


def rollout_failed_message(error: BaseException) -> str:
    """What a build whose smoke rollout raised ``error`` is told: the exception and the fix."""
    return (
        f"the environment's rollout raised {type(error).__name__}: {' '.join(str(error).split())[:500]} "
        f"(it loads, but a smoke rollout of {ROLLOUT_EXAMPLES} train examples, every model reply \"{ROLLOUT_REPLY}\", "
        f"failed, and a job's first rollout would fail alike); try it locally with `lab envs try PACKAGE --reply {ROLLOUT_REPLY}`, "
        "and make its rollout and rubric take any reply (the build log has the traceback)"
    )


def _lab_rollout(target: type) -> Rollout:
    """A Lab-protocol environment's rollout: its defaults and seed 0, each train example's
    messages sent to the endpoint, the reply scored by its rubric (``Environment.score``)."""

    def rollout(base_url: str) -> list[float]:
        environment = target({}, 0)
        rewards = []
        for index in range(ROLLOUT_EXAMPLES):
            example = environment.example(index, "train")
            rewards.append(float(environment.score(chat_reply(base_url, example.messages), example).reward))
        return rewards, []

    return rollout


def _out_of_reach(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from, an OpenAI client's (a judge's model out of reach,
    as verifiers' ``JudgeRubric`` re-raises it): a build has no network and no secrets, so a judge
    on an endpoint of its own cannot answer there; its reward is left unscored (the rollout's
    ``unscored``), not the build failed."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if type(current).__module__.split(".")[0] == "openai":
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class _RaisedInScoring(logging.Handler):
    """Keeps the exception a verifiers v0 rubric logs while it scores (``Error calling reward
    function ...``; verifiers scores it 0 and goes on), read from the ``except`` block that logs
    it; a judge's client error goes to ``unscored`` instead (``_out_of_reach``)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.raised: list[BaseException] = []
        self.unscored: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1] or (record.exc_info[1] if record.exc_info else None)
        if error is not None and _out_of_reach(error):
            self.unscored.append(" ".join(record.getMessage().split())[:300])
            return
        if error is None:
            error = RuntimeError(record.getMessage())
        else:
            traceback.print_exception(error)
        self.raised.append(error)


def _v0_rollout(environment: Any) -> Rollout:
    """A ``load_environment`` environment's rollout: verifiers' own (``Environment.run_rollout``:
    its parser, turns, tools and rubric) of the first rows of its dataset, its model an
    ``AsyncOpenAI`` client of the endpoint (verifiers 0.3.1's ``OpenAIChatCompletionsClient``
    around it; 0.1.9 takes the client itself)."""

    def rollout(base_url: str) -> list[float]:
        from openai import AsyncOpenAI

        try:
            from verifiers.legacy.clients import OpenAIChatCompletionsClient
        except ImportError:  # verifiers 0.1.9: the same v0 API on an AsyncOpenAI client
            OpenAIChatCompletionsClient = None
        client = AsyncOpenAI(base_url=base_url, api_key=BUILD_PLACEHOLDER, max_retries=0)
        dataset = environment.get_dataset()
        rows = [dict(dataset[index]) for index in range(min(ROLLOUT_EXAMPLES, len(dataset)))]
        handler = _RaisedInScoring()
        loggers = [logging.getLogger(name) for name in ("verifiers.legacy.rubrics", "verifiers.rubrics")]
        for logger in loggers:
            logger.addHandler(handler)
        loop = asyncio.new_event_loop()
        rewards = []
        try:
            for row in rows:
                if OpenAIChatCompletionsClient is not None:
                    coroutine = environment.run_rollout(input=row, client=OpenAIChatCompletionsClient(client), model=ROLLOUT_MODEL, sampling_args={})
                else:
                    free = contextlib.nullcontext()
                    coroutine = environment.run_rollout(
                        input=row, client=client, model=ROLLOUT_MODEL, gen_sampling_args={}, gen_sem=free, score_sem=free, score=True,
                    )
                output = loop.run_until_complete(asyncio.wait_for(coroutine, ROLLOUT_TIMEOUT_S))
                if handler.raised:
                    raise handler.raised[0]
                if output.get("error"):
                    raise RuntimeError(f"the rollout ended in an error: {output['error']}")
                rewards.append(float(output.get("reward") or 0.0))
        finally:
            for logger in loggers:
                logger.removeHandler(handler)
            loop.close()
        return rewards, handler.unscored

    return rollout


def _v1_messages(task: Any) -> list[dict]:
    """The chat messages verifiers' null harness opens a v1 task with: its system prompt, then its prompt."""
    data = task.data
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        for message in data.prompt or []:
            content = message.content if isinstance(message.content, str) else "\n".join(getattr(part, "text", "") for part in message.content or [])
            messages.append({"role": message.role, "content": content})
    return messages


def _v1_rollout(taskset: type, config: Any) -> Rollout:
    """A v1 taskset's rollout: its first tasks with the default config, each one's opening sent to
    the endpoint and the reply scored as one turn by the task's own rewards (``Task.score`` on the
    trace, offline, as ``vf-replay`` scores; rewards that need a runtime are left out, as there)."""

    def rollout(base_url: str) -> list[float]:
        from verifiers.v1.configs.agent import AgentConfig
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage

        kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
        agent = AgentConfig.model_validate({"harness": {"id": "null"}, "runtime": {"type": "subprocess"}})
        tasks = []
        for task in taskset(config() if config is not None else None):
            tasks.append(task)
            if len(tasks) == ROLLOUT_EXAMPLES:
                break
        loop = asyncio.new_event_loop()
        rewards, unscored = [], []
        try:
            for task in tasks:
                messages = _v1_messages(task)
                reply = chat_reply(base_url, messages)
                nodes = [
                    MessageNode(parent=index - 1 if index else None, message=kinds[message["role"]](content=message["content"]))
                    for index, message in enumerate(messages)
                ]
                nodes.append(MessageNode(parent=len(nodes) - 1 if nodes else None, message=AssistantMessage(content=reply), sampled=True))
                trace = Trace(
                    task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                    agent=AgentInfo(config=agent), nodes=nodes, is_completed=True, ok=True, stop_condition="agent_completed",
                )
                try:
                    loop.run_until_complete(asyncio.wait_for(task.score(trace), ROLLOUT_TIMEOUT_S))
                except Exception as error:  # noqa: BLE001 - verifiers wraps the task's own error (TaskError): name that one
                    cause = error.__cause__ or error
                    if not _out_of_reach(cause):
                        raise cause from None
                    unscored.append(f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}")
                rewards.append(float(trace.reward or 0.0))
        finally:
            loop.close()
        return rewards, unscored

    return rollout


def _record_ensure_keys(package: Any, secrets: list[str]) -> None:
    """Replace verifiers' ``ensure_keys`` (v0), where the package reaches it, with one that records
    the keys and never raises: a build has no secrets; a job's are checked against this list.
    Each key reads ``BUILD_PLACEHOLDER`` from then on, if unset.

    Only once the package is imported, and only modules it imported: a package that never
    imports verifiers does not pay for its import here."""

    def ensure_keys(keys: list[str], *args: Any, **kwargs: Any) -> None:
        secrets.extend(key for key in keys if key not in secrets)
        for key in keys:
            os.environ.setdefault(key, BUILD_PLACEHOLDER)

    for name in ("verifiers.legacy.utils.config_utils", "verifiers.legacy", "verifiers.utils.config_utils", "verifiers"):
        module = sys.modules.get(name)
        if module is not None and "ensure_keys" in getattr(module, "__dict__", {}):
            module.ensure_keys = ensure_keys
    for name, value in list(vars(package).items()):
        if getattr(value, "__name__", None) == "ensure_keys" and getattr(value, "__module__", "").startswith("verifiers"):
            setattr(package, name, ensure_keys)


def _verifiers_version() -> str | None:
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe_lab(entry_point: str) -> tuple[dict[str, Any], Rollout]:
    module_name, _, attribute = entry_point.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    info = getattr(target, "info", None)
    rubric = getattr(target, "rubric", None) or ()
    if info is None or not callable(getattr(target, "make_example", None)):
        raise ProbeError(f"{entry_point} is not a Lab environment (a subclass of lab_environments.Environment)")
    return {
        "api": "lab",
        "description": _one_line(getattr(info, "description", "")),
        "environment_class": _qualified(target),
        "parameters": [
            {"name": name, "default": _json_default(value), "type": type(value).__name__, "required": False}
            for name, value in dict(info.args).items()
        ],
        "dataset_size": None,
        "eval_dataset_size": None,
        "reward_functions": [{"name": function.name, "weight": float(function.weight)} for function in rubric],
        "secrets": [],
        "multi_turn": False,  # Lab's protocol has single-turn examples
    }, _lab_rollout(target)


def _one_line(text: Any) -> str:
    """``text`` as one line of at most 500 characters; "" for None. The description a package
    gives itself, as the engine's loader reads it (``lab_environments.EnvironmentInfo.description``,
    a v1 taskset's class docstring, a ``load_environment`` module's docstring's first line): what
    ``lab envs`` shows in place of the wheel's Summary."""
    return " ".join(str(text or "").split())[:500]


def _taskset(module: Any) -> Any | None:
    """The ``Taskset`` subclass ``module`` exports in ``__all__``, or None."""
    for name in getattr(module, "__all__", ()) or ():
        value = getattr(module, name, None)
        if isinstance(value, type) and any(base.__name__ == "Taskset" for base in value.__mro__[1:]):
            return value
    return None


def _task_rewards(taskset: type) -> list[dict[str, Any]]:
    """The ``@vf.reward`` methods (``[{"name", "weight"}]``, by descending priority then name, as
    verifiers orders them) of the ``Task`` class the taskset's generic bases name
    (``vf.Taskset[MyTask, MyConfig]``); ``[]`` when none does. Rewards a config plugs in are not
    seen before a job opens the taskset."""
    for klass in taskset.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            for argument in typing.get_args(base):
                if not isinstance(argument, type):
                    continue
                marked: dict[str, Any] = {}
                for owner in reversed(argument.__mro__):  # the most derived wins; an undecorated override removes one
                    for name, function in vars(owner).items():
                        if callable(function) and getattr(function, "reward", None) is True:
                            marked[name] = function
                        elif name in marked:
                            del marked[name]
                if marked:
                    ordered = sorted(marked.items(), key=lambda item: (-getattr(item[1], "reward_priority", 0), item[0]))
                    return [{"name": name, "weight": float(getattr(function, "_vf_weight", 1.0))} for name, function in ordered]
    return []


def _v1_multi_turn(module: Any, taskset: type, config: Any) -> bool:
    """Whether a v1 taskset's episodes have several turns, as the verifiers bridge runs them: its
    module exports a ``vf.Env`` of its own (not verifiers' ``SingleAgentEnv``), or its tasks use
    tools (``Taskset.toolsets``/``Task.toolsets`` with the default config)."""
    import verifiers.v1 as vf

    for name in getattr(module, "__all__", None) or []:
        exported = getattr(module, name, None)
        if isinstance(exported, type) and issubclass(exported, vf.Env) and not issubclass(exported, vf.SingleAgentEnv):
            return True
    try:
        defaults = config() if config is not None else None
        return bool(taskset.toolsets(defaults) or taskset.task_type().toolsets(defaults.task))
    except Exception:  # noqa: BLE001 - the package's own code: a taskset whose tools cannot be listed so
        return False


def _taskset_config(taskset: Any, module_name: str) -> Any | None:
    """The config class of the taskset that ``module_name`` exports: verifiers' own resolution
    (``taskset_config_type``, the ``TasksetConfig`` its generic bases name, verifiers 0.4.0), else
    a ``config_type`` or ``Config`` attribute."""
    try:
        from verifiers.v1.utils.loaders import taskset_config_type
    except ImportError:
        return getattr(taskset, "config_type", None) or getattr(taskset, "Config", None)
    return taskset_config_type(module_name)


def _probe_verifiers(module_name: str) -> tuple[dict[str, Any], Rollout]:
    secrets: list[str] = []
    module = importlib.import_module(module_name)
    _record_ensure_keys(module, secrets)
    taskset = _taskset(module)
    if taskset is not None:
        config = _taskset_config(taskset, module_name)
        fields = getattr(config, "model_fields", {}) if config is not None else {}
        return {
            "api": "v1",
            "description": _one_line(taskset.__doc__),
            "environment_class": _qualified(taskset),
            "parameters": [
                {"name": name, "default": _json_default(field.default), "type": _annotation(field.annotation), "required": field.is_required()}
                for name, field in fields.items()
                if name not in ("id", "task", "system_prompt")
            ],
            "dataset_size": None,
            "eval_dataset_size": None,
            "reward_functions": _task_rewards(taskset),
            "secrets": secrets,
            "multi_turn": _v1_multi_turn(module, taskset, config),
        }, _v1_rollout(taskset, config)
    load_environment = getattr(module, "load_environment", None)
    if not callable(load_environment):
        raise ProbeError(
            f"the module '{module_name}' is neither a Lab environment (an entry point in [lab.environments]), "
            "a verifiers environment (a load_environment function) nor a verifiers v1 taskset (a Taskset in __all__): "
            "is this a library? Push the environment that uses it, with the library as a dependency"
        )
    try:
        environment = load_environment()
    except Exception as error:  # noqa: BLE001 - the package's own code; re-raised unless it only wants OpenAI's key
        if type(error).__name__ != "OpenAIError" or "OPENAI_API_KEY" not in str(error) or "OPENAI_API_KEY" in os.environ:
            raise
        # A client made with OpenAI's default key (a judge's AsyncOpenAI()): the key is a secret it reads.
        secrets.append("OPENAI_API_KEY")
        os.environ["OPENAI_API_KEY"] = BUILD_PLACEHOLDER
        environment = load_environment()
    rubric = getattr(environment, "rubric", None)
    names = list(rubric._get_reward_func_names()) if hasattr(rubric, "_get_reward_func_names") else []
    weights = list(rubric._get_reward_weights()) if hasattr(rubric, "_get_reward_weights") else []
    return {
        "api": "v0",
        "description": _one_line((module.__doc__ or "").strip().split("\n")[0]),
        "environment_class": _qualified(environment),
        "parameters": _parameters(load_environment),
        "dataset_size": _size(getattr(environment, "dataset", None)),
        "eval_dataset_size": _size(getattr(environment, "eval_dataset", None)),
        "reward_functions": [{"name": name, "weight": float(weight)} for name, weight in zip(names, weights, strict=False)],
        "secrets": secrets,
        # As the load_environment bridge tells them apart: any MultiTurnEnv but a SingleTurnEnv or one of max_turns 1.
        "multi_turn": not (
            getattr(environment, "max_turns", None) == 1 or "SingleTurnEnv" in {cls.__name__ for cls in type(environment).__mro__}
        ),
    }, _v0_rollout(environment)


def module_source(wheel: str | os.PathLike, module: str) -> str:
    """The source of the package's top-level module (``module/__init__.py`` or ``module.py``), or ``""``."""
    with zipfile.ZipFile(wheel) as archive:
        for name in (f"{module}/__init__.py", f"{module}.py"):
            try:
                return archive.read(name).decode("utf-8", errors="replace")
            except KeyError:
                continue
    return ""


def is_load_environment_module(source: str) -> bool:
    """Whether a module defines or imports ``load_environment`` at top level and names no ``Taskset``
    (verifiers' v0 form, which verifiers 0.4.0 no longer runs), read without running it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    defines = any(
        (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment")
        or (isinstance(node, ast.ImportFrom) and any((alias.asname or alias.name) == "load_environment" for alias in node.names))
        for node in tree.body
    )
    return defines and "Taskset" not in source


def not_in_engine(what: str, *, plural: bool = False) -> str:
    """The one message for a dependency a job would not find: ``what`` (``"it needs the module
    'math_verify'"``), then why and what to do. A job installs a Lab-protocol or verifiers v1
    package with ``--no-deps`` beside the engine's (or the verifiers) environment, so the build,
    ``lab envs try`` and the job itself all refuse such a package with these words."""
    verb = "are" if plural else "is"
    return (
        f"{what}, which {verb} not installed in the engine's environment: a job installs the package with --no-deps, "
        "so every dependency must already be there (depend only on what the engine's environment holds, put the code "
        "in the package, or have the distribution added to Lab's requirements)"
    )


def dataset_loaded_by_name(error: BaseException) -> str | None:
    """The name ``datasets.load_dataset`` was called with where ``error`` was raised, when it names
    a Hub dataset (``owner/name``) that is no folder here: offline, with no pushed snapshot of
    that name in the working directory (``environments.datasets``), ``datasets`` raises its own
    "Couldn't reach ... on the Hub" error, which says nothing of Lab. Read from the frames of the
    traceback (``load_dataset``'s ``path`` argument), so any ``datasets`` version is read alike."""
    frames = []
    traceback_ = error.__traceback__
    while traceback_ is not None:
        frames.append(traceback_.tb_frame)
        traceback_ = traceback_.tb_next
    for frame in frames:
        filename = frame.f_code.co_filename.replace(os.sep, "/")
        if frame.f_code.co_name == "load_dataset" and filename.endswith("datasets/load.py"):
            path = frame.f_locals.get("path")
            if isinstance(path, str) and path.count("/") == 1 and not os.path.isdir(path):
                return path
    return None


def unpushed_dataset_message(name: str) -> str:
    """What a build (or a job) whose environment loads the dataset ``name`` by name, not pushed, is told."""
    return (
        f"loading it calls load_dataset(\"{name}\"), and Lab loads environments offline, where a dataset named so is one "
        f"the organization pushed: push its files with `lab datasets push {name} DIR|FILE` (a folder such as the dataset's "
        "repository: train.jsonl, data/test-00000.parquet, ...), then build the environment again (`lab envs rebuild ID`)"
    )


def main(argv: list[str]) -> int:
    """``MODULE KIND ENTRY_POINT OUT [engine] [rollout]``: with ``engine``, the package was
    installed as a job installs it (no dependencies), so a missing module is one the engine lacks;
    with ``rollout`` (a build), a smoke rollout follows the loading (``run_rollout``: the summary's
    ``rollout``), and one that raises is the summary's error (``rollout_failed_message``)."""
    module_name, kind, entry_point, out = argv[:4]
    as_job = "engine" in argv[4:]
    smoke = "rollout" in argv[4:]
    try:
        summary, rollout = _probe_lab(entry_point) if kind == "lab" else _probe_verifiers(module_name)
        summary["verifiers_version"] = _verifiers_version()
        if smoke:
            try:
                summary["rollout"] = run_rollout(rollout)
            except Exception as error:  # noqa: BLE001 - the package's own code raised: its traceback is the log
                traceback.print_exc()
                summary = {"error": rollout_failed_message(error)}
    except ProbeError as error:
        summary = {"error": str(error)}
    except ModuleNotFoundError as error:
        traceback.print_exc()
        needs = f"importing it needs the module '{error.name}'"
        summary = {"error": not_in_engine(needs) if as_job else f"{needs}, which none of its requirements installs: add the distribution that provides it to its dependencies"}
    except Exception as error:  # noqa: BLE001 - the package's own code raised: its traceback is the log
        traceback.print_exc()
        name = dataset_loaded_by_name(error)
        summary = {"error": unpushed_dataset_message(name) if name else f"loading it raised {type(error).__name__}: {str(error)[:500]}"}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(summary, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
