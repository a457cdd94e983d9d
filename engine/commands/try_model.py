"""Replies sampled by a catalogue model for ``lab envs try --model`` (engine.commands.try_environment).

The model is loaded as the inference role loads it (``engine.inference.build_server``, the
transformers backend, on this machine's CPU): a single-turn example's reply is the role's chat
completion of its messages, a multi-turn environment's episodes run as a job's rollouts run them
(``engine.multi_turn.run_episodes``). This module imports torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.inference import RequestError, build_server
from engine.models import ModelNotFound
from engine.multi_turn import run_episodes

__all__ = ["ModelNotFound", "RequestError", "score_with_model"]


def score_with_model(env, examples: list, options: argparse.Namespace) -> list[dict]:
    """Sample one reply (one episode, for a multi-turn ``env``) per example with
    ``options.model`` (``max_tokens`` per reply, ``temperature``, ``seed``) and score it; return
    ``{"reply", "reward", "functions", "turns", "timed_out"}`` per example, and for a multi-turn
    ``env`` ``"tools"``: the tools its episode's turns offered the model (``[{"name",
    "description", "parameters"}]``, empty without tools), as ``--reply`` shows them.

    Raises ModelNotFound for a model outside the catalogue or missing from the model cache,
    RequestError for a prompt the chat template cannot take, and EnvironmentFailed as scoring does.
    """
    server = build_server(options.model, backend_name="transformers", workdir=Path(options.workdir) / "inference", seed=options.seed)
    if env.multi_turn:
        watched = _OfferedTools(env)
        rollouts = run_episodes(
            watched, examples, 1, tokenizer=server.tokenizer, backend=server.backend, stop_token_ids=server.stop_token_ids,
            context_length=server.max_model_len, max_tokens=options.max_tokens, temperature=options.temperature,
            seed=options.seed, template_kwargs={},
        )
        return [
            {"reply": rollout.text, "reward": rollout.reward, "functions": rollout.functions, "turns": rollout.turns,
             "timed_out": rollout.timed_out, "tools": list(watched.offered.get(example.info["task_id"], {}).values())}
            for example, rollout in zip(examples, rollouts, strict=True)
        ]
    results = []
    for index, example in enumerate(examples):
        answer = server.chat_completions({
            "model": options.model, "messages": example.messages, "max_tokens": options.max_tokens,
            "temperature": options.temperature, "seed": options.seed + index,
        })
        reply = answer["choices"][0]["message"]["content"]
        scores = env.score_rollout(reply, example)
        results.append({"reply": reply, "reward": scores.reward, "functions": scores.functions, "turns": 1,
                        "timed_out": scores.timed_out})
    return results


class _OfferedTools:
    """``env`` as ``run_episodes`` drives it (every other attribute is the environment's own),
    keeping the tools each task's trainable turns offered the model: ``offered``, ``{task id:
    {name: {"name", "description", "parameters"}}}``, from the OpenAI function specs of its
    requests. A retried episode is its task's again (``start_episodes`` names the task)."""

    def __init__(self, env) -> None:
        self._env = env
        self._tasks: dict[str, str] = {}  # episode id: its task id
        self.offered: dict[str, dict[str, dict]] = {}

    def __getattr__(self, name: str):
        return getattr(self._env, name)

    def start_episodes(self, task_ids: list[str], limits) -> dict:
        answer = self._env.start_episodes(task_ids, limits)
        self._tasks.update(zip(answer["episodes"], task_ids, strict=True))
        return self._seen(answer)

    def reply(self, answers: list[dict]) -> dict:
        return self._seen(self._env.reply(answers))

    def _seen(self, answer: dict) -> dict:
        for request in answer.get("requests") or []:
            if not request["trainable"]:
                continue
            for spec in request.get("tools") or []:
                function = spec.get("function", spec)
                self.offered.setdefault(self._tasks[request["episode"]], {})[function["name"]] = {
                    "name": function["name"], "description": function.get("description") or "",
                    "parameters": function.get("parameters") or {},
                }
        return answer
