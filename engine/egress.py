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
"""

from __future__ import annotations

import json
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
