"""``lab evals``: run, list, inspect, read the samples of, push and cancel evaluations (docs/evaluations.md)."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labsdk._evals import Evaluation
from labsdk.cli._options import _UsageError
from labsdk.cli._output import EXIT_FAILED, EXIT_OK, _print, _print_json, _table, _text, _when
from labsdk.cli.try_environment import parse_arguments
from labsdk.client import Lab
from labsdk.errors import JobCancelledError, JobFailedError, WaitTimeoutError
from labsdk.secrets import SecretsError, parse_env_argument
from labsdk.vf_results import VfResultsError


def examples_count(text: str) -> int | str:
    """``--num-examples``: a whole number of at least 1, or ``all``."""
    if text == "all":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1 or all, not {text!r}")
    return value


def _number(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _same_environment(key: str, environment: str) -> bool:
    """Whether the ``--env-args`` id ``key`` names the ``--env`` id ``environment``: the same
    id, or the same ``owner/name`` (or ``name``) where one of the two leaves out the
    ``@version`` (or the owner)."""
    if key == environment:
        return True
    key_name, _, key_version = key.partition("@")
    name, _, version = environment.partition("@")
    if key_version and version and key_version != version:
        return False
    if "/" in key_name and "/" in name:
        return key_name == name
    return key_name.rpartition("/")[2] == name.rpartition("/")[2]


def _environment_arguments(items: list[str], environments: list[str]) -> dict[str, dict[str, Any]]:
    """``--env-args ID=ARGS`` items as ``{--env id: args}``; ARGS is a JSON object or TOML, as
    ``lab envs try --args`` reads it. Raises _UsageError for ARGS Lab cannot read or an ID that
    names no ``--env``."""
    arguments: dict[str, dict[str, Any]] = {}
    for item in items:
        key, equals, text = item.partition("=")
        if not equals or not key:
            raise _UsageError(f"--env-args {item!r}: expected ID=ARGS, e.g. lab/addition='{{\"max_operand\": 9}}'")
        value = parse_arguments(text, f"--env-args {key}")
        matches = [environment for environment in environments if _same_environment(key, environment)]
        if not matches:
            named = ", ".join(environments) or "none"
            raise _UsageError(f"--env-args {key}: no --env names that environment (--env given: {named})")
        for environment in matches:
            arguments[environment] = value
    return arguments


def _body(args: argparse.Namespace) -> dict[str, Any]:
    """The body of ``POST /evaluations`` from ``-f FILE`` (JSON, or TOML) and the flags, which
    override the file's keys. Raises _UsageError for a file or a flag Lab could not read."""
    body: dict[str, Any] = {}
    if args.file:
        try:
            text = Path(args.file).read_text()
            body = json.loads(text) if args.file.endswith(".json") else tomllib.loads(text)
        except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, not TOML, nested too deep
            raise _UsageError(f"{args.file}: {error}") from None
        if not isinstance(body, dict):
            raise _UsageError(f"{args.file}: expected an object with the keys of POST /evaluations, not {type(body).__name__}")
    targets = {kind: getattr(args, kind, None) for kind in ("model", "checkpoint", "adapter", "deployment")}
    targets["endpoint"] = getattr(args, "endpoint", None)
    given = [kind for kind, value in targets.items() if value]
    if len(given) > 1:
        raise _UsageError("give one of --model, --checkpoint, --adapter, --deployment and --endpoint")
    if given and given[0] == "endpoint":
        body["model"] = {"type": "endpoint", "base_url": args.endpoint, "model": args.endpoint_model}
    elif given:
        body["model"] = {"type": given[0], "id": targets[given[0]]}
    if getattr(args, "api_key_secret", None) and isinstance(body.get("model"), dict):
        body["model"]["api_key_secret"] = args.api_key_secret
    secrets = {}
    for argument in getattr(args, "secret", None) or []:
        try:
            secrets.update(parse_env_argument(argument))
        except SecretsError as error:
            raise _UsageError(str(error).replace("-e ", "--secret ")) from None
    if secrets:
        body["secrets"] = {**body.get("secrets", {}), **secrets}
    arguments = _environment_arguments(args.env_args or [], args.env or [])
    if args.env:
        body["environments"] = [
            {"id": environment, "args": arguments.get(environment, {}), "num_examples": args.num_examples,
             "rollouts_per_example": args.rollouts}
            for environment in args.env
        ]
    sampling = {
        key: value for key, value in (
            ("temperature", args.temperature), ("top_p", args.top_p), ("max_tokens", args.max_tokens), ("seed", args.seed),
        ) if value is not None
    }
    if sampling:
        body["sampling"] = {**body.get("sampling", {}), **sampling}
    if args.name:
        body["name"] = args.name
    if "model" not in body or not body.get("environments"):
        raise _UsageError(
            "say what to evaluate (--model, --checkpoint, --adapter, --deployment ID or --endpoint URL) "
            "and on what (--env ID), or give -f FILE"
        )
    return body


