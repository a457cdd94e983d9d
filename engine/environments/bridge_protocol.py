"""The line protocol both bridge programs speak to the engine (``verifiers_taskset.Bridge``): the
verifiers bridge (``verifiers_bridge.py``) and the ``load_environment`` bridge
(``load_environment_bridge.py``).

It imports only the standard library: each bridge runs as ``python -I <bridge>.py`` with a Python
that has neither the engine nor its dependencies (torch), and where not even the bridge's own
directory is on ``sys.path``, so each loads this one file by its path
(``importlib.util.spec_from_file_location``), never the engine package.

The protocol is JSON lines: one request object per line on stdin, one answer per line on stdout,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"code", "message"[, "module"]}}``.
On start, before reading anything, a bridge writes its hello (``{"ok": true, "result": ...}``, or
the error that keeps it from serving, then it exits with status 1). A request names its operation
as ``op`` and its arguments as the other keys; an end of stdin ends the program.

Every bridge also answers ``probe {module[, as_job]}`` (``probe`` here): what a build's probe
(``probe.py``, beside this file) records of the package's module ``module``, made in the bridge's
own process, where the package and verifiers are then imported already for the requests that
follow (``lab envs try`` probes a package so, as its build probes it, then loads it).

Multi-turn episodes run on a bridge's event loop as ``Rounds``: each model call of an episode
becomes a request the engine answers, a round of every pending call at a time (``start`` and
``reply`` in the verifiers bridge's docstring); ``chat_message`` and ``function_spec`` write a
request's messages and tools, and ``parse_tool_calls`` reads the tool calls in a sampled reply.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import itertools
import json
import os
import random
import re
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

SPLITS = ("train", "eval", "val")


class BridgeError(Exception):
    """A refusal answered to the engine: ``code`` is one of missing_module, unsupported (a feature Lab does not run),
    invalid_args, invalid_taskset, invalid_request, scoring_failed."""

    def __init__(self, code: str, message: str, module: str | None = None):
        super().__init__(message)
        self.code, self.module = code, module


def missing_module(error: ModuleNotFoundError, what: str) -> BridgeError:
    """The refusal for a module ``what`` (e.g. "the taskset") needs and cannot import."""
    name = error.name or str(error)
    return BridgeError("missing_module", f"{what} needs the module '{name}'", module=name)


def one_line(error: BaseException) -> str:
    """An error as one line of at most 500 characters, its type first."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:500]


def refusal(error: BridgeError) -> dict:
    """The answer that carries ``error``."""
    body = {"code": error.code, "message": str(error)}
    if error.module:
        body["module"] = error.module
    return {"ok": False, "error": body}


class TrainOrder:
    """Which item the ``train`` split reads at a position: one shuffled order of its ``size`` items
    per pass over them (``random.Random(f"{seed}:{pass}")``), positions past the end wrapping into
    the next pass; each order is kept once drawn."""

    def __init__(self):
        self._orders: dict[tuple[int, int], list[int]] = {}

    def index(self, position: int, size: int, seed: int) -> int:
        rounds, offset = divmod(position, size)
        key = (seed, rounds)
        if key not in self._orders:
            order = list(range(size))
            random.Random(f"{seed}:{rounds}").shuffle(order)
            self._orders[key] = order
        return self._orders[key][offset]


#: The job's caps on every agent of a multi-turn episode (``start``'s ``limits``).
LIMITS = ("max_turns", "max_input_tokens", "max_output_tokens")
#: The longest ``timeout_s`` a request may set (a day, as the job spec allows).
MAX_TIMEOUT_S = 86_400.0


