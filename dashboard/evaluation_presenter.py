"""How the dashboard's evaluation pages show what ``evaluations.selectors`` reads: rows of the
evaluations list, the summary of each environment, a sample as turns and as plain text, and the
rows of a comparison. Pure functions of the Evaluation and EvaluationSample objects
(``evaluations.serializers``, docs/evaluations.md); no query is made here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from evaluations.models import Evaluation
from evaluations.selectors import Comparison, ExampleOutcome, VersionEvaluations
from jobs.evaluation_samples import EvaluationSample


def target_label(shown: dict[str, Any]) -> str:
    """What an Evaluation object scores, in words: the catalogue model's id, or
    ``checkpoint ckpt_... of <base model>``."""
    model = shown["model"]
    if model["type"] == "model":
        return model["id"]
    return f"{model['type']} {model['id']} of {shown['base_model']}"


def environment_result(shown: dict[str, Any], environment_id: str) -> dict[str, Any] | None:
    """The results of an Evaluation object on ``environment_id`` (None until it has ended)."""
    return (shown.get("results") or {}).get(environment_id)


def list_row(shown: dict[str, Any]) -> dict[str, Any]:
    """One row of the evaluations list: the Evaluation object with its target in words and, per
    environment, ``{"id", "reward_mean", "reward_stderr"}`` (None before the end)."""
    environments = []
    for environment in shown["environments"]:
        result = environment_result(shown, environment["id"]) or {}
        environments.append(
            {"id": environment["id"], "reward_mean": result.get("reward_mean"), "reward_stderr": result.get("reward_stderr")}
        )
    return {**shown, "target": target_label(shown), "environment_rewards": environments}


def environment_summaries(shown: dict[str, Any], histograms: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The summary of each environment of an Evaluation object, in its order: its id, arguments,
    examples and rollouts as asked, its results (None before the end) with ``pass_at_k`` as
    ``[(k, value)]`` by k and ``functions`` as ``[(name, mean)]`` by name, and the reward
    histogram ``histograms[i]`` with its tallest bin (for ``<progress max>``)."""
    summaries = []
    for index, environment in enumerate(shown["environments"]):
        result = environment_result(shown, environment["id"])
        if result is not None:
            result = {
                **result,
                "pass_at_k": sorted(((int(k), value) for k, value in result["pass_at_k"].items())),
                "functions": sorted(result["functions"].items()),
            }
        bins = histograms[index] if index < len(histograms) else []
        summaries.append({
            "index": index,
            "id": environment["id"],
            "args": json.dumps(environment.get("args") or {}, sort_keys=True),
            "num_examples": environment["num_examples"],
            "rollouts_per_example": environment["rollouts_per_example"],
            "result": result,
            "histogram": bins,
            "tallest": max((item["count"] for item in bins), default=0),
        })
    return summaries


@dataclass(frozen=True)
class Turn:
    """One message of a conversation: its role and its text."""

    role: str
    text: str


def _text(content: Any) -> str:
    """A message's content as text: a string as it is, the text parts of a list of parts, else JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        texts = [part.get("text") for part in content if isinstance(part.get("text"), str)]
        if len(texts) == len(content):
            return "\n".join(texts)
    return json.dumps(content, indent=2, sort_keys=True, ensure_ascii=False)


def turns(messages: Any) -> list[Turn]:
    """Chat messages (``[{"role", "content", ...}]``) as turns; a tool call a message carries is
    shown as its JSON after the text. Anything that is not a list of messages is one turn."""
    if not isinstance(messages, list) or not all(isinstance(message, dict) for message in messages):
        return [Turn("", _text(messages))]
    shown = []
    for message in messages:
        text = _text(message.get("content") or "")
        if message.get("tool_calls"):
            calls = json.dumps(message["tool_calls"], indent=2, sort_keys=True, ensure_ascii=False)
            text = f"{text}\n{calls}" if text else calls
        shown.append(Turn(str(message.get("role") or ""), text))
    return shown


def completion_turns(completion: Any) -> list[Turn]:
    """A sample's completion as turns: the reply (one turn with the assistant's role) or, where an
    environment stores the conversation after the prompt as messages, each of them."""
    if isinstance(completion, str):
        try:
            parsed = json.loads(completion)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and parsed and all(isinstance(item, dict) and "role" in item for item in parsed):
            return turns(parsed)
        return [Turn("assistant", completion)]
    return turns(completion)


def info_text(info: Any) -> str:
    """An environment's ``info`` as indented JSON with sorted keys (``{}`` when it has none)."""
    return json.dumps(info or {}, indent=2, sort_keys=True, ensure_ascii=False)