def evals_run(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals run (--model ID | --checkpoint ID | --adapter ID | --deployment ID | --endpoint
    URL --endpoint-model MODEL) [--api-key-secret NAME --secret NAME[=VALUE]] --env ID ...
    [--wait]``: queue an evaluation and print its id; with ``--wait``, wait and print its results
    (exit 1 unless it succeeded)."""
    body = _body(args)
    target = body.pop("model")
    kinds = ("model", "checkpoint", "adapter", "deployment", "endpoint")
    if not isinstance(target, dict) or target.get("type") not in kinds:
        raise _UsageError(f"the model to evaluate is {{type = {' | '.join(repr(kind) for kind in kinds)}, id = ...}}")
    unknown = sorted(set(body) - {"environments", "sampling", "name", "metadata", "resources", "secrets"})
    if unknown:
        raise _UsageError(f"{args.file}: unknown keys {', '.join(unknown)}")
    kind = target["type"]
    if kind == "endpoint":
        chosen = {"endpoint": {key: target[key] for key in ("base_url", "model") if target.get(key) is not None}}
    else:
        chosen = {kind: target.get("id")}
    if target.get("api_key_secret") is not None:
        chosen["api_key_secret"] = target["api_key_secret"]
    lab = client()
    evaluation = lab.evals.create(**chosen, **body)
    if not args.wait:
        if args.json:
            _print_json(evaluation)
        else:
            print(evaluation.id, flush=True)
        return EXIT_OK
    if not args.json:
        print(evaluation.id, flush=True)
    try:
        evaluation = lab.evals.wait(evaluation.id, timeout=args.timeout, progress=not args.no_progress and not args.json)
    except (JobFailedError, JobCancelledError, WaitTimeoutError) as error:
        if args.json:
            _print_json(error.job)
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        _print_json(evaluation)
    else:
        _show(evaluation)
    return EXIT_OK


def checkpoints_eval(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab checkpoints eval ID --env ID ...``: ``lab evals run --checkpoint ID``."""
    args.checkpoint = args.id
    return evals_run(args, client)


def _samples(evaluation: Evaluation) -> str:
    """``done/expected`` samples; an ended evaluation whose total was not known ahead
    (``--num-examples all``) shows the samples it has, a running one ``done/?``."""
    done, expected = evaluation.progress.get("samples", 0), evaluation.progress.get("expected_samples")
    if expected is not None:
        return f"{done}/{expected}"
    return str(done) if evaluation.is_terminal else f"{done}/?"


def evals_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals list [--status S]``: the project's evaluations, newest first."""
    evaluations = client().evals.list(status=args.status, limit=args.limit)[: args.limit]
    if args.json:
        _print_json(evaluations)
        return EXIT_OK
    table = _table("ID", "NAME", "STATUS", "MODEL", "ENVIRONMENTS", "SAMPLES", "CREATED", wrap=("NAME", "ENVIRONMENTS", "CREATED"))
    for evaluation in evaluations:
        table.add_row(
            _text(evaluation.id), _text(evaluation.name), _text(evaluation.status), _text(evaluation.model.get("id")),
            _text(" ".join(environment["id"] for environment in evaluation.environments)),
            _samples(evaluation), _when(evaluation.created_at),
        )
    _print(table)
    return EXIT_OK


def evals_get(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals get ID``: one evaluation and, once it has ended, its results per environment."""
    evaluation = client().evals.retrieve(args.id)
    if args.json:
        _print_json(evaluation)
    else:
        _show(evaluation)
    return EXIT_OK


def _show(evaluation: Evaluation) -> None:
    """Print an evaluation's summary line, then its results table (or its progress)."""
    model = evaluation.model
    print(f"{evaluation.id} {evaluation.status} {model.get('type')} {model.get('id')} job {evaluation.job_id}"
          + (f" ({evaluation.error.code}: {evaluation.error.message})" if evaluation.error else ""))
    if evaluation.results is None:
        print(f"samples {_samples(evaluation)}")
        return
    table = _table("ENVIRONMENT", "SAMPLES", "REWARD", "STDERR", "PASS@K", "ERRORS", "TIMEOUTS", wrap=("PASS@K",))
    for environment, result in evaluation.results.items():
        table.add_row(
            _text(environment), str(result["samples"]), _number(result["reward_mean"]), _number(result["reward_stderr"]),
            " ".join(f"@{k}={_number(value)}" for k, value in result["pass_at_k"].items()),
            str(result["errors"]), str(result["timeouts"]),
        )
    _print(table)
    # Each reward function on a row of its own: a narrow terminal never folds a name.
    functions = _table("ENVIRONMENT", "FUNCTION", "MEAN")
    for environment, result in evaluation.results.items():
        for name, value in result["functions"].items():
            functions.add_row(_text(environment), _text(name), _number(value))
    if functions.row_count:
        print()
        _print(functions)


def evals_samples(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals samples ID [--env ID] [--min-reward R] [--max-reward R] [--limit N]``: samples in stored order."""
    samples = client().evals.samples(
        args.id, environment=args.env, min_reward=args.min_reward, max_reward=args.max_reward, limit=args.limit,
    )
    if args.json:
        _print_json(samples)
        return EXIT_OK
    table = _table("ENVIRONMENT", "EXAMPLE", "ROLLOUT", "REWARD", "PROMPT", "COMPLETION", wrap=("PROMPT", "COMPLETION"))
    for sample in samples:
        prompt = sample.prompt[-1].get("content", "") if sample.prompt else ""
        completion = sample.completion if not sample.error else f"error: {sample.error}"
        table.add_row(_text(sample.environment), str(sample.example), str(sample.rollout), _number(sample.reward),
                      _text(str(prompt)[:200]), _text(completion[:200]))
    _print(table)
    return EXIT_OK


def evals_cancel(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals cancel ID``: cancel an evaluation (the samples stored so far stay)."""
    evaluation = client().evals.cancel(args.id)
    if args.json:
        _print_json(evaluation)
    else:
        print(f"{evaluation.id} {evaluation.status}")
    return EXIT_OK


def evals_retry(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals retry ID``: run a failed or cancelled evaluation again."""
    evaluation = client().evals.retry(args.id)
    if args.json:
        _print_json(evaluation)
    else:
        print(f"{evaluation.id} {evaluation.status}")
    return EXIT_OK


def evals_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals delete ID``: delete a finished evaluation with its samples."""
    client().evals.delete(args.id)
    print(f"{args.id} deleted")
    return EXIT_OK


def evals_push(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab evals push DIR [--name N] [--env ID]``: push a local vf-eval run's results; prints the
    evaluation and its results."""
    try:
        evaluation = client().evals.push(args.dir, name=args.name, environment=args.env, progress=not args.json)
    except VfResultsError as error:
        raise _UsageError(str(error)) from None
    if args.json:
        _print_json(evaluation)
    else:
        _show(evaluation)
    return EXIT_OK
