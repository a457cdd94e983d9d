"""``lab sandboxes``: create, list, inspect, run commands in and delete a project's sandboxes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labsdk.cli._output import EXIT_OK, _print, _print_json, _table, _text, _when
from labsdk.client import Lab


def sandboxes_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes [list] [--label K=V ...]``: the project's sandboxes, newest first."""
    labels = dict(item.split("=", 1) for item in args.label or [])
    sandboxes = client().sandboxes.list(labels=labels or None)
    if args.json:
        _print_json(sandboxes)
        return EXIT_OK
    table = _table("ID", "NAME", "STATUS", "IMAGE", "LABELS", "CREATED", wrap=("LABELS", "CREATED"))
    for sandbox in sandboxes:
        table.add_row(_text(sandbox.id), _text(sandbox.name), _text(sandbox.status), _text(sandbox.image),
                      _text(" ".join(f"{key}={value}" for key, value in sandbox.labels.items())), _when(sandbox.created_at))
    _print(table)
    return EXIT_OK


def sandboxes_create(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes create [--image I] [--timeout S] [--label K=V ...]``: prints the new sandbox's id."""
    sandbox = client().sandboxes.create(
        image=args.image, name=args.name, cpu_cores=args.cpu, memory_gb=args.memory_gb, disk_gb=args.disk_gb,
        timeout_s=args.timeout, labels=dict(item.split("=", 1) for item in args.label or []) or None,
    )
    if args.json:
        _print_json(sandbox)
        return EXIT_OK
    for warning in sandbox.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(sandbox.id)
    return EXIT_OK


def sandboxes_get(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes get ID``: one sandbox."""
    sandbox = client().sandboxes.get(args.id)
    if args.json:
        _print_json(sandbox)
    else:
        print(f"{sandbox.id} {sandbox.status} {sandbox.image} cpu={sandbox.cpu_cores} memory={sandbox.memory_gb}GB "
              f"disk={sandbox.disk_gb}GB lifetime={sandbox.timeout_s}s created {_when(sandbox.created_at)}")
    return EXIT_OK


def sandboxes_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes delete ID``: stop it and delete its files."""
    client().sandboxes.delete(args.id)
    print(f"{args.id} deleted")
    return EXIT_OK


def sandboxes_run(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes run ID -- COMMAND ...``: run a command, print its output as it comes (straight
    from the sandbox agent), exit with its exit code."""
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    command = command if len(command) > 1 else command[0]
    if args.json:
        _print_json(client().sandboxes.run(args.id, command, timeout_s=args.timeout))
        return EXIT_OK
    exit_code = 1
    for event in client().sandboxes.stream(args.id, command, timeout_s=args.timeout):
        if event.type in ("stdout", "stderr"):
            stream = sys.stdout if event.type == "stdout" else sys.stderr
            stream.write(event.data)
            stream.flush()
        elif event.type == "exit":
            exit_code = event.exit_code if event.exit_code is not None else 1
            if event.timed_out:
                print(f"timed out after {args.timeout or 60} s", file=sys.stderr)
    return min(exit_code, 255)