def seconds(timeout) -> float | None:
    """A request's ``timeout_s``: a positive number of seconds up to MAX_TIMEOUT_S, or None;
    BridgeError otherwise."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise BridgeError("invalid_request", f"timeout_s is a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}, or null")
    return float(timeout)


def limits(given: dict) -> dict[str, int]:
    """The job's caps per agent (``start``'s ``limits``): the LIMITS that are set, each a
    positive integer; BridgeError for another name or value."""
    caps = {}
    for name, value in given.items():
        if name not in LIMITS or (value is not None and (type(value) is not int or value < 1)):
            raise BridgeError("invalid_request", f"limits take {', '.join(LIMITS)}, each a positive integer or null")
        if value is not None:
            caps[name] = value
    return caps


class Rounds:
    """The multi-turn episodes of one opened environment, run on the bridge's event loop ``loop``,
    whose model calls wait for the engine's replies.

    ``launch`` runs one episode (a coroutine that returns its finished entry); ``request`` queues
    one model call of an episode and returns the future its answer is set on; ``answer`` hands an
    answer of the engine to its call; ``advance`` runs every live episode until each waits for an
    answer or is over and returns ``{"requests": [...], "finished": [...]}``: the calls not handed
    out yet whose episodes still wait for them, and the entries of the episodes that ended since."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.live: dict[str, asyncio.Task] = {}
        self.requests: dict[str, tuple[dict, asyncio.Future]] = {}
        self.unsent: list[dict] = []
        self.finished: list[dict] = []
        self.progress = asyncio.Event()
        self._counter = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        """A fresh id: ``prefix`` and a number, unique among this object's episodes and requests."""
        return f"{prefix}{next(self._counter)}"

    def launch(self, episode_id: str, episode: Awaitable[dict]) -> None:
        """Run ``episode`` (its result is its finished entry); an exception it raises (the
        environment's own code failed) finishes it with ``{episode, error}``."""

        async def run() -> None:
            try:
                result = await episode  # before reading self.finished: advance swaps the list meanwhile
                self.finished.append(result)
            except Exception as error:  # the environment's own code failed outside verifiers' boundary
                self.finished.append({"episode": episode_id, "error": one_line(error)})
            finally:
                self.progress.set()

        self.live[episode_id] = self.loop.create_task(run())

    def request(self, body: dict) -> asyncio.Future:
        """Queue one model call (``body``: its episode, agent, messages, ...); the future gets its answer."""
        future = self.loop.create_future()
        request_id = self.new_id("r")
        body = {"request": request_id, **body}
        self.requests[request_id] = (body, future)
        self.unsent.append(body)
        self.progress.set()
        return future

    def answer(self, answer: dict) -> None:
        """Hand one of the engine's answers (``{request, text, ...}`` or ``{request, stop}``) to its call."""
        if not isinstance(answer, dict) or answer.get("request") not in self.requests:
            raise BridgeError("invalid_request", f"no pending request {answer.get('request') if isinstance(answer, dict) else answer!r}")
        _, future = self.requests.pop(answer["request"])
        if "stop" not in answer and not isinstance(answer.get("text"), str):
            raise BridgeError("invalid_request", "an answer carries text (and input_tokens, output_tokens) or stop")
        if not future.done():  # its episode may have ended meanwhile (its deadline passed): nobody waits
            future.set_result(answer)

    async def advance(self) -> dict:
        """Run every live episode until each waits for an answer or is over; return the new
        requests and the episodes that ended."""
        while True:
            for _ in range(16):  # let the work that is ready run (an answer's continuations)
                await asyncio.sleep(0)
            waiting = {body["episode"] for body, future in self.requests.values() if not future.done()}
            running = [episode for episode, task in self.live.items() if not task.done()]
            if all(episode in waiting for episode in running):
                break
            self.progress.clear()
            wake = asyncio.ensure_future(self.progress.wait())
            await asyncio.wait([wake, *(self.live[episode] for episode in running)], return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
        for episode, task in list(self.live.items()):
            if task.done():
                del self.live[episode]
        # A request whose episode ended meanwhile (cancelled at its deadline) waits for nothing.
        requests = [body for body in self.unsent if not self.requests[body["request"]][1].done()]
        for body in self.unsent:
            if self.requests[body["request"]][1].done():
                del self.requests[body["request"]]
        self.unsent = []
        finished, self.finished = self.finished, []
        return {"requests": requests, "finished": finished}


def chat_message(message, where: str) -> dict:
    """A verifiers message as the engine's chat message: ``{"role", "content"}`` with text content
    (text parts joined), a tool result with its ``tool_call_id`` too; BridgeError for images and
    other non-text parts, and for an assistant message with tool calls (Lab renders only the tool
    calls its policy sampled, as the text it sampled)."""
    if hasattr(message, "model_dump"):
        message = message.model_dump()
    if not isinstance(message, dict):
        raise BridgeError("unsupported", f"{where}: a message is not a chat message: {message!r:.100}")
    content = message.get("content")
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text" for part in content):
        content = "\n".join(str(part.get("text") or "") for part in content)
    if content is None and message.get("role") == "assistant":
        content = ""
    if not isinstance(content, str):
        raise BridgeError("unsupported", f"{where}: a message holds non-text content, which Lab does not run yet")
    if message.get("tool_calls"):
        raise BridgeError("unsupported", f"{where}: an assistant message holds tool calls Lab's policy did not sample, which Lab does not run yet")
    chat = {"role": message.get("role", "user"), "content": content}
    if chat["role"] == "tool":
        chat["tool_call_id"] = str(message.get("tool_call_id") or "")
    return chat


def function_spec(tool) -> dict:
    """A verifiers ``Tool`` as an OpenAI function spec, what chat templates render."""
    if hasattr(tool, "model_dump"):
        tool = tool.model_dump()
    return {"type": "function", "function": {
        "name": tool["name"], "description": tool.get("description") or "", "parameters": tool.get("parameters") or {},
    }}


#: A tool call in the text the policy sampled: the Hermes convention (``<tool_call>{"name": ...,
#: "arguments": {...}}</tool_call>``) of vLLM's ``hermes`` tool parser and of renderers'
#: ``Qwen3ToolParser``, which Qwen, Hermes and SmolLM3 chat templates teach their models.
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str, call_prefix: str) -> tuple[str | None, list[dict]]:
    """Split a sampled reply into its content and its tool calls ``{id, name, arguments}``
    (``arguments`` a JSON string; ids ``<call_prefix>_<n>``); a block that is not a JSON object
    with a ``name`` stays in the content, as the model wrote it."""
    calls, kept, last = [], [], 0
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            continue
        arguments = call.get("arguments", {})
        calls.append({
            "id": f"{call_prefix}_{len(calls)}",
            "name": call["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        })
        kept.append(text[last:match.start()])
        last = match.end()
    if not calls:
        return text, []
    content = ("".join(kept) + text[last:]).strip()
    return content or None, calls


def runtime_rewards_phrase(names: list[str]) -> str:
    """``its reward function(s) a, b take(s) a runtime (...)``: what a taskset whose reward
    functions ``names`` take a runtime needs, in the bridge's and the engine's refusals alike."""
    many = len(names) > 1
    return (f"its reward function{'s' if many else ''} {', '.join(names)} {'take' if many else 'takes'} a runtime "
            "(a box to run in: verifiers' prime sandbox, on Lab's sandboxes of the job's attempt)")


def probe(module: str, as_job: bool = False) -> dict:
    """``probe``'s answer: the summary ``probe.summary`` makes of the verifiers package whose
    top-level module is ``module`` (installed as a job installs it when ``as_job``), or its
    ``{"error": ...}``; what loading changed of this process is put back (``probe.summary``)."""
    spec = importlib.util.spec_from_file_location("environment_probe", Path(__file__).resolve().with_name("probe.py"))
    probing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probing)
    return probing.summary(module, "verifiers", "", as_job=bool(as_job))


def answer(handler, request: dict, *, operations: tuple[str, ...], refused: tuple[str, ...] = (), what: str) -> dict:
    """Answer one request with the handler's method of its ``op`` (one of ``operations``; one of
    ``refused`` is ``unsupported``, any other ``invalid_request``), or ``probe`` (``probe``). A BridgeError is answered as
    it says, a missing module as ``missing_module`` (``what`` needs it), any other exception (the
    package's own code) as ``invalid_taskset``, its traceback on stderr: the bridge keeps serving."""
    try:
        operation = request.get("op")
        arguments = {key: value for key, value in request.items() if key != "op"}
        if operation not in (*operations, "probe"):
            raise BridgeError("unsupported" if operation in refused else "invalid_request", f"unknown op {operation!r}")
        method = probe if operation == "probe" else getattr(handler, operation)
        try:
            inspect.signature(method).bind(**arguments)
        except TypeError as error:
            raise BridgeError("invalid_request", f"{operation}: {error}") from None
        return {"ok": True, "result": method(**arguments)}
    except BridgeError as error:
        return refusal(error)
    except ModuleNotFoundError as error:
        return refusal(missing_module(error, what))
    except Exception as error:  # the package's code failed: say what, keep serving
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": {"code": "invalid_taskset", "message": one_line(error)}}


def die_with_parent() -> None:
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


def serve(
    start: Callable[[str | None], object], *, description: str, site_help: str, operations: tuple[str, ...],
    refused: tuple[str, ...] = (), what: str, argv: list[str] | None = None,
) -> int:
    """Run a bridge: parse ``--site`` (``site_help`` describes it), build the handler with
    ``start(site)`` and write its ``hello()``, then answer requests from stdin (see ``answer``)
    until it ends and ``close()`` the handler; return the exit status (1 when the handler could
    not start). Whatever the handler prints goes to stderr: stdout carries the protocol only."""
    if sys.platform == "linux":
        die_with_parent()
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--site", help=site_help)
    options = parser.parse_args(argv)
    output = sys.stdout
    sys.stdout = sys.stderr  # a package's prints must not break the protocol
    try:
        handler = start(options.site)
        hello = {"ok": True, "result": handler.hello()}
    except BridgeError as error:
        hello = {"ok": False, "error": {"code": error.code, "message": str(error)}}
        handler = None
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
            reply = {"ok": False, "error": {"code": "invalid_request", "message": f"not a JSON object: {error}"}}
        else:
            reply = answer(handler, request, operations=operations, refused=refused, what=what)
        output.write(json.dumps(reply) + "\n")
        output.flush()
    handler.close()
    return 0
