"""The line protocol both bridge programs speak to the engine (``verifiers_taskset.Bridge``): the
verifiers bridge (``verifiers_bridge.py``) and the ``load_environment`` bridge
(``load_environment_bridge.py``).

It imports only the standard library: each bridge runs as ``python -I <bridge>.py`` with a Python
that has neither the engine nor its dependencies (torch), and where not even the bridge's own
directory is on ``sys.path``, so each loads this one file by its path
(``importlib.util.spec_from_file_location``), never the engine package.

The protocol is JSON lines: one request object per line on stdin, one answer per line on stdout,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"code", "message"[, "module"]}}``.
On start, before reading anything, a bridge writes its hello (``{"ok": true, "result": ...}``, or
the error that keeps it from serving, then it exits with status 1). A request names its operation
as ``op`` and its arguments as the other keys; an end of stdin ends the program.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import signal
import sys
import traceback
from collections.abc import Callable

SPLITS = ("train", "eval", "val")


class BridgeError(Exception):
    """A refusal answered to the engine: ``code`` is one of missing_module, unsupported (a feature Lab does not run),
    invalid_args, invalid_taskset, invalid_request, scoring_failed."""

    def __init__(self, code: str, message: str, module: str | None = None):
        super().__init__(message)
        self.code, self.module = code, module


def missing_module(error: ModuleNotFoundError, what: str) -> BridgeError:
    """The refusal for a module ``what`` (e.g. "the taskset") needs and cannot import."""
    name = error.name or str(error)
    return BridgeError("missing_module", f"{what} needs the module '{name}'", module=name)


def one_line(error: BaseException) -> str:
    """An error as one line of at most 500 characters, its type first."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:500]


def refusal(error: BridgeError) -> dict:
    """The answer that carries ``error``."""
    body = {"code": error.code, "message": str(error)}
    if error.module:
        body["module"] = error.module
    return {"ok": False, "error": body}


class TrainOrder:
    """Which item the ``train`` split reads at a position: one shuffled order of its ``size`` items
    per pass over them (``random.Random(f"{seed}:{pass}")``), positions past the end wrapping into
    the next pass; each order is kept once drawn."""

    def __init__(self):
        self._orders: dict[tuple[int, int], list[int]] = {}

    def index(self, position: int, size: int, seed: int) -> int:
        rounds, offset = divmod(position, size)
        key = (seed, rounds)
        if key not in self._orders:
            order = list(range(size))
            random.Random(f"{seed}:{rounds}").shuffle(order)
            self._orders[key] = order
        return self._orders[key][offset]


def answer(handler, request: dict, *, operations: tuple[str, ...], refused: tuple[str, ...] = (), what: str) -> dict:
    """Answer one request with the handler's method of its ``op`` (one of ``operations``; one of
    ``refused`` is ``unsupported``, any other ``invalid_request``). A BridgeError is answered as
    it says, a missing module as ``missing_module`` (``what`` needs it), any other exception (the
    package's own code) as ``invalid_taskset``, its traceback on stderr: the bridge keeps serving."""
    try:
        operation = request.get("op")
        arguments = {key: value for key, value in request.items() if key != "op"}
        if operation not in operations:
            raise BridgeError("unsupported" if operation in refused else "invalid_request", f"unknown op {operation!r}")
        method = getattr(handler, operation)
        try:
            inspect.signature(method).bind(**arguments)
        except TypeError as error:
            raise BridgeError("invalid_request", f"{operation}: {error}") from None
        return {"ok": True, "result": method(**arguments)}
    except BridgeError as error:
        return refusal(error)
    except ModuleNotFoundError as error:
        return refusal(missing_module(error, what))
    except Exception as error:  # the package's code failed: say what, keep serving
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": {"code": "invalid_taskset", "message": one_line(error)}}


def die_with_parent() -> None:
    """Have Linux kill this process when the engine that started it dies, however it dies
    (``PR_SET_PDEATHSIG``); an engine already gone ends it now."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def serve(
    start: Callable[[str | None], object], *, description: str, site_help: str, operations: tuple[str, ...],
    refused: tuple[str, ...] = (), what: str, argv: list[str] | None = None,
) -> int:
    """Run a bridge: parse ``--site`` (``site_help`` describes it), build the handler with
    ``start(site)`` and write its ``hello()``, then answer requests from stdin (see ``answer``)
    until it ends and ``close()`` the handler; return the exit status (1 when the handler could
    not start). Whatever the handler prints goes to stderr: stdout carries the protocol only."""
    if sys.platform == "linux":
        die_with_parent()
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--site", help=site_help)
    options = parser.parse_args(argv)
    output = sys.stdout
    sys.stdout = sys.stderr  # a package's prints must not break the protocol
    try:
        handler = start(options.site)
        hello = {"ok": True, "result": handler.hello()}
    except BridgeError as error:
        hello = {"ok": False, "error": {"code": error.code, "message": str(error)}}
        handler = None
    except ModuleNotFoundError as error:
        hello = {"ok": False, "error": {"code": "missing_module", "message": f"the bridge needs the module '{error.name}'", "module": error.name}}
        handler = None
    output.write(json.dumps(hello) + "\n")
    output.flush()
    if handler is None:
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as error:
            reply = {"ok": False, "error": {"code": "invalid_request", "message": f"not a JSON object: {error}"}}
        else:
            reply = answer(handler, request, operations=operations, refused=refused, what=what)
        output.write(json.dumps(reply) + "\n")
        output.flush()
    handler.close()
    return 0