def _section(title: str, body: str) -> str:
    return f"=== {title} ===\n{body.rstrip()}\n"


def sample_text(sample: dict[str, Any], evaluation_id: str) -> str:
    """One EvaluationSample object as plain text laid out the same way for every sample, so that
    two samples compare line by line with ``diff``: a header of its keys, the prompt's turns,
    the completion's, the answer, the reward and each reward function's score by name, the
    ``info`` as indented JSON with sorted keys, tokens and flags. Ends with a newline."""
    flags = [name for name in ("truncated", "timed_out") if sample.get(name)]
    header = "\n".join([
        f"evaluation: {evaluation_id}",
        f"sample: {sample['id']}",
        f"environment: {sample['environment']}",
        f"example: {sample['example']}",
        f"rollout: {sample['rollout']}",
    ])
    parts = [header + "\n"]
    parts.append(_section("prompt", "\n".join(f"[{turn.role}]\n{turn.text}" for turn in turns(sample["prompt"]))))
    parts.append(_section("completion", "\n".join(
        f"[{turn.role}]\n{turn.text}" for turn in completion_turns(sample["completion"])
    )))
    parts.append(_section("answer", sample.get("answer") or ""))
    scores = [f"reward: {sample['reward']!r}"] + [f"{name}: {value!r}" for name, value in sorted(sample["functions"].items())]
    parts.append(_section("scores", "\n".join(scores)))
    parts.append(_section("info", info_text(sample.get("info"))))
    tokens = sample["tokens"]
    facts = [f"tokens: prompt {tokens['prompt']}, completion {tokens['completion']}", f"latency_s: {sample['latency_s']!r}"]
    if flags:
        facts.append(f"flags: {', '.join(flags)}")
    if sample.get("error"):
        facts.append(f"error: {sample['error']}")
    parts.append(_section("run", "\n".join(facts)))
    return "\n".join(parts)


@dataclass(frozen=True)
class ComparedCell:
    """One evaluation's outcome on one compared example, with its first rollout's sample (None
    where it did not score the example, or that sample is not stored)."""

    evaluation: Evaluation
    outcome: ExampleOutcome | None
    sample: EvaluationSample | None


def comparison_rows(
    comparison: Comparison, keys: list[str], first_samples: list[dict[int, EvaluationSample]]
) -> list[dict[str, Any]]:
    """The rows of a comparison page for ``keys`` (a page of ``comparison.rows(...)``):
    ``{"key", "prompt", "cells": [ComparedCell per evaluation], "verdict"}`` where ``prompt`` is
    the first stored sample's prompt as turns and ``verdict`` is ``all`` (every evaluation that
    scored it solves it), ``none`` or ``split``. ``first_samples[i]`` are evaluation ``i``'s first
    rollouts by example index (``evaluations.selectors.example_first_samples``)."""
    rows = []
    for key in keys:
        outcomes = comparison.row(key)
        cells = [
            ComparedCell(
                comparison.evaluations[index], outcome,
                first_samples[index].get(outcome.example) if outcome is not None else None,
            )
            for index, outcome in enumerate(outcomes)
        ]
        verdicts = {outcome.solved for outcome in outcomes if outcome is not None}
        prompt = next((cell.sample.prompt for cell in cells if cell.sample is not None), None)
        rows.append({
            "key": key,
            "prompt": turns(prompt) if prompt is not None else [],
            "cells": cells,
            "verdict": "split" if len(verdicts) > 1 else ("all" if verdicts == {True} else "none"),
        })
    return rows


def agreement_matrix(comparison: Comparison) -> list[list[int | None]]:
    """For every ordered pair of compared evaluations, how many examples both scored that the
    row's evaluation solves and the column's does not (None on the diagonal)."""
    count = len(comparison.evaluations)
    return [
        [None if row == column else comparison.solved_not(row, column) for column in range(count)]
        for row in range(count)
    ]


def version_rows(group: VersionEvaluations) -> list[dict[str, Any]]:
    """The rows of an environment page for one of its versions (``evaluations.selectors.
    environment_evaluations``, best first): each evaluation with its project, what it scores,
    its status and its results on that version (None before the end), pass@1 among them."""
    rows = []
    for evaluation, shown in group.evaluations:
        result = environment_result(shown, group.environment_id)
        rows.append({
            "evaluation": evaluation,
            "project": evaluation.project,
            "shown": shown,
            "target": target_label(shown),
            "result": result,
            "pass_at_1": (result or {}).get("pass_at_k", {}).get("1"),
        })
    return rows
