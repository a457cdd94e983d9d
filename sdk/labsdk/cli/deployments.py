"""``lab deploy`` and ``lab deployments``: serve checkpoints, adapters and models behind Lab's
OpenAI-compatible API (docs/serving.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labsdk._deployments import Deployment
from labsdk.cli._output import EXIT_OK, _print, _print_json, _table, _text, _when
from labsdk.client import Lab


def _show(deployment: Deployment) -> None:
    reason = f" ({deployment.status_reason})" if deployment.status_reason else ""
    print(f"{deployment.id} {deployment.status}{reason} model={deployment.name} source={deployment.source.type}:{deployment.source.id} "
          f"mode={deployment.mode} server={deployment.server_status or '-'} requests={deployment.usage.requests} "
          f"tokens={deployment.usage.prompt_tokens}+{deployment.usage.completion_tokens} cost=${deployment.usage.cost_usd}")
    print(f"base_url={deployment.openai_base_url}")


def deploy(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab deploy CKPT_OR_ADAPTER_OR_MODEL [--name N] [--wait]``: prints the deployment's id, then
    the model name and base_url OpenAI clients use."""
    lab = client()
    deployment = lab.deployments.create(args.source, name=args.name, type=args.type)
    if args.wait:
        print(f"{deployment.id} deploying {deployment.name} ...", file=sys.stderr)
        deployment = lab.deployments.wait(deployment.id, timeout=args.timeout)
    if args.json:
        _print_json(deployment)
        return EXIT_OK
    print(deployment.id)
    print(f"model={deployment.name} status={deployment.status} base_url={deployment.openai_base_url}", file=sys.stderr)
    return EXIT_OK


def deployments_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab deployments [list] [--status S]``: the project's deployments, newest first."""
    deployments = client().deployments.list(status=args.status)
    if args.json:
        _print_json(deployments)
        return EXIT_OK
    table = _table("ID", "MODEL", "STATUS", "SOURCE", "SERVER", "REQUESTS", "CREATED", wrap=("MODEL", "CREATED"))
    for deployment in deployments:
        table.add_row(_text(deployment.id), _text(deployment.name), _text(deployment.status), _text(deployment.source.id),
                      _text(deployment.server_status or "-"), _text(deployment.usage.requests), _when(deployment.created_at))
    _print(table)
    return EXIT_OK


def deployments_get(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab deployments get ID``: one deployment."""
    deployment = client().deployments.get(args.id)
    if args.json:
        _print_json(deployment)
    else:
        _show(deployment)
    return EXIT_OK


def deployments_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab deployments delete ID``: take it off its server (its server stops once empty)."""
    deployment = client().deployments.delete(args.id)
    if args.json:
        _print_json(deployment)
    else:
        print(f"{deployment.id} {deployment.status}")
    return EXIT_OK
