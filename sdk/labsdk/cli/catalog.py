"""``lab models``, ``lab envs``, ``lab prices``, ``lab usage`` and ``lab billing``: what a job
can name and what it costs."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labsdk.cli._output import EXIT_OK, _print, _print_json, _table, _text
from labsdk.cli.try_environment import package_wheel
from labsdk.client import Lab


def models(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab models [list]``: the models the organization sees (only ``ready`` ones train)."""
    found = client().models.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("ID", "STATUS", "ARCHITECTURE", "PARAMETERS", "CONTEXT", "OWNER", "DESCRIPTION", wrap=("DESCRIPTION",))
    for model in found:
        parameters = model.parameters if model.active_parameters is None else f"{model.parameters} ({model.active_parameters} active)"
        table.add_row(_text(model.id), _text(model.status), _text(model.architecture), _text(parameters),
                      _text(model.context_length), _text(model.owned_by or "everyone"), _text(model.description))
    _print(table)
    return EXIT_OK


def _print_model(model) -> None:
    build = model.build
    for label, value in (
        ("id", model.id), ("status", model.status), ("owned_by", model.owned_by or "everyone"),
        ("architecture", model.architecture), ("parameters", model.parameters),
        ("active", model.active_parameters), ("context", model.context_length),
        ("chat_template", model.chat_template), ("tool_calls", model.tool_call_format), ("modes", ", ".join(model.modes)),
        ("memory_gb", ", ".join(f"{mode} {value}" for mode, value in model.memory_gb.items())),
        ("revision", model.revision), ("size_bytes", model.size_bytes), ("licence", model.licence), ("source", model.source),
        *([("check", f"{build.number} {build.status}")] if build is not None else []),
        *([("check_error", build.error)] if build is not None and build.error else []),
        ("description", model.description),
    ):
        print(f"{label + ':':15}{'' if value is None else value}")


