"""Read the results of a local verifiers ``vf-eval`` run, as verifiers itself writes them, into what
``POST /evaluations/push`` takes (``lab evals push DIR``, docs/evaluations.md).

Two generations of verifiers write two layouts:

- **0.3** (``load_environment`` environments, ``verifiers.legacy``; ``vf-eval ENV --save-results``):
  a run folder ``outputs/evals/<env>--<model>/<id>/`` with ``metadata.json`` (``env_id``,
  ``env_args``, ``model``, ``base_url``, ``num_examples``, ``rollouts_per_example``,
  ``sampling_args``, ``avg_reward``, ``version_info``, ...) and ``results.jsonl``, one
  ``RolloutOutput`` a line (``example_id``, ``prompt``, ``completion`` as chat messages,
  ``answer``, ``reward``, ``metrics`` by reward function, ``error``, ``timing``,
  ``is_truncated``, ``stop_condition``, ``token_usage``, ``info``), as
  ``verifiers.legacy.utils.save_utils.save_outputs`` and ``save_metadata`` write them.
- **0.4** (``verifiers.v1`` tasksets; ``vf-eval TASKSET``): a run folder ``<output_dir>/<run>/``
  with ``configs/resolved/eval.json`` (the resolved ``EvalConfig``: ``env``, ``model``,
  ``client``, ``sampling``, ``select``, ``num_rollouts``) and ``traces.jsonl``, one ``Episode``
  a line (``task`` with its ``data.idx``, ``ok``, ``is_timeout``, ``errors`` and its
  ``traces``, each with chat ``nodes``, model ``calls``, ``rewards`` as ``{name: {"score",
  "weight"}}``, ``metrics``, ``info``, token counts and ``timing``), as
  ``verifiers.v1.utils.trace_store.write_episode`` writes them.

Examples are numbered 0, 1, ... in the order of the run's own example ids (``example_id``, or
the task's ``idx``), each one's original id kept in the sample's ``info``; a rollout is the n-th
line of its example in the file. So reading the same folder twice gives the same samples with the
same keys, and ``push_id`` (a SHA-256 of the files read) is the same: pushing it again stores
nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PushedRun", "legacy_sample", "read_vf_eval_run", "VfResultsError"]

#: The largest text kept of a prompt message, a completion or an answer (the API's limits).
_MAX_COMPLETION = 262_144
_MAX_ANSWER = 65_536
_MAX_ERROR = 4000


class VfResultsError(ValueError):
    """The folder holds no ``vf-eval`` run Lab can read; the message says what is missing or wrong."""


@dataclass
class PushedRun:
    """A ``vf-eval`` run read from its folder: the body of ``POST /evaluations/push``
    (``create_body``) and its samples, in the API's shape, in file order."""

    push_id: str
    format: str
    model: str
    environment: dict[str, Any]
    sampling: dict[str, Any]
    details: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def create_body(self, *, name: str | None = None, environment: str | None = None) -> dict[str, Any]:
        """The body of ``POST /evaluations/push``; ``environment`` renames the run's environment
        (e.g. to the id Lab knows it by)."""
        body: dict[str, Any] = {
            "push_id": self.push_id, "model": self.model,
            "environment": {**self.environment, **({"id": environment} if environment else {})},
            "sampling": self.sampling, "details": self.details,
        }
        if name:
            body["name"] = name
        return body


def read_vf_eval_run(path: str | Path) -> PushedRun:
    """Read the ``vf-eval`` run in folder ``path`` (either generation; a path to one of its files
    names its folder). Raises VfResultsError when it holds neither layout, or a file of it is
    not what verifiers writes."""
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent if folder.name in ("metadata.json", "results.jsonl", "traces.jsonl") else folder
    if not folder.is_dir():
        raise VfResultsError(f"{path}: no such folder")
    if (folder / "metadata.json").is_file() and (folder / "results.jsonl").is_file():
        return _read_legacy(folder)
    config = folder / "configs" / "resolved" / "eval.json"
    if (folder / "traces.jsonl").is_file() and config.is_file():
        return _read_v1(folder, config)
    raise VfResultsError(
        f"{folder} holds no vf-eval run: expected metadata.json and results.jsonl (verifiers 0.3) "
        "or traces.jsonl and configs/resolved/eval.json (verifiers 0.4)"
    )


def _digest(*files: Path) -> str:
    hasher = hashlib.sha256()
    for file in files:
        hasher.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(chunk)
    return "vf-" + hasher.hexdigest()


def _json_lines(file: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise VfResultsError(f"{file}:{number}: not JSON ({error})") from None
        if not isinstance(row, dict):
            raise VfResultsError(f"{file}:{number}: not a JSON object")
        rows.append(row)
    if not rows:
        raise VfResultsError(f"{file}: no rollouts")
    return rows


def _json_object(file: Path) -> dict[str, Any]:
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as error:
        raise VfResultsError(f"{file}: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise VfResultsError(f"{file}: not a JSON object")
    return value


def _number(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) else default


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0 else 0


def _scores(values: Any) -> dict[str, float]:
    """The finite numbers of a ``{name: number}`` object."""
    if not isinstance(values, dict):
        return {}
    return {str(name)[:128]: float(value) for name, value in values.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)}


def _messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages as the API stores a prompt: a text prompt becomes one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return [{"role": str(item.get("role", "")), "content": _content(item.get("content"))} for item in value if isinstance(item, dict)]
    return []


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: their text
        return "".join(part.get("text", "") for part in value if isinstance(part, dict))
    return "" if value is None else json.dumps(value)


def _completion_text(messages: list[dict[str, Any]]) -> str:
    """A completion as one text: the reply alone, or each message as ``role: content``."""
    if len(messages) == 1 and messages[0]["role"] == "assistant":
        return messages[0]["content"][:_MAX_COMPLETION]
    return "\n\n".join(f"{message['role']}: {message['content']}" for message in messages)[:_MAX_COMPLETION]


def _error_text(value: Any) -> str:
    if not value:
        return ""
    if isinstance(value, dict):
        kind, message = value.get("type") or value.get("error") or "", value.get("message") or value.get("error_chain_str") or ""
        text = f"{kind}: {message}" if kind and message else str(kind or message or json.dumps(value))
    elif isinstance(value, list):
        text = "; ".join(_error_text(item) for item in value)
    else:
        text = str(value)
    return text[:_MAX_ERROR]


def _numbered(ids: list[Any]) -> tuple[dict[Any, int], list[int]]:
    """Number the run's example ids 0, 1, ... in their own order; the rollout of each row is its
    place among its example's rows."""
    order = sorted(set(ids), key=lambda value: (not isinstance(value, int | float), value if isinstance(value, int | float) else str(value)))
    examples = {value: index for index, value in enumerate(order)}
    seen: dict[Any, int] = defaultdict(int)
    rollouts = []
    for value in ids:
        rollouts.append(seen[value])
        seen[value] += 1
    return examples, rollouts


def _plan(examples: dict[Any, int], ids: list[Any]) -> dict[str, int | None]:
    """The run's examples and rollouts per example when every example has as many rollouts;
    none (Lab takes what is pushed) otherwise."""
    counts = set(Counter(ids).values())
    if len(counts) != 1:
        return {"num_examples": None, "rollouts_per_example": None}
    return {"num_examples": len(examples), "rollouts_per_example": counts.pop()}


def legacy_sample(row: dict[str, Any], *, example: int, rollout: int | None) -> dict[str, Any]:
    """One line of verifiers 0.3's ``results.jsonl`` (a ``RolloutOutput``) as the push API's
    sample, example ``example`` and rollout ``rollout`` (None: Lab takes the next free one); its
    own ``example_id`` is kept in ``info``."""
    completion = _messages(row.get("completion"))
    timing, usage = row.get("timing"), row.get("token_usage")
    timing, usage = (timing if isinstance(timing, dict) else {}), (usage if isinstance(usage, dict) else {})
    info = row.get("info") if isinstance(row.get("info"), dict) else {}
    sample = {
        "example": example, "prompt": _messages(row.get("prompt")),
        "completion": _completion_text(completion), "answer": str(row.get("answer") or "")[:_MAX_ANSWER],
        "info": {**info, "example_id": row.get("example_id", row.get("id")), "stop_condition": row.get("stop_condition")},
        "reward": _number(row.get("reward")), "functions": _scores(row.get("metrics")),
        "prompt_tokens": _count(usage.get("input_tokens")), "completion_tokens": _count(usage.get("output_tokens")),
        "latency_s": _number(timing.get("total")),
        "truncated": bool(row.get("is_truncated")), "timed_out": "timeout" in str(row.get("stop_condition") or ""),
        "error": _error_text(row.get("error")),
    }
    if rollout is not None:
        sample["rollout"] = rollout
    return sample


def _read_legacy(folder: Path) -> PushedRun:
    """verifiers 0.3's ``metadata.json`` and ``results.jsonl``."""
    metadata = _json_object(folder / "metadata.json")
    rows = _json_lines(folder / "results.jsonl")
    if not isinstance(metadata.get("env_id") or metadata.get("env"), str) or not isinstance(metadata.get("model"), str):
        raise VfResultsError(f"{folder / 'metadata.json'}: env_id and model are required")
    ids = [row.get("example_id", row.get("id")) for row in rows]
    if any(value is None for value in ids):
        raise VfResultsError(f"{folder / 'results.jsonl'}: a row has no example_id")
    examples, rollouts = _numbered(ids)
    samples = [
        legacy_sample(row, example=examples[example_id], rollout=rollout) for row, example_id, rollout in zip(rows, ids, rollouts)
    ]
    sampling = metadata.get("sampling_args") or {}
    return PushedRun(
        push_id=_digest(folder / "metadata.json", folder / "results.jsonl"), format="verifiers-0.3",
        model=metadata["model"][:256],
        environment={
            "id": str(metadata.get("env_id") or metadata.get("env"))[:256], "args": metadata.get("env_args") or {},
            **_plan(examples, ids),
        },
        sampling={key: sampling.get(key) for key in ("temperature", "top_p", "max_tokens") if isinstance(sampling.get(key), int | float)},
        details={
            "format": "verifiers-0.3", "verifiers_version": (metadata.get("version_info") or {}).get("vf_version"),
            "base_url": metadata.get("base_url"), "avg_reward": metadata.get("avg_reward"),
            "avg_metrics": metadata.get("avg_metrics"), "pass_at_k": metadata.get("pass_at_k"),
            "time_s": metadata.get("time"), "shuffle": metadata.get("shuffle"),
        },
        samples=samples,
    )


def _nodes_before_sampled(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A 0.4 trace's chat as (prompt messages, completion messages): the nodes before the first
    sampled one, and the rest."""
    nodes = [node for node in trace.get("nodes") or [] if isinstance(node, dict) and isinstance(node.get("message"), dict)]
    first = next((index for index, node in enumerate(nodes) if node.get("sampled")), len(nodes))
    messages = [_messages([node["message"]])[0] for node in nodes]
    return messages[:first], messages[first:]


def _read_v1(folder: Path, config_file: Path) -> PushedRun:
    """verifiers 0.4's ``configs/resolved/eval.json`` and ``traces.jsonl``."""
    config = _json_object(config_file)
    episodes = _json_lines(folder / "traces.jsonl")
    taskset = (config.get("env") or {}).get("taskset") or {}
    environment_id = taskset.get("id") or (config.get("env") or {}).get("id") or (episodes[0].get("env") or {}).get("id")
    if not isinstance(environment_id, str) or not environment_id or not isinstance(config.get("model"), str):
        raise VfResultsError(f"{config_file}: env.taskset.id and model are required")
    ids = [((episode.get("task") or {}).get("data") or {}).get("idx", (episode.get("task") or {}).get("key")) for episode in episodes]
    if any(value is None for value in ids):
        raise VfResultsError(f"{folder / 'traces.jsonl'}: an episode has no task idx")
    examples, rollouts = _numbered(ids)
    samples, version = [], None
    for episode, task_id, rollout in zip(episodes, ids, rollouts):
        traces = [trace for trace in episode.get("traces") or [] if isinstance(trace, dict)]
        trace = traces[0] if traces else {}
        version = version or (trace.get("verifiers") or {}).get("version")
        rewards = trace.get("rewards") if isinstance(trace.get("rewards"), dict) else {}
        reward = sum(_number(item.get("score")) * _number(item.get("weight"), 1.0) for item in rewards.values() if isinstance(item, dict))
        prompt, completion = _nodes_before_sampled(trace)
        data = (episode.get("task") or {}).get("data") or {}
        calls = [call for call in trace.get("calls") or [] if isinstance(call, dict)]
        model_time = ((trace.get("timing") or {}).get("agent") or {}).get("model") or {}
        samples.append({
            "example": examples[task_id], "rollout": rollout, "prompt": prompt, "completion": _completion_text(completion),
            "answer": str(data.get("answer") or "")[:_MAX_ANSWER],
            "info": {**(trace.get("info") if isinstance(trace.get("info"), dict) else {}), "idx": task_id,
                     "task_key": (episode.get("task") or {}).get("key"), "stop_condition": trace.get("stop_condition")},
            "reward": reward,
            "functions": {**{name: _number(item.get("score")) for name, item in rewards.items() if isinstance(item, dict)},
                          **_scores(trace.get("metrics"))},
            "prompt_tokens": _count(episode.get("num_input_tokens", trace.get("num_input_tokens"))),
            "completion_tokens": _count(episode.get("num_output_tokens", trace.get("num_output_tokens"))),
            "latency_s": _number(model_time.get("duration")),
            "truncated": any(call.get("finish_reason") == "length" for call in calls),
            "timed_out": bool(episode.get("is_timeout") or trace.get("is_timeout")),
            "error": _error_text((episode.get("errors") or []) + (trace.get("errors") or [])),
        })
    sampling = config.get("sampling") or {}
    return PushedRun(
        push_id=_digest(config_file, folder / "traces.jsonl"), format="verifiers-0.4", model=config["model"][:256],
        environment={
            "id": environment_id[:256],
            "args": {key: value for key, value in taskset.items() if key not in ("id", "task", "system_prompt")},
            **_plan(examples, ids),
        },
        sampling={key: sampling.get(key) for key in ("temperature", "top_p", "max_tokens") if isinstance(sampling.get(key), int | float)},
        details={
            "format": "verifiers-0.4", "verifiers_version": version, "base_url": (config.get("client") or {}).get("base_url"),
            "run": (config.get("run") or {}).get("name"), "select": config.get("select"),
        },
        samples=samples,
    )
