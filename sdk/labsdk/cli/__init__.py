"""The ``lab`` command line: jobs, spec checks and catalogues from a terminal or a script.

Tables for people; ``--json`` on every command for scripts. Lab is found through
``LAB_BASE_URL`` and ``LAB_API_KEY``. Exit status: 0 done, 1 refused or failed (the server's
message on stderr, never a traceback; ``jobs wait`` also when the job did not succeed),
2 bad usage, 130 interrupted, 141 when the reader of its output went away (``| head``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from labsdk.cli._options import _repeats_first_problem, _UsageError
from labsdk.cli._output import EXIT_FAILED, EXIT_INTERRUPTED, _report_problems
from labsdk.cli.parser import build_parser
from labsdk.client import Lab
from labsdk.errors import LabError
from labsdk.secrets import SecretsError

#: The status of a command whose output's reader closed early (128 + SIGPIPE, as a shell reports it).
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lab`` command line with ``argv`` (default ``sys.argv[1:]``); return the
    exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    clients: list[Lab] = []

    def client() -> Lab:
        if not clients:
            clients.append(Lab())
        return clients[0]

    try:
        return args.handler(args, client)
    except LabError as exc:
        suffix = f" ({exc.code})" if exc.code else ""
        if _repeats_first_problem(exc):  # list each problem once, under a count
            count = len(exc.errors)
            print(f"error: {count} problem{'s' if count > 1 else ''}{suffix}", file=sys.stderr)
        else:
            print(f"error: {exc.message}{suffix}", file=sys.stderr)
        _report_problems(exc.errors)
        return EXIT_FAILED
    except SecretsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except _UsageError as exc:
        parser.error(str(exc))
    except BrokenPipeError:  # the reader went away (``lab ... | head``): stop quietly, as other commands do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename}" if exc.filename else f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for opened in clients:
            opened.close()