def models_push(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab models push DIR --name ORG/NAME [--wait]``: upload a Hugging Face model directory as
    one of the organization's models; prints it (after its check with ``--wait``)."""
    model = client().models.push(args.directory, name=args.name, wait=args.wait, timeout=args.timeout)
    if args.json:
        _print_json(model)
    elif args.wait:
        _print_model(model)
    else:
        build = model.build
        print(f"{model.id}: check {build.number if build else '?'} {build.status if build else model.status} "
              f"(follow it with `lab models get {model.id}`, `lab models build-log {model.id}`)")
    return EXIT_OK


def models_get(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab models get ID``: one model with its latest check."""
    model = client().models.retrieve(args.id)
    if args.json:
        _print_json(model)
    else:
        _print_model(model)
    return EXIT_OK


def models_build_log(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab models build-log ID``: the log of a pushed model's latest check."""
    text = client().models.build_log(args.id)
    if not text:
        print(f"{args.id} has no check log: it was not pushed, or its check has not run (`lab models get {args.id}`)", file=sys.stderr)
        return EXIT_OK
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def _arguments(args: dict[str, Any] | None) -> str:
    """Return an environment's arguments as ``name=default`` words (values as JSON)."""
    return " ".join(f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in (args or {}).items())


def envs(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs [list]``: the built-in environments with their arguments and defaults, and the
    organization's uploaded packages with their versions and the day they were pushed (who
    pushed one: ``lab envs info``)."""
    found = client().environments.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("ID", "KIND", "ARGS", "PUSHED", "DESCRIPTION", wrap=("ARGS", "DESCRIPTION"))
    for environment in found:
        table.add_row(_text(environment.id), _text(environment.kind), _text(_arguments(environment.args)),
                      f"{environment.created_at:%Y-%m-%d}" if environment.created_at else "",
                      _text(environment.description))
    _print(table)
    return EXIT_OK


def _print_environment(environment) -> None:
    """``lab envs info``'s lines, ``label: value``, leaving out a label with no value (a Lab
    package's verifiers, a built-in's version); a built-in's ``args`` as ``lab envs`` shows them."""
    for label, value in (
        ("id", environment.id), ("kind", environment.kind), ("version", environment.version),
        ("sha256", environment.sha256), ("size_bytes", environment.size_bytes),
        ("entry_point", environment.entry_point), ("verifiers", _verifiers(environment)),
        ("dependencies", ", ".join(environment.dependencies)), ("pushed_by", environment.pushed_by),
        ("created_at", environment.created_at.strftime("%Y-%m-%dT%H:%M:%SZ") if environment.created_at else None),
        ("description", environment.description),
        ("args", _arguments(environment.args) if environment.build is None else None),  # a build's parameters say more
        *_build_rows(environment.build),
    ):
        if value is not None and value != "":
            print(f"{label + ':':14}{value}")


def _verifiers(environment) -> str | None:
    """The verifiers version the latest build installed with the package's requirement in
    parentheses (``0.3.1 (>=0.1.0)``), or the requirement alone where no build recorded one."""
    installed = environment.build.verifiers_version if environment.build is not None else None
    if not installed:
        return environment.verifiers_version
    return f"{installed} ({environment.verifiers_version})" if environment.verifiers_version else installed


def _build_rows(build) -> list[tuple[str, Any]]:
    """``lab envs info``'s lines for the version's latest build: its status, then what loading it
    found (single- or multi-turn episodes, ``load_environment``'s parameters with their defaults,
    the reward functions and weights)."""
    if build is None:
        return []
    finished = f" at {build.finished_at:%Y-%m-%dT%H:%M:%SZ}" if build.finished_at else ""
    parameters = ", ".join(
        f"{parameter['name']} ({parameter.get('type') or 'any'}, required)" if parameter.get("required")
        else f"{parameter['name']}={json.dumps(parameter.get('default'), ensure_ascii=False)} ({parameter.get('type') or 'any'})"
        for parameter in build.parameters
    )
    rewards = ", ".join(
        f"{function['name']} (weight {function.get('weight')}{', in a sandbox' if function.get('runtime') else ''})" for function in build.reward_functions
    )
    if build.api == "v1" and build.multi_turn:  # an Env's record_reward terms are known only as it plays
        rewards = f"{rewards + '; ' if rewards else ''}and the terms its episodes record (trace.record_reward)"
    return [
        ("build", f"{build.number} {build.status}{finished}"),
        *([("build_error", build.error)] if build.error else []),
        *([("api", f"{build.api} ({build.environment_class})" if build.environment_class else build.api)] if build.api else []),
        *([("episodes", "multi-turn" if build.multi_turn else "single-turn")] if build.multi_turn is not None else []),
        *([("parameters", parameters)] if parameters else []),
        *([("rewards", rewards)] if rewards else []),
        *([("dataset_size", build.dataset_size)] if build.dataset_size is not None else []),
        *([("secrets", ", ".join(build.secrets))] if build.secrets else []),
    ]


def envs_push(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs push WHEEL|FOLDER``: upload an environment wheel for the organization (a
    project folder is built into one first, as ``lab envs try`` builds it); prints its id."""
    with tempfile.TemporaryDirectory(prefix="lab-envs-push-") as scratch:
        environment = client().environments.push(package_wheel(Path(args.wheel), Path(scratch)))
    if args.json:
        _print_json(environment)
    else:
        print(environment.id)
    return EXIT_OK


def envs_info(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs info ID``: one package version (no version: the latest)."""
    environment = client().environments.retrieve(args.id)
    if args.json:
        _print_json(environment)
    else:
        _print_environment(environment)
    return EXIT_OK


def envs_build_log(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs build-log ID``: the log of the version's latest build (no version: the latest)."""
    text = client().environments.build_log(args.id)
    if not text:
        print(f"{args.id} has no build log yet: its build has not run (`lab envs info {args.id}`)", file=sys.stderr)
        return EXIT_OK
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def envs_rebuild(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs rebuild ID``: build the version again (same wheel, the package index as it is
    now); prints the new build. Refused while its latest build is queued or running."""
    lab = client()
    environment = lab.environments.retrieve(args.id)
    build = lab.environments.rebuild(environment.id)
    if args.json:
        _print_json(build)
    else:
        print(f"{environment.id}: build {build.number} {build.status} (follow it with `lab envs info {environment.id}`)")
    return EXIT_OK


def envs_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs delete ID``: delete one package version (no version: the latest); prints the
    exact version deleted. Refused while a queued or running job uses it."""
    lab = client()
    environment = lab.environments.retrieve(args.id)
    lab.environments.delete(environment.id)
    print(f"deleted {environment.id}")
    return EXIT_OK


def prices(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab prices``: the price table."""
    found = client().prices.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("RESOURCE", "USD PER HOUR", "DESCRIPTION", wrap=("DESCRIPTION",))
    for price in found:
        table.add_row(_text(price.resource_type), _text(price.usd_per_hour), _text(price.description))
    _print(table)
    return EXIT_OK


def usage(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab usage [--start --end --group-by --job]``: the project's GPU/CPU-seconds and cost."""
    rows = client().usage(start=args.start, end=args.end, group_by=args.group_by, job_id=args.job)
    if args.json:
        _print_json(rows)
        return EXIT_OK
    keys = [key for key in ("date", "resource", "job_id") if any(getattr(row, key) is not None for row in rows)]
    table = _table(*[key.upper().replace("_", " ") for key in keys], "GPU-SECONDS", "CPU-SECONDS", "COST USD")
    for row in rows:
        table.add_row(*[_text(getattr(row, key)) for key in keys], f"{row.gpu_seconds or 0:.1f}",
                      f"{row.cpu_seconds or 0:.1f}", _text(row.cost_usd))
    _print(table)
    return EXIT_OK


def billing_balance(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab billing [balance]``: plan, balance, monthly spend limit and this month's spend."""
    balance = client().billing.balance()
    if args.json:
        _print_json(balance)
        return EXIT_OK
    limit = "none" if balance.spend_limit_usd is None else f"${balance.spend_limit_usd}"
    print(f"plan:             {balance.plan}" + ("" if balance.billing_enabled else " (billing off: nothing is charged)"))
    print(f"balance:          ${balance.balance_usd}")
    print(f"spent this month: ${balance.spent_this_month_usd} (limit {limit})")
    if balance.payment_failed:
        print("payment failed:   yes (new jobs are refused until it is paid)")
    return EXIT_OK


def datasets_push(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab datasets push OWNER/NAME DIR|FILE``: push a dataset for the organization's builds and
    jobs (``load_dataset("OWNER/NAME")`` reads it, offline); prints its name and files."""
    dataset = client().datasets.push(args.name, args.path)
    if args.json:
        _print_json(dataset)
    else:
        print(f"{dataset.id}: {len(dataset.files)} file{'s' if len(dataset.files) != 1 else ''} "
              f"({', '.join(item.get('path', '?') for item in dataset.files[:5])}{', ...' if len(dataset.files) > 5 else ''})")
    return EXIT_OK


def datasets(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab datasets [list]``: the organization's pushed datasets."""
    found = client().datasets.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("NAME", "FILES", "SIZE", "UPDATED")
    for dataset in found:
        table.add_row(_text(dataset.id), _text(len(dataset.files)), _text(dataset.size_bytes), _text(dataset.updated_at))
    _print(table)
    return EXIT_OK


def datasets_get(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab datasets get OWNER/NAME``: one pushed dataset and its files."""
    dataset = client().datasets.retrieve(args.name)
    if args.json:
        _print_json(dataset)
    else:
        print(f"{dataset.id} (pushed as {dataset.filename}, {dataset.size_bytes} bytes, updated {dataset.updated_at})")
        for item in dataset.files:
            print(f"  {item.get('path')}  {item.get('size_bytes')}")
    return EXIT_OK


def datasets_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab datasets delete OWNER/NAME``: delete a pushed dataset."""
    client().datasets.delete(args.name)
    print(f"deleted {args.name}")
    return EXIT_OK
