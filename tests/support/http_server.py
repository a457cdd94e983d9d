"""A test's HTTP server on a thread of its own (the edge-of-the-world peers: Stripe, a model hub,
an OpenAI-compatible endpoint, a webhook receiver, Lab's download API)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from socketserver import BaseServer

#: How often the serving thread looks for a shutdown request (s): shutdown() waits up to this long,
#: where socketserver's default of 0.5 s would add half a second to every test that stops one.
POLL_INTERVAL_S = 0.02


def start(server: BaseServer) -> threading.Thread:
    """Serve ``server`` on a daemon thread until ``stop(server)``; return the thread."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_INTERVAL_S}, daemon=True)
    thread.start()
    return thread


def stop(server: BaseServer) -> None:
    """Stop serving ``server`` (within POLL_INTERVAL_S) and close its socket."""
    server.shutdown()
    server.server_close()


@contextmanager
def serving(server: BaseServer) -> Iterator[BaseServer]:
    """``server`` served on a thread for the ``with`` block, stopped and closed after it."""
    start(server)
    try:
        yield server
    finally:
        stop(server)
