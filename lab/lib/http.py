"""The one hardened client for outgoing HTTP to addresses users give us (webhook receivers).

What it guarantees, whatever the URL says:

- only ``http``/``https`` URLs with a host, at most 2,048 characters, no user:password part;
- the host is resolved once per new connection and *every* address is checked; loopback,
  private, shared (CGNAT), link-local, multicast, reserved, unspecified and cloud-metadata
  addresses are refused (``allow_private`` lets loopback/private/shared ones through for local
  development; metadata, link-local, multicast and reserved stay refused). The socket is then
  opened to the address that was checked, so a DNS answer that changes between the check and
  the connection (DNS rebinding) cannot redirect the request. TLS still verifies the
  certificate against the URL's host name (SNI and ``Host`` are unchanged);
- no redirects, no proxies from the environment, a timeout on every phase and on the whole
  request, and at most ``max_excerpt`` bytes of the response body read;
- logs carry the URL's scheme and host only (``https://hooks.example.com/…``), never a path,
  query or header value, since those often hold secrets.

Errors: ``UnsafeURL`` (the URL or its addresses are refused: no request was sent) and
``RequestFailed`` (network error or timeout; ``timed_out`` says which). HTTP error statuses are
not exceptions: the caller reads ``Response.status_code``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import certifi
import httpcore
import httpx

logger = logging.getLogger(__name__)

MAX_URL_LENGTH = 2048

#: Cloud instance-metadata services (AWS/GCP/Azure/OpenStack, AWS IPv6, Alibaba, Oracle legacy).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
# The shared address space (RFC 6598) is not "private" to Python but is not the public internet.
_SHARED = ipaddress.ip_network("100.64.0.0/10")


class UnsafeURL(ValueError):
    """The URL, or an address its host resolves to, is refused; nothing was sent.

    ``code`` is one of ``invalid_url``, ``url_too_long``, ``unsupported_scheme``,
    ``private_address``, ``blocked_address``; ``message`` says why in words (URL masked).
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class RequestFailed(Exception):
    """The request could not complete: connection refused or reset, TLS error, or timeout."""

    def __init__(self, message: str, *, timed_out: bool = False, duration_ms: int = 0):
        super().__init__(message)
        self.message = message
        self.timed_out = timed_out
        self.duration_ms = duration_ms


@dataclass(frozen=True)
class Response:
    """What came back: status, headers, the first bytes of the body, and the time taken (ms)."""

    status_code: int
    headers: Mapping[str, str]
    excerpt: str
    duration_ms: int


def mask_url(url: str) -> str:
    """Return ``url`` reduced to scheme and host (``https://hooks.example.com/…``) for logs."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
    except ValueError:
        return "<invalid url>"
    return f"{parts.scheme}://{host}/…"


def address_problem(address: ipaddress.IPv4Address | ipaddress.IPv6Address, *, allow_private: bool) -> str | None:
    """Return why ``address`` may not be connected to (``private_address``/``blocked_address``), or None.

    IPv4-mapped IPv6 addresses (``::ffff:127.0.0.1``) are judged as the IPv4 address they carry.
    """
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA_ADDRESSES:
        return "blocked_address"
    if address.is_multicast or address.is_unspecified or address.is_link_local:
        return "blocked_address"
    if address.is_loopback:
        return None if allow_private else "private_address"
    if address.is_reserved:
        return "blocked_address"
    if address.is_global and not (isinstance(address, ipaddress.IPv4Address) and address in _SHARED):
        return None
    if address.is_loopback or address.is_private or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED):
        return None if allow_private else "private_address"
    # Anything else that is not global (documentation ranges, 6to4 relays, ...) stays refused.
    return "blocked_address"


_NOT_IN_URLS = frozenset('<>"{}|\\^`')


def check_url(url: str, *, allow_private: bool, resolve: bool = True) -> None:
    """Refuse ``url`` unless it may be requested; raise ``UnsafeURL`` with the reason.

    Checks scheme, length, host and user-info, then the host's addresses: a literal IP always,
    a name when ``resolve`` (a name that does not resolve now is accepted; it is checked again on
    every connection).
    """
    if not isinstance(url, str) or not url:
        raise UnsafeURL("invalid_url", "The URL must be a non-empty string.")
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeURL("url_too_long", f"The URL is longer than {MAX_URL_LENGTH} characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise UnsafeURL("invalid_url", "The URL cannot be parsed.") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeURL("unsupported_scheme", "The URL must start with http:// or https://.")
    if not host:
        raise UnsafeURL("invalid_url", "The URL has no host.")
    if parts.username is not None or parts.password is not None:
        raise UnsafeURL("invalid_url", "The URL may not contain a user name or password.")
    if any(ord(char) < 33 or ord(char) == 127 or 0xD800 <= ord(char) <= 0xDFFF for char in url):
        raise UnsafeURL("invalid_url", "The URL may not contain spaces, control characters or lone surrogates.")
    outside_host = url.replace(parts.netloc, "", 1)
    if any(not char.isascii() or char in _NOT_IN_URLS for char in outside_host):
        # RFC 3986: only the host may be an internationalized name; the rest is percent-encoded.
        raise UnsafeURL(
            "invalid_url", 'Outside its host the URL must be ASCII without <>"{}|\\^` (percent-encode other characters).'
        )
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    elif resolve:
        try:
            addresses = resolve_host(host, port or (443 if parts.scheme == "https" else 80))
        except UnicodeError:
            raise UnsafeURL("invalid_url", "The URL's host is not a valid host name.") from None
        except OSError:
            return
    else:
        return
    _refuse_addresses(host, addresses, allow_private=allow_private)


def resolve_host(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Return every address ``host`` resolves to (TCP), in the resolver's order; OSError if none."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise OSError(f"{host} has no addresses")
    return found


def _refuse_addresses(host: str, addresses, *, allow_private: bool) -> None:
    for address in addresses:
        problem = address_problem(address, allow_private=allow_private)
        if problem == "private_address":
            raise UnsafeURL(problem, f"{host} resolves to a private or loopback address ({address}).")
        if problem:
            raise UnsafeURL(problem, f"{host} resolves to a refused address ({address}).")


class _GuardedBackend(httpcore.SyncBackend):
    """Resolve, check every address, then connect to a checked one (defeats DNS rebinding)."""

    def __init__(self, *, allow_private: bool):
        self.allow_private = allow_private

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = resolve_host(host, port)
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(f"cannot resolve host: {exc.__class__.__name__}") from None
        _refuse_addresses(host, addresses, allow_private=self.allow_private)
        last_error: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(str(address), port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last_error = exc
        assert last_error is not None
        raise last_error


class _GuardedTransport(httpx.HTTPTransport):
    """httpx's transport with its connection pool opened through ``_GuardedBackend``."""

    def __init__(self, *, allow_private: bool, max_connections: int):
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl.create_default_context(cafile=certifi.where()),
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
            network_backend=_GuardedBackend(allow_private=allow_private),
        )


@dataclass
class SafeClient:
    """A pooled, thread-safe client for user-given URLs (see the module docstring).

    ``timeout`` (seconds) bounds each phase and the whole request; ``max_excerpt`` (bytes) is how
    much of a response body is read and kept.
    """

    timeout: float = 15.0
    allow_private: bool = False
    max_excerpt: int = 2048
    max_connections: int = 64
    user_agent: str = "Lab-Webhooks/1"
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._client = httpx.Client(
            transport=_GuardedTransport(allow_private=self.allow_private, max_connections=self.max_connections),
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(self.timeout),
            # identity: the excerpt is read raw, and a compressed answer cannot expand in memory.
            headers={"User-Agent": self.user_agent, "Accept-Encoding": "identity"},
        )

    def close(self) -> None:
        """Close pooled connections."""
        self._client.close()

    def post(self, url: str, *, content: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``content`` to ``url``; return the Response whatever its status.

        Raises UnsafeURL (nothing sent) or RequestFailed (network error or timeout).
        """
        check_url(url, allow_private=self.allow_private, resolve=False)
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            with self._client.stream("POST", url, content=content, headers=dict(headers)) as response:
                body = bytearray()
                for chunk in response.iter_raw():
                    body.extend(chunk)
                    if len(body) >= self.max_excerpt:
                        break
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the whole request took too long")
                status = response.status_code
                response_headers = dict(response.headers)
        except UnsafeURL:
            raise
        except httpx.TimeoutException as exc:
            duration_ms = int((time.monotonic() - started) * 1000)
            logger.info("outgoing request timed out", extra={"url": mask_url(url), "duration_ms": duration_ms})
            raise RequestFailed(
                f"timed out after {duration_ms} ms ({type(exc).__name__})", timed_out=True, duration_ms=duration_ms
            ) from None
        except httpx.HTTPError as exc:
            duration_ms = int((time.monotonic() - started) * 1000)
            reason = _describe(exc)
            logger.info("outgoing request failed", extra={"url": mask_url(url), "error": reason})
            raise RequestFailed(reason, duration_ms=duration_ms) from None
        duration_ms = int((time.monotonic() - started) * 1000)
        if duration_ms > self.timeout * 1000:
            raise RequestFailed(f"timed out after {duration_ms} ms", timed_out=True, duration_ms=duration_ms)
        # PostgreSQL text cannot hold NUL characters; the excerpt is for people to read.
        excerpt = bytes(body[: self.max_excerpt]).decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        return Response(status_code=status, headers=response_headers, excerpt=excerpt, duration_ms=duration_ms)


def _describe(exc: httpx.HTTPError) -> str:
    """Return a short description of a network error with no URL in it."""
    kind = {
        httpx.ConnectError: "connection failed",
        httpx.RemoteProtocolError: "the receiver broke the HTTP protocol",
        httpx.ReadError: "reading the answer failed",
        httpx.WriteError: "sending the request failed",
    }
    for cls, words in kind.items():
        if isinstance(exc, cls):
            detail = str(exc).split("\n", 1)[0][:200]
            return f"{words}: {detail}" if detail else words
    return type(exc).__name__
