"""The smoke rollout an environment build runs once the package has loaded (``engine.environments.probe``
with ``rollout``): ``ROLLOUT_EXAMPLES`` train examples rolled out against a stub OpenAI-compatible
chat endpoint served in this process on 127.0.0.1 (``stub_chat_endpoint``; in the build's sandbox,
offline), each scored by the environment's rubric, so that a build that passes is one a job can
start on: a Lab-protocol environment's ``score``, verifiers' own ``run_rollout`` of a
``load_environment`` environment (single- or multi-turn), a single-turn v1 task's ``score`` of
one turn, and a multi-turn v1 taskset's whole episodes as the engine's verifiers bridge plays them
in a job (``v1_episodes_rollout``: its ``start``/``reply`` rounds, each turn answered by the stub).

Standard library only at import, as the probe: it runs beside whatever the package installed,
loaded by its path from the probe's folder, as it loads the verifiers bridge
(``verifiers_bridge.py`` and ``bridge_protocol.py``, copied beside it by the builder) when a
multi-turn v1 taskset is rolled out.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: The key the stub endpoint's clients send (it checks none).
STUB_API_KEY = "lab-build-stub-key"

#: Train examples the build's smoke rollout runs once the environment has loaded (``rollout``).
ROLLOUT_EXAMPLES = 2
#: What the stub model answers every turn of the smoke rollout.
ROLLOUT_REPLY = "42"
#: The model name the smoke rollout's requests carry.
ROLLOUT_MODEL = "lab-build-stub"
#: The longest one example's rollout may take, in seconds.
ROLLOUT_TIMEOUT_S = 120
#: The most turns of each agent in one episode of a multi-turn v1 taskset (the job's
#: ``[[env]] max_turns``, as the verifiers bridge caps them): enough for the environment's own
#: turn code to answer the first reply and run again.
ROLLOUT_MAX_TURNS = 4
#: The most rounds of turns (``reply``) a multi-turn smoke rollout plays before it gives up.
ROLLOUT_MAX_ROUNDS = 64

#: A rollout of the smoke run: given the stub endpoint's base URL, run ``ROLLOUT_EXAMPLES``
#: examples; return their rewards, and what it could not score offline (``_out_of_reach``).
Rollout = Callable[[str], tuple[list[float], list[str]]]

#: Environment classes whose rollouts run in sandboxes, which a build has none of (verifiers'
#: ``SandboxEnv`` and its ``PythonEnv``): their smoke rollout is skipped, saying so.
SANDBOXED_CLASSES = ("SandboxEnv", "PythonEnv")


class RolloutSkipped(Exception):
    """The environment cannot be rolled out in a build; the message says why."""


class EpisodeFailed(Exception):
    """An episode of a multi-turn v1 taskset ended in an error: the message is the verifiers
    bridge's text of it (``Type: message``, what the environment's own code raised)."""


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
    ``_out_of_reach`` left unscored, their rewards 0), with ``"skipped"`` (why) and no examples
    for an environment a build cannot roll out (``RolloutSkipped``: a sandboxed one). Whatever
    else the environment's code raised propagates (the caller names it)."""
    started = time.monotonic()
    try:
        with stub_chat_endpoint() as base_url:
            rewards, unscored = rollout(base_url)
    except RolloutSkipped as skipped:
        return {"examples": 0, "rewards": [], "seconds": round(time.monotonic() - started, 3), "reply": ROLLOUT_REPLY,
                "unscored": [], "skipped": str(skipped)}
    return {
        "examples": len(rewards), "rewards": rewards, "seconds": round(time.monotonic() - started, 3), "reply": ROLLOUT_REPLY,
        "unscored": unscored,
    }


def rollout_failed_message(error: BaseException) -> str:
    """What a build whose smoke rollout raised ``error`` is told: the exception and the fix (an
    ``EpisodeFailed`` names the exception the episode's text names)."""
    what = str(error) if isinstance(error, EpisodeFailed) else f"{type(error).__name__}: {error}"
    return (
        f"the environment's rollout raised {' '.join(what.split())[:500]} "
        f"(it loads, but a smoke rollout of {ROLLOUT_EXAMPLES} train examples, every model reply \"{ROLLOUT_REPLY}\", "
        f"failed, and a job's first rollout would fail alike); try it locally with `lab envs try PACKAGE --reply {ROLLOUT_REPLY}`, "
        "and make its rollout and rubric take any reply (the build log has the traceback)"
    )


def lab_rollout(target: type) -> Rollout:
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


#: Clients of services a build cannot reach (no network, no secrets): a judge's model (``openai``,
#: as verifiers' ``JudgeRubric`` re-raises its errors) and Prime's sandboxes (``prime_sandboxes``,
#: which a reward function may call itself).
_OUT_OF_REACH_CLIENTS = ("openai", "prime_sandboxes")


