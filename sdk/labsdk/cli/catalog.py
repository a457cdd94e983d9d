"""``lab models``, ``lab envs``, ``lab prices``, ``lab usage`` and ``lab billing``: what a job
can name and what it costs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from labsdk.cli._output import EXIT_OK, _print, _print_json, _table, _text
from labsdk.client import Lab


def models(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab models``: the model catalogue."""
    found = client().models.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("ID", "CONTEXT", "PARAMETERS", "DESCRIPTION", wrap=("DESCRIPTION",))
    for model in found:
        table.add_row(_text(model.id), _text(model.context_length), _text(model.parameters), _text(model.description))
    _print(table)
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
    for label, value in (
        ("id", environment.id), ("kind", environment.kind), ("version", environment.version),
        ("sha256", environment.sha256), ("size_bytes", environment.size_bytes),
        ("entry_point", environment.entry_point), ("verifiers", environment.verifiers_version),
        ("dependencies", ", ".join(environment.dependencies)), ("pushed_by", environment.pushed_by),
        ("created_at", environment.created_at.strftime("%Y-%m-%dT%H:%M:%SZ") if environment.created_at else None),
        ("description", environment.description),
        *_build_rows(environment.build),
    ):
        print(f"{label + ':':14}{'' if value is None else value}")


def _build_rows(build) -> list[tuple[str, Any]]:
    """``lab envs info``'s lines for the version's latest build: its status, then what loading it
    found (``load_environment``'s parameters with their defaults, the reward functions and weights)."""
    if build is None:
        return []
    finished = f" at {build.finished_at:%Y-%m-%dT%H:%M:%SZ}" if build.finished_at else ""
    parameters = ", ".join(
        f"{parameter['name']} ({parameter.get('type') or 'any'}, required)" if parameter.get("required")
        else f"{parameter['name']}={json.dumps(parameter.get('default'), ensure_ascii=False)} ({parameter.get('type') or 'any'})"
        for parameter in build.parameters
    )
    rewards = ", ".join(f"{function['name']} (weight {function.get('weight')})" for function in build.reward_functions)
    return [
        ("build", f"{build.number} {build.status}{finished}"),
        *([("build_error", build.error)] if build.error else []),
        *([("api", f"{build.api} ({build.environment_class})" if build.environment_class else build.api)] if build.api else []),
        *([("parameters", parameters)] if parameters else []),
        *([("rewards", rewards)] if rewards else []),
        *([("dataset_size", build.dataset_size)] if build.dataset_size is not None else []),
        *([("secrets", ", ".join(build.secrets))] if build.secrets else []),
    ]


def envs_push(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs push WHEEL``: upload an environment wheel for the organization; prints its id."""
    environment = client().environments.push(args.wheel)
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
