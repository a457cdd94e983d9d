"""The engine's way out of a sandbox with no network: HTTP to named origins over Unix sockets.

The local launcher runs the engine in a network namespace of its own (docs/local-launcher.md
"Isolation"): it reaches nothing but its own loopback. For each origin the engine must reach
(Lab's ingest URL, the object store's signed URLs) the launcher's supervisor, outside, listens on
a Unix socket the sandbox can see and relays each connection to that origin's host and port.
``LAB_ENGINE_EGRESS`` hands the engine the map, a JSON object
``{"<scheme>://<host>:<port>": "<socket path>"}``; ``transport()`` builds an httpx transport that
sends a request for a mapped origin through its socket (TLS, when the scheme is https, still runs
end to end with the origin's host name) and every other request the usual way, which inside the
sandbox reaches only its own loopback (the roles of a split engine, vLLM's own processes).

Endpoints the environment's own code calls (a judge the job declares, ``[[env]] judge``) are
served on the sandbox's loopback instead (``LAB_ENGINE_FORWARDS``, ``serve_forwards``), at their
own address and port, so any client library reaches them by their own URL.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Mapping

import httpx

from engine.config import environment

#: The variable the launcher sets; absent or empty outside a sandbox.
EGRESS_VARIABLE = "LAB_ENGINE_EGRESS"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str | httpx.URL) -> str:
    """Return ``<scheme>://<host>:<port>`` of ``url``, with the scheme's default port made explicit."""
    parsed = httpx.URL(str(url))
    port = parsed.port or _DEFAULT_PORTS.get(parsed.scheme, 0)
    return f"{parsed.scheme}://{parsed.host}:{port}"


class EgressTransport(httpx.BaseTransport):
    """Sends requests for the origins of ``routes`` (origin -> Unix socket path) through their
    sockets, and everything else through a plain transport."""

    def __init__(self, routes: Mapping[str, str]):
        self._routes = {origin: httpx.HTTPTransport(uds=path) for origin, path in routes.items()}
        self._default = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through its origin's socket, or the plain way when it has none."""
        return self._routes.get(origin_of(request.url), self._default).handle_request(request)

    def close(self) -> None:
        """Close every connection pool."""
        for transport in (*self._routes.values(), self._default):
            transport.close()


def routes(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the origin -> socket map of ``LAB_ENGINE_EGRESS`` in ``environ`` (default the process
    environment); empty when unset. Raises ValueError for a value that is not such a JSON object."""
    raw = (environment() if environ is None else environ).get(EGRESS_VARIABLE, "")
    if not raw:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{EGRESS_VARIABLE} must be a JSON object of origin -> socket path")
    return {origin_of(origin): path for origin, path in value.items()}


def transport(environ: Mapping[str, str] | None = None) -> httpx.BaseTransport | None:
    """Return an ``EgressTransport`` when the engine runs in a sandbox with egress sockets, else
    None (httpx's own transport)."""
    mapped = routes(environ)
    return EgressTransport(mapped) if mapped else None


#: The variable the launcher sets for endpoints the environment's own code reaches (a judge's,
#: declared by the job): JSON ``{"<scheme>://<host>:<port>": "<socket path>"}``.
FORWARDS_VARIABLE = "LAB_ENGINE_FORWARDS"
#: Bytes copied per read between a forwarded connection and its socket.
_CHUNK = 65536


class ForwardRefused(ValueError):
    """An endpoint cannot be served on the sandbox's loopback; the message says why and what to do."""


def forwards(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the origin -> socket map of ``LAB_ENGINE_FORWARDS`` (default the process
    environment); empty when unset. Raises ValueError for a value that is not such a JSON object."""
    raw = (environment() if environ is None else environ).get(FORWARDS_VARIABLE, "")
    if not raw:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{FORWARDS_VARIABLE} must be a JSON object of origin -> socket path")
    return {origin_of(origin): path for origin, path in value.items()}


def serve_forwards(routes: Mapping[str, str]) -> list[socket.socket]:
    """Listen, inside the sandbox, at each origin's own address and port, and copy every
    connection to and from that origin's egress socket (the supervisor relays it on to the
    address it pinned at launch); return the listening sockets.

    So environment code calls a declared endpoint by its own URL with any HTTP client: the host
    resolves through the sandbox's ``/etc/hosts`` (the launcher maps a host name to a loopback
    address of its own), and TLS still runs end to end with the host's name. Every other address
    stays unreachable: the sandbox's network namespace holds nothing but its loopback.
    Raises ForwardRefused for an origin that cannot be served so (a port below 1024, which an
    unprivileged process cannot bind; an address that is not the sandbox's own)."""
    listeners = []
    for origin, path in routes.items():
        url = httpx.URL(origin)
        host, port = url.host, url.port or _DEFAULT_PORTS.get(url.scheme, 0)
        if port < 1024:
            raise ForwardRefused(
                f"the judge endpoint {origin} cannot be reached from the local launcher's sandbox: its port is below 1024, "
                "which the sandbox cannot serve; give the endpoint on a port of 1024 or above, or run the engine "
                "without the sandbox (LAB_LOCAL_ISOLATION=none) or on the pool"
            )
        served, failure = [], None
        try:
            addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            addresses, failure = [], error
        # Every address the name has here (localhost: 127.0.0.1 and ::1), as a client may try any.
        for family, address in dict.fromkeys((found[0], found[4][:2]) for found in addresses):
            listener = socket.socket(family, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(address)
                listener.listen(64)
            except OSError as error:
                listener.close()
                failure = error
                continue
            threading.Thread(target=_accept, args=(listener, path), name=f"forward {origin}", daemon=True).start()
            served.append(listener)
        if not served:
            reason = getattr(failure, "strerror", None) or failure
            raise ForwardRefused(
                f"the judge endpoint {origin} cannot be reached from the local launcher's sandbox ({reason}): "
                "name it by a host name, or by a loopback address, not by another address"
            )
        listeners += served
    return listeners


def _accept(listener: socket.socket, path: str) -> None:
    """Hand each connection ``listener`` takes to a thread that joins it to ``path``."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_join, args=(client, path), daemon=True).start()


def _join(client: socket.socket, path: str) -> None:
    """Copy bytes both ways between ``client`` and the Unix socket ``path`` until both ends
    close, then close both."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
    back.start()
    _copy(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _copy(source: socket.socket, target: socket.socket) -> None:
    """Copy ``source`` into ``target`` until ``source`` ends (or fails), then end ``target``'s writing side."""
    try:
        while chunk := source.recv(_CHUNK):
            target.sendall(chunk)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass
