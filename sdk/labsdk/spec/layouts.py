"""Prime configs in other layouts than Lab's, translated into a Lab spec.

Two layouts are recognised, by their keys:

- **prime-rl's native layout** (prime-rl's ``RLConfig``, ``configs/rl.py``; what prime CLI
  0.18 submits for dedicated runs and what prime-rl's examples use, e.g.
  ``examples/basic/reverse-text/rl.toml``): a ``[model]`` table, or any of the tables
  ``[orchestrator]``, ``[trainer]``, ``[ckpt]``, ``[inference]``, ``[deployment]``.
- **the older prime CLI form** (prime's ``examples/rl_config.toml``): a top-level
  ``environments = ["owner/name"]`` list or ``rollouts`` count instead of ``[[env]]`` and
  ``rollouts_per_example``.

Each translates into a Lab spec with ``translated_from = {layout, config}`` holding the
config as submitted; every key Lab cannot honour is named in a warning. Any other mapping
is returned unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from labsdk.spec.model import EnvConfig, EvalEnvConfig

#: Top-level tables that only prime-rl's native layout has.
NATIVE_TABLES = ("orchestrator", "trainer", "ckpt", "inference", "deployment")

_NATIVE_ENV_LISTS = (("orchestrator", "train", "env"), ("orchestrator", "env"), ("orchestrator", "train", "source"))
_NATIVE_SAMPLING = (("orchestrator", "sampling"), ("orchestrator", "train", "sampling"))


def detect_layout(data: Mapping[str, Any]) -> str | None:
    """Return ``"prime-rl"``, ``"prime-cli-v0"`` or ``None`` (Lab's own layout) for decoded
    spec data."""
    if isinstance(data.get("model"), Mapping) or any(key in data for key in NATIVE_TABLES):
        return "prime-rl"
    if "env" not in data and ("environments" in data or "rollouts" in data):
        return "prime-cli-v0"
    return None


def translate_layout(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Translate ``data`` into Lab's layout when it is in another one (:func:`detect_layout`).

    Returns the spec data and the warnings of the translation (one per key Lab does not
    use, and one saying what was translated). Lab-layout data comes back as a plain copy
    with no warnings. Never raises for bad values: they are copied to their Lab keys, where
    validation reports them.
    """
    spec, warnings, _ = translate_with_sources(data)
    return spec, warnings


def translate_with_sources(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """:func:`translate_layout`, and where each translated Lab key came from: ``{"batch_size":
    "orchestrator.batch_size", "env": "orchestrator.train.env", ...}`` (dotted paths), so a
    problem found in the translation can name the key as the user wrote it."""
    layout = detect_layout(data)
    if layout == "prime-rl":
        translation = _NativeTranslation(data)
        spec, warnings = translation.run()
        return spec, warnings, translation.sources
    if layout == "prime-cli-v0":
        spec, warnings = _translate_cli_v0(data)
        sources = {"env": "environments", "rollouts_per_example": "rollouts", "sampling.max_tokens": "seq_len"}
        return spec, warnings, {key: source for key, source in sources.items() if source in data}
    return _move_gpu_split(data)


#: Prime's full-fine-tuning keys, which Lab keeps in ``[resources]``.
GPU_SPLIT_KEYS = ("num_train_gpus", "num_infer_gpus")


def _move_gpu_split(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """Return Lab-layout ``data`` with top-level ``num_train_gpus`` / ``num_infer_gpus`` moved
    into ``[resources]`` (a warning each), and their sources. A key also given in
    ``[resources]`` stays where it is and is refused there as unknown."""
    spec, warnings, sources = dict(data), [], {}
    resources = spec.get("resources", {})
    for key in GPU_SPLIT_KEYS:
        if key in spec and isinstance(resources, Mapping) and key not in resources:
            resources = {**resources, key: spec.pop(key)}
            spec["resources"] = resources
            sources[f"resources.{key}"] = key
            warnings.append(f"'{key}' belongs in [resources]: read as 'resources.{key}'")
    return spec, warnings, sources


def _translate_cli_v0(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    spec = {key: value for key, value in data.items() if key not in ("environments", "rollouts", "seq_len")}
    translated = []
    environments = data.get("environments")
    if environments is not None:
        spec["env"] = [{"id": item} for item in environments] if isinstance(environments, list) else environments
        translated.append("environments to [[env]] blocks")
    if "rollouts" in data:
        spec.setdefault("rollouts_per_example", data["rollouts"])
        translated.append("rollouts to rollouts_per_example")
    if "seq_len" in data:
        sampling = spec.get("sampling")
        sampling = dict(sampling) if isinstance(sampling, Mapping) else {}
        sampling.setdefault("max_tokens", data["seq_len"])
        spec["sampling"] = sampling
        translated.append("seq_len to sampling.max_tokens")
    spec["translated_from"] = {"layout": "prime-cli-v0", "config": copy.deepcopy(dict(data))}
    return spec, [
        "this is the older prime CLI form; Lab translated " + ", ".join(translated)
        + ": write [[env]] blocks, rollouts_per_example and sampling.max_tokens instead"
    ]


class _NativeTranslation:
    """One translation of a prime-rl native config; tracks which keys were used."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = data
        self.used: set[tuple[str, ...]] = set()
        self.spec: dict[str, Any] = {}
        self.unused_inside: list[tuple[str, ...]] = []  # keys inside translated lists
        self.sources: dict[str, str] = {}  # Lab key -> the native key it came from (dotted)

    def get(self, *path: str) -> Any:
        node: Any = self.data
        for part in path:
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    def take(self, path: tuple[str, ...], *target: str) -> None:
        """Copy the value at ``path`` (when given) to the Lab key ``target`` (dotted parts)."""
        value = self.get(*path)
        if value is None:
            return
        self.used.add(path)
        holder = self.spec
        for part in target[:-1]:
            holder = holder.setdefault(part, {})
        if target[-1] not in holder:
            holder[target[-1]] = value
            self.sources[".".join(target)] = ".".join(path)

    def run(self) -> tuple[dict[str, Any], list[str]]:
        model = self.get("model")
        if isinstance(model, Mapping):
            self.take(("model", "name"), "model")
            self.used.add(("model",)) if not model else None
        else:
            self.take(("model",), "model")
        self.take(("name",), "name")
        self.take(("max_steps",), "max_steps")
        self.take(("wandb",), "wandb")
        for key in ("model", "wandb"):  # an empty table is fully used
            if self.get(key) == {}:
                self.used.add((key,))
        self._lora()
        self._orchestrator()
        self._trainer()
        self._checkpoints()
        self._resources()
        if "seq_len" in self.data:
            self.used.add(("seq_len",))
            if not self.spec.get("sampling", {}).get("max_tokens"):
                self.spec.setdefault("sampling", {})["max_tokens"] = self.data["seq_len"]
        self.spec["translated_from"] = {"layout": "prime-rl", "config": copy.deepcopy(dict(self.data))}
        warnings = ["this is prime-rl's native layout; Lab translated it into a Lab spec and keeps the "
                    "original as spec.translated_from"]
        warnings += [
            f"'{'.'.join(path)}' is a prime-rl setting that Lab does not use; it is kept in "
            "spec.translated_from and ignored"
            for path in self._unused(self.data, ()) + self.unused_inside
        ]
        return self.spec, warnings

    def _unused(self, node: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        """Return the paths under ``node`` that nothing used (a table whose every key went
        unused is named once, as the table)."""
        if path in self.used:
            return []
        if not isinstance(node, Mapping) or not node:
            return [path] if path else []
        found = []
        for key, value in node.items():
            found += self._unused(value, (*path, str(key)))
        child_count = len(node)
        if path and len(found) == child_count and all(len(item) == len(path) + 1 for item in found):
            return [path]
        return found

    def _lora(self) -> None:
        for base in (("model", "lora"), ("trainer", "model", "lora")):
            if isinstance(self.get(*base), Mapping):
                self.take((*base, "rank"), "lora_rank")
                self.take((*base, "alpha"), "lora_alpha")
                if not self.get(*base):
                    self.used.add(base)
        if "lora_rank" not in self.spec:
            self.spec["lora_rank"] = 0  # prime-rl trains every weight unless a LoRA is configured

    def _orchestrator(self) -> None:
        self.take(("orchestrator", "batch_size"), "batch_size")
        self.take(("orchestrator", "group_size"), "rollouts_per_example")
        self.take(("orchestrator", "rollouts_per_example"), "rollouts_per_example")
        self.take(("orchestrator", "max_off_policy_steps"), "max_off_policy_steps")
        self.take(("orchestrator", "max_async_level"), "max_off_policy_steps")
        self.take(("orchestrator", "seed"), "seed")
        for base in _NATIVE_SAMPLING:
            self.take((*base, "temperature"), "sampling", "temperature")
            self.take((*base, "max_tokens"), "sampling", "max_tokens")
            self.take((*base, "max_completion_tokens"), "sampling", "max_tokens")
        for base in _NATIVE_ENV_LISTS:
            entries = self.get(*base)
            if isinstance(entries, list) and "env" not in self.spec:
                self.used.add(base)
                self.sources["env"] = ".".join(base)
                self.spec["env"] = [self._env(entry, (*base, str(i)), EnvConfig) for i, entry in enumerate(entries)]
        evaluation = self.get("orchestrator", "eval")
        if isinstance(evaluation, Mapping):
            for key in ("interval", "num_examples", "rollouts_per_example", "skip_first_step"):
                self.take(("orchestrator", "eval", key), "eval", key)
            for key in ("env", "environments"):
                entries = evaluation.get(key)
                if isinstance(entries, list):
                    self.used.add(("orchestrator", "eval", key))
                    self.spec.setdefault("eval", {})["env"] = [
                        self._env(entry, ("orchestrator", "eval", key, str(i)), EvalEnvConfig)
                        for i, entry in enumerate(entries)
                    ]

    def _env(self, entry: Any, path: tuple[str, ...], model: type[EnvConfig]) -> Any:
        """Translate one native environment block: its id from ``id`` or ``env.taskset.id``,
        its harness from ``env.agent.harness``; keys Lab has no field for become warnings."""
        if not isinstance(entry, Mapping):
            return entry
        nested = entry.get("env") if isinstance(entry.get("env"), Mapping) else {}
        taskset = nested.get("taskset", entry.get("taskset"))
        agent = nested.get("agent") if isinstance(nested.get("agent"), Mapping) else {}
        harness = agent.get("harness", entry.get("harness"))
        env = {}
        for key, value in entry.items():
            if key in model.model_fields and key not in ("taskset", "harness"):
                env[key] = value
            elif key != "env" and key not in ("taskset", "harness"):
                self.unused_inside.append((*path, str(key)))
        for key in nested:
            if key not in ("taskset", "agent"):
                self.unused_inside.append((*path, "env", str(key)))
        for key in agent:
            if key != "harness":
                self.unused_inside.append((*path, "env", "agent", str(key)))
        if taskset is not None:
            env["taskset"] = taskset
        if harness is not None:
            env["harness"] = harness
        if isinstance(taskset, Mapping) and "args" in taskset and "args" not in env:
            env["args"] = taskset["args"]
            env["taskset"] = {key: value for key, value in taskset.items() if key != "args"}
        return env

    def _trainer(self) -> None:
        self.take(("trainer", "optim", "lr"), "learning_rate")

    def _checkpoints(self) -> None:
        checkpoint = self.get("ckpt")
        if isinstance(checkpoint, Mapping):
            self.used.add(("ckpt",)) if not checkpoint else None
            self.take(("ckpt", "interval"), "checkpoints", "interval")
            self.take(("ckpt", "keep_last"), "checkpoints", "keep_last")
            # prime-rl writes checkpoints only when [ckpt] is there; without an interval, at the end
            self.spec.setdefault("checkpoints", {}).setdefault("interval", 0)

    def _resources(self) -> None:
        inference = self.get("inference")
        if inference == {}:
            self.used.add(("inference",))  # an inference server is how Lab always samples
        gpu_type = self.data.get("gpu_type")
        if gpu_type is not None:
            self.used.add(("gpu_type",))
            self.spec.setdefault("resources", {})["gpu_type"] = gpu_type
            gpus = [self.get("deployment", key) for key in GPU_SPLIT_KEYS]
            if all(type(count) is int for count in gpus):
                self.used.update({("deployment", key) for key in GPU_SPLIT_KEYS})
                self.spec["resources"]["gpus"] = sum(gpus)
                if sum(gpus) >= 2:  # a split of one GPU is the whole engine on it
                    for key in GPU_SPLIT_KEYS:
                        self.take(("deployment", key), "resources", key)


def _explicit_max_tokens(layout: str, config: Mapping[str, Any]) -> bool:
    """Whether a translated config gave a completion limit of its own (not only ``seq_len``)."""
    if layout == "prime-cli-v0":
        sampling = config.get("sampling")
        return isinstance(sampling, Mapping) and sampling.get("max_tokens") is not None
    orchestrator = config.get("orchestrator") if isinstance(config.get("orchestrator"), Mapping) else {}
    tables = [orchestrator.get("sampling"), (orchestrator.get("train") or {}).get("sampling")
              if isinstance(orchestrator.get("train"), Mapping) else None]
    return any(
        isinstance(table, Mapping) and (table.get("max_tokens") is not None or table.get("max_completion_tokens") is not None)
        for table in tables
    )


def fit_seq_len(parsed: Any, context_length: int) -> Any:
    """Cap ``sampling.max_tokens`` at ``context_length`` (tokens) when it was translated from a
    ``seq_len`` (prime's older CLI form, or prime-rl's layout without a sampling limit): there
    ``seq_len`` bounds the whole sequence, and the model's context is the most a completion can
    have. Returns ``parsed`` (a :class:`~labsdk.spec.ParsedSpec`) unchanged otherwise, or a copy
    with the cap and a warning saying so."""
    spec = parsed.spec
    source = spec.translated_from
    if source is None or spec.sampling.max_tokens <= context_length:
        return parsed
    if source.config.get("seq_len") != spec.sampling.max_tokens or _explicit_max_tokens(source.layout, source.config):
        return parsed
    sampling = spec.sampling.model_copy(update={"max_tokens": context_length})
    warning = (f"'seq_len' = {spec.sampling.max_tokens} is longer than the model's context: "
               f"sampling.max_tokens is capped at {context_length}")
    return type(parsed)(spec=spec.model_copy(update={"sampling": sampling}), warnings=[*parsed.warnings, warning])
