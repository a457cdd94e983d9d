"""``lab sandboxes``: create, list, inspect, run commands in, read the logs of and delete a project's
sandboxes; ``add_sandboxes_parser`` adds its commands to the CLI's parser."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labsdk.cli._output import EXIT_FAILED, EXIT_OK, _print, _print_json, _table, _text, _when
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
    """``lab sandboxes delete [ID ...] [--label K=V ...]``: stop the sandboxes named and the active
    ones with every label given, deleting their files; prints each id deleted, and each id not
    found on stderr (then exits 1)."""
    labels = dict(item.split("=", 1) if "=" in item else (item, "") for item in args.label or [])
    if not args.ids and not labels:
        print("error: name sandbox ids, --label K=V or both", file=sys.stderr)
        return EXIT_FAILED
    result = client().sandboxes.bulk_delete(args.ids, labels=labels or None)
    if args.json:
        _print_json(result)
    else:
        for sandbox_id in result.deleted:
            print(f"{sandbox_id} deleted")
        for sandbox_id in result.not_found:
            print(f"{sandbox_id} not found", file=sys.stderr)
    return EXIT_FAILED if result.not_found else EXIT_OK


def sandboxes_logs(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes logs ID``: print what a sandbox's commands printed (the last 256 KiB), an ended one's too."""
    logs = client().sandboxes.logs(args.id)
    if args.json:
        _print_json(logs)
        return EXIT_OK
    if logs.truncated:
        print("(earlier output was dropped: the log keeps the last 256 KiB)", file=sys.stderr)
    sys.stdout.write(logs.logs)
    sys.stdout.flush()
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


def add_sandboxes_parser(commands, json_flag: argparse.ArgumentParser) -> None:
    """Add ``lab sandboxes`` and its commands to the CLI's subcommands ``commands``."""
    sandboxes = commands.add_parser(
        "sandboxes", parents=[json_flag], help="isolated sandboxes: create, list, run commands, read logs, delete",
        epilog="Commands and files: docs/sandboxes.md; the SDK's lab.sandboxes also uploads and downloads files.",
    )
    sandboxes.set_defaults(handler=sandboxes_list, label=None)
    sandbox_commands = sandboxes.add_subparsers(dest="sandbox_command", metavar="COMMAND")
    listing = sandbox_commands.add_parser("list", parents=[json_flag], help="the project's sandboxes, newest first")
    listing.add_argument("--label", action="append", metavar="K=V", help="only those with this label (repeatable)")
    listing.set_defaults(handler=sandboxes_list)
    create = sandbox_commands.add_parser("create", parents=[json_flag], help="create a sandbox; prints its id")
    create.add_argument("--image", default="python:3.11", help="image (default python:3.11)")
    create.add_argument("--name", default="", help="a name for people")
    create.add_argument("--cpu", type=float, help="CPU cores")
    create.add_argument("--memory-gb", type=float, help="memory, GB")
    create.add_argument("--disk-gb", type=float, help="disk, GB")
    create.add_argument("--timeout", type=int, help="lifetime, seconds")
    create.add_argument("--label", action="append", metavar="K=V", help="a label (repeatable)")
    create.set_defaults(handler=sandboxes_create)
    for name, help_text, handler in (("get", "show one sandbox", sandboxes_get),
                                     ("logs", "print what a sandbox's commands printed", sandboxes_logs)):
        command = sandbox_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="sandbox id (sbx_...)")
        command.set_defaults(handler=handler)
    delete = sandbox_commands.add_parser("delete", parents=[json_flag], help="stop sandboxes and delete their files: by id, by label or both")
    delete.add_argument("ids", nargs="*", metavar="ID", help="sandbox ids (sbx_...)")
    delete.add_argument("--label", action="append", metavar="K=V", help="also every active sandbox with this label (repeatable: all of them)")
    delete.set_defaults(handler=sandboxes_delete)
    run = sandbox_commands.add_parser("run", parents=[json_flag], help="run a command in a sandbox; exits with its exit code")
    run.add_argument("id", help="sandbox id (sbx_...)")
    run.add_argument("--timeout", type=float, help="seconds before it is killed (default 60)")
    run.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command (one string runs under sh -c)")
    run.set_defaults(handler=sandboxes_run)
