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


def spec_init(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab spec init [FILE] [--model M] [--environment E] [--force]``: write a commented spec template
    (to stdout without FILE) that passes ``lab spec check`` as written."""
    text = spec_template(model=args.model, env=args.environment)
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