def _out_of_reach(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from, a client of ``_OUT_OF_REACH_CLIENTS``: a build
    has no network and no secrets, so a judge on an endpoint of its own or a sandbox cannot answer
    there; that reward is left unscored (the rollout's ``unscored``), not the build failed."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if type(current).__module__.split(".")[0] in _OUT_OF_REACH_CLIENTS:
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


def v0_rollout(environment: Any) -> Rollout:
    """A ``load_environment`` environment's rollout: verifiers' own (``Environment.run_rollout``:
    its parser, turns, tools and rubric) of the first rows of its dataset (its eval dataset when it has
    none), its model an
    ``AsyncOpenAI`` client of the endpoint (verifiers 0.3.1's and 0.3.0's ``OpenAIChatCompletionsClient``
    around it; 0.1.9 takes the client itself)."""

    def rollout(base_url: str) -> list[float]:
        members = sibling("load_environment_bridge.py").members(environment)  # an EnvGroup's, or itself
        sandboxed = [cls.__name__ for member in members for cls in type(member).__mro__ if cls.__name__ in SANDBOXED_CLASSES]
        if sandboxed:
            raise RolloutSkipped(f"a {sandboxed[0]} runs its rollouts in sandboxes, which a build has none of; a job's attempt has them")
        from openai import AsyncOpenAI

        try:
            from verifiers.legacy.clients import OpenAIChatCompletionsClient
        except ImportError:
            try:  # verifiers 0.3.0: the same v0 API as 0.3.1's verifiers.legacy, at the top level
                from verifiers.clients import OpenAIChatCompletionsClient
            except ImportError:  # verifiers 0.1.9: the same v0 API on an AsyncOpenAI client
                OpenAIChatCompletionsClient = None
        client = AsyncOpenAI(base_url=base_url, api_key=STUB_API_KEY, max_retries=0)
        # An environment with an eval_dataset only (evaluations use it; a job refuses to train on it) is tried on that.
        eval_only = all(getattr(environment, name, None) is None for name in ("dataset", "dataset_source")) and any(
            getattr(environment, name, None) is not None for name in ("eval_dataset", "eval_dataset_source")
        )
        dataset = environment.get_eval_dataset() if eval_only else environment.get_dataset()
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


def v1_rollout(taskset: type, config: Any) -> Rollout:
    """A single-turn v1 taskset's rollout (a multi-turn one's: ``v1_episodes_rollout``): its first
    tasks with the default config, each one's opening sent to
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


def sibling(filename: str) -> Any:
    """A module of the engine beside this file (``verifiers_bridge.py``, ``load_environment_bridge.py``),
    loaded by its path as the probe loads this module (under ``python -I`` the folder is not on
    ``sys.path``; the builder copies them beside the probe)."""
    spec = importlib.util.spec_from_file_location(f"lab_{Path(filename).stem}", Path(__file__).resolve().with_name(filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _offline_scoring(bridge: Any, unscored: list[str]) -> Callable:
    """The bridge's ``score_trace`` for a build: offline, the reward functions that take a runtime
    left out (as ``v1_rollout``; a build has no sandboxes), and a judge's client error
    (``_out_of_reach``) leaving its reward unscored (appended to ``unscored``), not the episode failed."""
    score_trace = bridge.score_trace

    async def scored(opened: Any, task: Any, trace: Any, *, finalize: bool = False) -> None:
        opened.runtime_rewards = []
        try:
            await score_trace(opened, task, trace, finalize=finalize)
        except Exception as error:  # noqa: BLE001 - verifiers wraps the task's own error (TaskError): read its cause
            cause = error.__cause__ or error
            if not _out_of_reach(cause):
                raise
            unscored.append(f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}")
            for name in [name for name, reward in trace.rewards.items() if reward is None]:
                del trace.rewards[name]

    return scored


def v1_episodes_rollout(module_name: str) -> Rollout:
    """A multi-turn v1 taskset's rollout (one that exports a ``vf.Env`` of its own, or whose
    tasks use tools), played as a job plays it: the engine's verifiers bridge opens the taskset
    (module ``module_name``) with its defaults, starts an episode on each of its first
    ``ROLLOUT_EXAMPLES`` train tasks (each agent capped at ``ROLLOUT_MAX_TURNS`` turns, verifiers'
    episode deadline ``ROLLOUT_TIMEOUT_S``) and plays them round by round, every turn answered
    by the endpoint, until each ends; its rewards are the episodes' (the Env's own and the task's
    reward functions). The environment's turn code (the Env's ``run``, a tool, a ``@stop``, a
    user simulator) runs as in a job; an episode that ended in an error raises ``EpisodeFailed``
    naming it, a taskset the bridge refuses its ``BridgeError``."""

    def rollout(base_url: str) -> tuple[list[float], list[str]]:
        bridge_module = sibling("verifiers_bridge.py")
        unscored: list[str] = []
        bridge_module.score_trace = _offline_scoring(bridge_module, unscored)
        bridge = bridge_module.Bridge(None)
        try:
            handle = bridge.open(module_name, {})["handle"]
            tasks = bridge.tasks(handle, "train", 0, ROLLOUT_EXAMPLES, 0)["tasks"]
            played = bridge.start(handle, [task["id"] for task in tasks], limits={"max_turns": ROLLOUT_MAX_TURNS}, timeout_s=ROLLOUT_TIMEOUT_S)
            started, finished = played["episodes"], list(played["finished"])
            for _ in range(ROLLOUT_MAX_ROUNDS):
                if not played["requests"]:
                    break
                answers = [
                    {"request": request["request"], "text": chat_reply(base_url, request["messages"]), "input_tokens": 1, "output_tokens": 1}
                    for request in played["requests"]
                ]
                played = bridge.reply(handle, answers)
                finished += played["finished"]
            else:
                raise EpisodeFailed(f"RuntimeError: the episodes still asked for turns after {ROLLOUT_MAX_ROUNDS} rounds")
        finally:
            bridge.close()
            bridge.loop.close()
        ended = {episode["episode"]: episode for episode in finished}
        for episode in started:
            if ended[episode].get("error"):
                raise EpisodeFailed(ended[episode]["error"])
        return [float(ended[episode]["reward"]) for episode in started], unscored

    return rollout
