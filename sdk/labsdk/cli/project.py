"""``lab webhooks`` and ``lab whoami``: a project's webhook endpoints and the key in use."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labsdk.cli._output import EXIT_OK, _print, _print_json, _table, _text, _when
from labsdk.client import Lab


def webhooks_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks [list]``: the project's webhook endpoints, newest first."""
    endpoints = client().webhooks.list()
    if args.json:
        _print_json(endpoints)
        return EXIT_OK
    table = _table("ID", "URL", "ENABLED", "EVENTS", "CREATED", wrap=("URL", "EVENTS", "CREATED"))
    for endpoint in endpoints:
        table.add_row(_text(endpoint.id), _text(endpoint.url), "yes" if endpoint.enabled else "no",
                      _text(" ".join(endpoint.events)), _when(endpoint.created_at))
    _print(table)
    return EXIT_OK


def webhooks_create(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks create URL [--event TYPE ...]``: an endpoint; prints its id and its secret,
    which Lab shows this once."""
    endpoint = client().webhooks.create(args.url, events=args.event or None)
    if args.json:
        _print_json(endpoint)
        return EXIT_OK
    print(f"id:     {endpoint.id}")
    print(f"url:    {endpoint.url}")
    print(f"events: {', '.join(endpoint.events)}")
    print(f"secret: {endpoint.secret}")
    print("Keep the secret now (labsdk.webhooks.verify checks signatures with it): Lab never shows it again; "
          "`lab webhooks rotate-secret ID` makes a new one.", file=sys.stderr)
    return EXIT_OK


def webhooks_test(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks test ID``: send the endpoint a ``webhook.test`` event; prints the delivery."""
    delivery = client().webhooks.test(args.id)
    if args.json:
        _print_json(delivery)
    else:
        print(f"{delivery.id} {delivery.event_type} {delivery.status}: "
              f"`lab webhooks deliveries {args.id}` shows how it went")
    return EXIT_OK


def webhooks_deliveries(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks deliveries ID [--status S]``: an endpoint's deliveries, newest first, with
    the outcome of each one's latest try."""
    deliveries = client().webhooks.deliveries(args.id, status=args.status, limit=args.limit)[:args.limit]
    if args.json:
        _print_json(deliveries)
        return EXIT_OK
    table = _table("ID", "EVENT", "STATUS", "TRIES", "LAST TRY", "CREATED", wrap=("LAST TRY", "CREATED"))
    for delivery in deliveries:
        last = delivery.attempts[-1] if delivery.attempts else None
        outcome = "" if last is None else (str(last.status_code) if last.status_code else _text(last.error))
        table.add_row(_text(delivery.id), _text(delivery.event_type), _text(delivery.status),
                      _text(delivery.attempt_count), outcome, _when(delivery.created_at))
    _print(table)
    return EXIT_OK


def webhooks_rotate_secret(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks rotate-secret ID``: a new secret, printed once; the old one signs 24 h more."""
    endpoint = client().webhooks.rotate_secret(args.id)
    if args.json:
        _print_json(endpoint)
    else:
        print(endpoint.secret)
    return EXIT_OK


def webhooks_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks delete ID``: delete an endpoint."""
    client().webhooks.delete(args.id)
    if args.json:
        _print_json({"id": args.id, "deleted": True})
    else:
        print(f"{args.id} deleted")
    return EXIT_OK


def whoami(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab whoami``: the organization, project and scopes of the API key."""
    identity = client().whoami()
    if args.json:
        _print_json(identity)
        return EXIT_OK
    organization, project = identity.organization, identity.project
    print(f"organization: {organization.slug if organization else ''} ({organization.name if organization else ''})")
    print(f"project:      {project.slug if project else ''} ({project.name if project else ''})")
    print(f"scopes:       {', '.join(identity.scopes)}")
    return EXIT_OK
