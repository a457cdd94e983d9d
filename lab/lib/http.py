"""The one hardened client for outgoing HTTP to addresses users give us (webhook receivers).

What it guarantees, whatever the URL says:

- only ``http``/``https`` URLs with a host, at most 2,048 characters, no user:password part;
- the URL is parsed once, by the client's own parser (httpx: IDNA 2008 for internationalized
  names), and what is checked is what is sent: ``check_url`` returns the parsed URL and
  ``SafeClient.post`` sends exactly that. A host that this parser refuses (``①②⑦.0.0.1``, which
  the resolver's IDNA 2003 would map to ``127.0.0.1``), that ends with a dot, or that is neither
  an IP address nor a DNS name (letters, digits, ``-`` and ``_`` in labels) is refused;
- the host is resolved once per new connection and *every* address is checked; loopback,
  private, shared (CGNAT), link-local, multicast, reserved, unspecified and cloud-metadata
  addresses are refused (``allow_private`` lets loopback/private/shared ones through for local
  development; metadata, link-local, multicast and reserved stay refused). IPv6 addresses
  that carry an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, 6to4 ``2002::/16``, Teredo
  ``2001::/32``) are judged by the IPv4 addresses they carry. The socket is then
  opened to the address that was checked, so a DNS answer that changes between the check and
  the connection (DNS rebinding) cannot redirect the request. TLS still verifies the
  certificate against the URL's host name (SNI and ``Host`` are unchanged);
- no redirects, no proxies from the environment, a timeout on every phase and on the whole
  request, and at most ``max_excerpt`` bytes of the response body read;
- logs carry the URL's scheme and host only (``https://hooks.example.com/…``), never a path,
  query or header value, since those often hold secrets.

Errors: ``UnsafeURL`` (the URL or its addresses are refused: no request was sent; ``permanent``
when the URL itself can never be sent, as opposed to a name that resolves to a refused address
now) and
``RequestFailed`` (network error or timeout; ``timed_out`` says which). HTTP error statuses are
not exceptions: the caller reads ``Response.status_code``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
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
    ``permanent`` is True when the URL as written is refused (it can never be sent under these
    rules) and False when a host name resolves to a refused address now (DNS may change).
    """

    def __init__(self, code: str, message: str, *, permanent: bool = True):
        super().__init__(message)
        self.code = code
        self.message = message
        self.permanent = permanent


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


def embedded_ipv4(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Return the IPv4 addresses an IPv6 address carries: IPv4-mapped (RFC 4291), 6to4 (RFC 3056)
    or Teredo server and client (RFC 4380); none for any other address."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    return []


def address_problem(address: ipaddress.IPv4Address | ipaddress.IPv6Address, *, allow_private: bool) -> str | None:
    """Return why ``address`` may not be connected to (``private_address``/``blocked_address``), or None.

    An IPv6 address carrying IPv4 addresses (``::ffff:127.0.0.1``, 6to4 ``2002:a9fe:a9fe::``,
    Teredo) is judged by them: refused when any of them is (the worst reason wins).
    """
    carried = embedded_ipv4(address)
    if carried:
        problems = {address_problem(inner, allow_private=allow_private) for inner in carried}
        for problem in ("blocked_address", "private_address"):
            if problem in problems:
                return problem
        return None
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
#: A DNS name as the client sends it (after IDNA): labels of letters, digits, ``-`` and ``_``.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*", re.I)


def check_url(url: str, *, allow_private: bool, resolve: bool = True) -> httpx.URL:
    """Refuse ``url`` unless it may be requested; raise ``UnsafeURL`` with the reason.

    Checks scheme, length, host and user-info, then the host as the client sends it (parsed by
    httpx, so with its IDNA 2008 rules), then the host's addresses: a literal IP always, a name
    when ``resolve`` (a name that does not resolve now is accepted; it is checked again on every
    connection). Returns the parsed URL, which is what ``SafeClient.post`` sends.
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
    target, host = _parse_for_sending(url)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        _refuse_addresses(host, [literal], allow_private=allow_private, permanent=True)
        return target
    if host.endswith("."):
        raise UnsafeURL("invalid_url", "The URL's host may not end with a dot.")
    if not _HOST_NAME.fullmatch(host):
        raise UnsafeURL("invalid_url", "The URL's host is not a valid host name.")
    if resolve:
        try:
            addresses = resolve_host(host, port or (443 if parts.scheme == "https" else 80))
        except (OSError, UnicodeError):
            return target
        _refuse_addresses(host, addresses, allow_private=allow_private, permanent=False)
    return target


def _parse_for_sending(url: str) -> tuple[httpx.URL, str]:
    """Return ``url`` parsed by the client's own parser and its host as sent (ASCII, IDNA 2008
    A-labels, no IPv6 brackets); raise ``UnsafeURL`` ``invalid_url`` when it cannot be sent.

    Validation and sending both go through here, so a host is never checked in one form and
    connected to in another (the resolver would apply IDNA 2003, which maps ``①②⑦`` to ``127``).
    """
    try:
        target = httpx.URL(url)
        host = target.raw_host.decode("ascii")
    except (httpx.InvalidURL, UnicodeError, ValueError):
        raise UnsafeURL("invalid_url", "The URL's host is not a valid host name (IDNA 2008).") from None
    if not host:
        raise UnsafeURL("invalid_url", "The URL has no host.")
    return target, host


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


def checked_addresses(host: str, port: int, *, allow_private: bool) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Return every address ``host`` resolves to once each passes ``address_problem``: for a
    caller that connects later, to one of them, through something other than ``SafeClient`` (the
    local launcher's relay pins one at launch). Raises OSError when ``host`` does not resolve and
    ``UnsafeURL`` for a refused address."""
    addresses = resolve_host(host, port)
    _refuse_addresses(host, addresses, allow_private=allow_private, permanent=False)
    return addresses


def _refuse_addresses(host: str, addresses, *, allow_private: bool, permanent: bool) -> None:
    for address in addresses:
        problem = address_problem(address, allow_private=allow_private)
        if not problem:
            continue
        carried = embedded_ipv4(address)
        shown = f"{address}, which carries {', '.join(map(str, carried))}" if carried else str(address)
        if problem == "private_address":
            message = f"{host} resolves to a private or loopback address ({shown})."
        else:
            message = f"{host} resolves to a refused address ({shown})."
        raise UnsafeURL(problem, message, permanent=permanent)


class _GuardedBackend(httpcore.SyncBackend):
    """Resolve, check every address, then connect to a checked one (defeats DNS rebinding)."""

    def __init__(self, *, allow_private: bool):
        self.allow_private = allow_private

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = resolve_host(host, port)
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(f"cannot resolve host: {exc.__class__.__name__}") from None
        _refuse_addresses(host, addresses, allow_private=self.allow_private, permanent=False)
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
        target = check_url(url, allow_private=self.allow_private, resolve=False)
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            with self._client.stream("POST", target, content=content, headers=dict(headers)) as response:
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
