"""``lab spec``: check a spec (locally, then by Lab, every problem in one report), write a
template, print the schema."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from labsdk.cli._options import _UsageError
from labsdk.cli._output import EXIT_FAILED, EXIT_OK, _print, _print_json, _report_problems, _table, _text
from labsdk.client import Lab
from labsdk.errors import (
    APIConnectionError,
    InvalidSpecError,
    NotFoundError,
)
from labsdk.secrets import take_spec_secrets
from labsdk.spec import SpecError, job_spec_json_schema, parse_spec, read_spec_file, secret_problems
from labsdk.spec_template import spec_fields, spec_template


def _merge_problems(first: Sequence[Any], then: Sequence[Any]) -> list[Any]:
    """``first`` and the problems of ``then`` that ``first`` does not already name (the same
    ``param`` and ``code``), in that order."""
    seen = {(problem.param or "", problem.code) for problem in first}
    return [*first, *(problem for problem in then if (problem.param or "", problem.code) not in seen)]


def spec_check(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab spec check FILE [-e KEY=VALUE] [--env-file FILE]``: every problem in one run. The
    local ones (shape, cross-field rules, the secrets the spec names) are found here; with
    LAB_API_KEY the spec also goes to Lab's estimate whatever was found, and Lab's problems
    (model and environment catalogues, environment arguments and packages, the pool,
    ``init_from``) are merged in, each ``param``/``code`` once. Without a key it says that the
    catalogues were not checked. Exits 1 with any problem, and when Lab cannot be reached."""
    parsed, problems, secrets = None, [], {}
    try:
        data = read_spec_file(args.file)
    except SpecError as exc:  # not a table that could be sent anywhere
        return _spec_check_failed(args, exc.errors, None)
    try:
        if isinstance(data, dict):
            secrets = take_spec_secrets(data, args.file, env_files=args.env_file or [], env_arguments=args.env or [])
        parsed = parse_spec(data)
        problems = secret_problems(parsed.spec, secrets)
    except SpecError as exc:
        problems = list(exc.errors)

    estimate = None
    lab = None if not isinstance(data, dict) else "checked" if os.environ.get("LAB_API_KEY") else "no_key"
    if lab == "checked":
        try:
            estimate = client().jobs.estimate(spec=data, secrets=secrets)
        except InvalidSpecError as exc:
            problems = _merge_problems(problems, exc.errors)
        except APIConnectionError:
            if problems:
                _spec_check_failed(args, problems, "not_reached")
            elif not args.json:
                print(f"{args.file}: valid locally; Lab was not reached to check the catalogues and the pool")
            raise
    if problems:
        return _spec_check_failed(args, problems, lab)
    assert parsed is not None
    warnings = list(dict.fromkeys(parsed.warnings + (estimate.warnings if estimate else [])))
    if args.json:
        _print_json({"valid": True, "errors": [], "warnings": warnings,
                     "estimate": estimate.to_dict() if estimate else None, "checked_by_lab": estimate is not None})
        return EXIT_OK
    checked = "valid (checked locally and by Lab)" if estimate else (
        "valid locally; its model and environments were not checked (no LAB_API_KEY): "
        "set LAB_API_KEY to check them, and the pool, through Lab"
    )
    print(f"{args.file}: {checked}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if estimate:
        table = _table("estimate", "value", wrap=("value",))
        table.show_header = False
        for name, value in (
            ("GPU-seconds", estimate.gpu_seconds), ("CPU-seconds", estimate.cpu_seconds),
            ("cost (USD)", estimate.cost_usd), ("queue position", estimate.queue_position),
            ("can start now", estimate.can_start_now), ("reason", estimate.reason),
        ):
            if value is not None:
                table.add_row(name, _text(value))
        _print(table)
    return EXIT_OK


#: How ``lab spec check`` says whether Lab checked a spec with problems, by what happened.
_LAB_CHECK = {
    "checked": "checked locally and by Lab",
    "no_key": "its model and environments were not checked (no LAB_API_KEY): set LAB_API_KEY to check them through Lab",
    "not_reached": "its model and environments were not checked: Lab was not reached",
}


def _spec_check_failed(args: argparse.Namespace, problems: Sequence[Any], lab: str | None) -> int:
    """Report the problems ``lab spec check`` found (``SpecProblem``s or ``ProblemDetail``s) and
    whether Lab checked the spec too (``lab``: a key of ``_LAB_CHECK``, ``None`` for a file not
    read); return EXIT_FAILED."""
    if args.json:
        _print_json({"valid": False, "errors": [problem.to_dict() if hasattr(problem, "to_dict") else dict(problem)
                                                for problem in problems],
                     "warnings": [], "estimate": None, "checked_by_lab": lab == "checked"})
        return EXIT_FAILED
    count = len(problems)
    checked = f" ({_LAB_CHECK[lab]})" if lab else ""
    print(f"{args.file}: {count} problem{'' if count == 1 else 's'}{checked}", file=sys.stderr)
    _report_problems(problems)
    return EXIT_FAILED


def _usable_models(client: Callable[[], Lab], model: str) -> tuple[list[str], int | None]:
    """With LAB_API_KEY: one line per model the organization may use (id, architecture, size,
    context, modes), for the template's comment, and ``model``'s context length (tokens). Raises
    ``_UsageError`` when ``model`` is not one of them. Without a key, or when Lab is not reached
    (said on stderr): none, and no context length."""
    if not os.environ.get("LAB_API_KEY"):
        return [], None
    try:
        usable = [found for found in client().models.list() if found.status in (None, "ready")]
    except APIConnectionError:
        print("warning: Lab was not reached: the template names no models of this organization", file=sys.stderr)
        return [], None
    if model not in {found.id for found in usable}:
        raise _UsageError(
            f"model {model!r} is not one this organization may use: {', '.join(found.id for found in usable)} (`lab models`)"
        )
    lines = []
    for found in usable:
        size = f"{found.parameters:,} parameters" if found.parameters else "size unknown"
        if found.active_parameters:
            size += f", {found.active_parameters:,} active"
        lines.append(f"{found.id}  ({found.architecture or 'unknown'}, {size}, context {found.context_length}, "
                     f"{' and '.join(found.modes) or 'lora and full'})")
    return lines, next((found.context_length for found in usable if found.id == model), None)


#: The judge endpoint's keys of ``[[env]] judge``, by the ``load_environment`` argument Lab sets from each.
_JUDGE_KEYS = {"judge_base_url": "base_url", "judge_model": "model", "judge_api_key_var": "api_key_var"}


def _environment_facts(
    client: Callable[[], Lab], environment_id: str,
) -> tuple[dict[str, Any], bool, dict[str, Any] | None]:
    """With LAB_API_KEY: the arguments ``environment_id`` takes with their defaults, whether its
    episodes are multi-turn, as Lab knows them (a built-in's from the catalogue; a package's
    from its latest ready build, which records both), and, for one that takes Prime's judge
    arguments (``JUDGE_ARGS``), its judge: ``{"base_url", "model", "api_key_var"}`` with the
    defaults it has (None where it has none), those arguments left out of the arguments, since
    only ``[[env]] judge`` declares the endpoint the job's network lets it reach. Defaults TOML
    cannot write (null, a value the build could only describe) are left out. Without a key, or
    when Lab does not know the environment (said on stderr): none, single-turn and no judge. A
    package whose build is still queued or running, or failed, has no arguments known: none, said
    on stderr."""
    if not os.environ.get("LAB_API_KEY"):
        return {}, False, None
    try:
        found = next((item for item in client().environments.list() if item.id == environment_id and item.kind == "builtin"), None)
        if found is None:
            found = client().environments.retrieve(environment_id)
    except APIConnectionError:
        return {}, False, None
    except NotFoundError:
        print(f"warning: Lab knows no environment {environment_id!r} (`lab envs`): the template leaves its args empty",
              file=sys.stderr)
        return {}, False, None
    if found.build is not None and found.build.status in ("queued", "running"):
        print(f"warning: the build of {environment_id} is still {found.build.status}, so its arguments are not known yet: "
              f"the template leaves its args empty; run `lab spec init` again once `lab envs info {environment_id}` "
              "shows it ready", file=sys.stderr)
        return {}, False, None
    if found.build is not None and found.build.status == "failed":
        print(f"warning: the build of {environment_id} failed, so its arguments are not known: the template leaves its "
              f"args empty; `lab envs info {environment_id}` says why, `lab envs rebuild` builds it again", file=sys.stderr)
        return {}, False, None
    defaults = dict(found.args or {})
    names = {parameter.get("name") for parameter in found.build.parameters} if found.build is not None else set()
    judge = None
    if names.union(defaults) & set(_JUDGE_KEYS):
        judge = {key: defaults.get(argument) for argument, key in _JUDGE_KEYS.items()}
        judge = {key: value if isinstance(value, str) and value else None for key, value in judge.items()}
    args = {
        name: value for name, value in defaults.items()
        if value is not None and not (isinstance(value, dict) and set(value) == {"repr"})
        and not (judge is not None and name in _JUDGE_KEYS)
    }
    return args, bool(found.build is not None and found.build.multi_turn), judge


def spec_init(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab spec init [FILE] [--model M] [--environment E] [--multi-turn] [--force]``: write a
    commented spec template (to stdout without FILE) that passes ``lab spec check`` as written;
    with LAB_API_KEY it lists the models the organization may use and refuses a ``--model`` that
    is not one of them, fills ``[[env]] args`` with the environment's defaults (warning, with
    none, while its build still runs), writes a judge-taking environment's ``judge`` commented out,
    writes a
    multi-turn environment's episode limits (``--multi-turn`` says it is one where Lab cannot), and
    fits ``sampling.max_tokens`` to the model's context."""
    models, context_length = _usable_models(client, args.model)
    env_args, multi_turn, judge = _environment_facts(client, args.environment)
    text = spec_template(
        model=args.model, env=args.environment, models=models, env_args=env_args, judge=judge,
        multi_turn=multi_turn or args.multi_turn, context_length=context_length,
    )
    if not args.file or args.file == "-":
        sys.stdout.write(text)
        return EXIT_OK
    if os.path.exists(args.file) and not args.force:
        raise _UsageError(f"{args.file} exists; pass --force to overwrite it")
    with open(args.file, "w", encoding="utf-8") as out:
        out.write(text)
    print(f"wrote {args.file}: check it with `lab spec check {args.file}`, "
          f"run it with `lab jobs create -f {args.file} --wait`", file=sys.stderr)
    return EXIT_OK


def spec_schema(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab spec schema [--fields]``: the job spec's JSON Schema (the one served at
    ``/api/v1/schema/job-spec.json``), or with ``--fields`` a table of every key."""
    if not args.fields:
        _print_json(job_spec_json_schema())
        return EXIT_OK
    fields = spec_fields()
    if args.json:
        _print_json([{"key": f.key, "type": f.type, "default": f.default, "required": f.required,
                      "meaning": f.meaning} for f in fields])
        return EXIT_OK
    table = _table("KEY", "TYPE", "DEFAULT", "MEANING", wrap=("TYPE", "DEFAULT", "MEANING"))
    for field in fields:
        default = "required" if field.required else ("" if field.default is None else json.dumps(field.default))
        table.add_row(_text(field.key), _text(field.type), _text(default), _text(field.meaning))
    _print(table)
    return EXIT_OK
