"""The one HTTP layer of the SDK: auth, JSON, retries, idempotency keys, typed errors.

Used by :class:`labsdk.Lab` with an API key and meant for the RL engine's reporter with a
job token; it knows nothing about jobs.

Retries (:mod:`labsdk.retry`): connection failures and timeouts, 429 and 5xx are retried up to
``max_retries`` times with capped exponential backoff and jitter ("Exponential Backoff And
Jitter", AWS Architecture Blog, 2015), or after exactly the ``Retry-After`` the server
asked for. Every POST carries an ``Idempotency-Key`` (a uuid4 unless the caller gives one)
and the same body bytes on every retry, so Lab replays the first answer instead of acting
twice (docs/api.md "Conventions").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
from tqdm.auto import tqdm

from labsdk._version import __version__
from labsdk.errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    BadRequestError,
    error_from_response,
    parse_retry_after,
)
from labsdk.retry import exponential_backoff, is_retryable_status

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: The header of Lab's download answers that names the archive's SHA-256 (hex).
ARCHIVE_SHA256_HEADER = "X-Lab-Archive-SHA256"
#: ``code`` of the error a download whose bytes differ from that SHA-256 raises (no retry helps).
ARCHIVE_CORRUPTED = "archive_corrupted"
#: Errors worth another try: the request may not have reached Lab, or its answer was lost.
_RETRYABLE_TRANSPORT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class ServerSentEvent:
    """One event of a ``text/event-stream``: its type, its data (text) and its ``id``
    (``None`` for events without one, such as Lab's snapshot ``status`` event)."""

    event: str
    data: str
    id: str | None


class HTTPClient:
    """A JSON client for one Lab base URL.

    ``base_url`` is the API prefix (``http://127.0.0.1:8000/api/v1``); ``token`` is sent as
    ``Authorization: Bearer``; ``timeout`` is seconds per attempt; ``max_retries`` counts
    retries after the first attempt; ``max_retry_after`` (seconds) is the longest
    ``Retry-After`` honoured, a longer one is raised at once; ``missing_token_message`` is
    the error raised, before any request, when ``token`` is empty. ``sleep`` (default
    ``time.sleep``) and ``transport`` exist for tests and embedding.
    """

    def __init__(
        self,
        *,
        base_url: str,
        token: str | None,
        timeout: float = 30.0,
        max_retries: int = 2,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
        max_retry_after: float = 60.0,
        user_agent: str | None = None,
        missing_token_message: str = "no API key: pass api_key= or set LAB_API_KEY",
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
    ):
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_retry_after = max_retry_after
        self._token = token
        self._missing_token_message = missing_token_message
        self._sleep = sleep
        self._transport = transport
        headers = {
            "Accept": "application/json",
            "User-Agent": user_agent
            or f"labsdk/{__version__} python/{platform.python_version()}",
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=timeout,
            follow_redirects=False,
            transport=transport,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _pause(self, seconds: float) -> None:
        (self._sleep or time.sleep)(seconds)

    def backoff_delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based) when the server gave no
        ``Retry-After``: ``min(cap, base * 2**retry)`` scaled by a random factor in [0.5, 1]
        (:func:`labsdk.retry.exponential_backoff` with jitter)."""
        return exponential_backoff(retry, base=self.backoff_base, cap=self.backoff_cap, jitter=True)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Send one API request, retrying as the module says; return the decoded JSON answer
        (``None`` for an empty one, e.g. 204).

        ``path`` is relative to the base URL (``jobs/job_123``); ``params`` values that are
        ``None`` are left out. Raises :class:`~labsdk.errors.LabError` subclasses:
        ``APIConnectionError`` when no answer came, the status's class otherwise, and
        ``BadRequestError`` before sending when ``json_body`` is not JSON (NaN, objects).
        """
        headers: dict[str, str] = {}
        content: bytes | None = None
        if json_body is not None:
            try:
                content = json.dumps(json_body, allow_nan=False, separators=(",", ":")).encode()
            except (TypeError, ValueError) as exc:
                raise BadRequestError(f"the request body is not JSON: {exc}") from None
            headers["Content-Type"] = "application/json"
        if method.upper() == "POST":
            headers[IDEMPOTENCY_HEADER] = idempotency_key or str(uuid.uuid4())
        response = self._send(method, path, params=params, content=content, headers=headers)
        return self._decode(response)

    def request_text(self, path: str) -> str:
        """``GET path`` for an answer that is text, not JSON (a build log); errors as :meth:`request`."""
        return self._send("GET", path).text

    def upload(self, path: str, *, field: str, file: str | Path, content_type: str = "application/octet-stream") -> Any:
        """``POST path`` with the file ``file`` as the multipart/form-data field ``field`` (RFC 7578),
        retrying as :meth:`request` does; return the decoded JSON answer. The whole file is read
        into memory first (Lab's uploads are at most 100 MB). Raises the errors of :meth:`request`
        and ``OSError`` when the file cannot be read."""
        file = Path(file)
        data = file.read_bytes()
        boundary = uuid.uuid4().hex
        filename = file.name.replace("\\", "_").replace('"', "_")
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", IDEMPOTENCY_HEADER: str(uuid.uuid4())}
        return self._decode(self._send("POST", path, content=body, headers=headers))

    def upload_stream(
        self, path: str, *, fields: Mapping[str, str], field: str, file: str | Path,
        content_type: str = "application/octet-stream",
    ) -> Any:
        """``POST path`` with the text ``fields`` and the file ``file`` as the multipart/form-data
        field ``field`` (RFC 7578), streamed from disk with its length declared (archives of
        models run to gigabytes), retrying as :meth:`request` does (a retry reads the file again);
        return the decoded JSON answer. Raises the errors of :meth:`request` and ``OSError`` when
        the file cannot be read."""
        body = _MultipartBody(fields=fields, field=field, file=Path(file), content_type=content_type)
        headers = {
            "Content-Type": f"multipart/form-data; boundary={body.boundary}",
            "Content-Length": str(body.size),
            IDEMPOTENCY_HEADER: str(uuid.uuid4()),
        }
        return self._decode(self._send("POST", path, content=body, headers=headers))

    def download(self, path: str, destination: str | Path, *, progress: bool = False) -> Path:
        """Stream ``GET path`` into the file ``destination`` and return its path.

        Lab answers with the bytes or with a redirect to a signed URL (docs/api.md
        ``/checkpoints/{id}/download``); the signed URL is fetched without Lab's
        ``Authorization`` header so the key never leaves for the storage host. When Lab's
        answer names the archive's SHA-256 (``X-Lab-Archive-SHA256``, what it verified when the
        archive became ready), the bytes received must have it. The file is written under a
        ``.part`` name and renamed when complete, so a failed download leaves no truncated
        file. ``progress`` shows a tqdm bar in bytes on stderr when it is a terminal. Raises the errors of
        :meth:`request`, and ``APIError`` (``code`` ``archive_corrupted``) when the bytes differ
        from the SHA-256 Lab named.
        """
        destination = Path(destination)
        partial = destination.with_name(destination.name + ".part")
        digest = hashlib.sha256()
        try:
            with contextlib.ExitStack() as stack:
                response = self._send("GET", path, stream=True)
                stack.callback(response.close)
                expected = (response.headers.get(ARCHIVE_SHA256_HEADER) or "").lower()
                if response.is_redirect:
                    response = self._open_signed_url(stack, response)
                total = int(response.headers.get("content-length") or 0) or None
                bar = stack.enter_context(
                    tqdm(total=total, unit="B", unit_scale=True, disable=None if progress else True, desc=destination.name)
                )
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            if expected and digest.hexdigest() != expected:
                raise APIError(
                    f"the archive downloaded from {path} has SHA-256 {digest.hexdigest()}, not the {expected} Lab recorded",
                    code=ARCHIVE_CORRUPTED,
                )
        except httpx.HTTPError as exc:
            partial.unlink(missing_ok=True)
            raise APIConnectionError(f"the download from {self.base_url} broke off: {exc}") from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(destination)
        return destination

    def iter_events(
        self, path: str, *, params: Mapping[str, Any] | None = None, last_event_id: str | None = None
    ) -> Iterator[ServerSentEvent]:
        """Open a ``text/event-stream`` (``GET path``) and yield its events until the server
        ends it, parsed as the WHATWG HTML "Server-sent events" section says (``event:``,
        ``data:`` lines joined by newlines, ``id:``; comment lines ignored). ``last_event_id``
        is sent as ``Last-Event-ID`` to resume after that event.

        Raises the errors of :meth:`request` when the stream cannot be opened, and
        ``APIConnectionError`` when it breaks off (the caller may reopen it from the last
        ``id`` seen).
        """
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        response = self._send("GET", path, params=params, headers=headers, stream=True)
        try:
            event_type, data, event_id = "", [], None
            for line in response.iter_lines():
                if not line:
                    if data:
                        yield ServerSentEvent(event_type or "message", "\n".join(data), event_id)
                    event_type, data, event_id = "", [], None
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    event_type = value
                elif name == "data":
                    data.append(value)
                elif name == "id":
                    event_id = value
        except httpx.HTTPError as exc:
            raise APIConnectionError(f"the event stream from {self.base_url} broke off: {exc}") from exc
        finally:
            response.close()

    def _open_signed_url(self, stack: contextlib.ExitStack, redirect: httpx.Response) -> httpx.Response:
        """Open the storage URL Lab redirected to, without Lab's credentials and following
        the storage's own redirects; the client and response close with ``stack``."""
        location = redirect.headers.get("location")
        if not location:
            raise APIError("Lab redirected the download without a Location", status_code=redirect.status_code)
        storage = stack.enter_context(
            httpx.Client(timeout=self._client.timeout, follow_redirects=True, transport=self._transport)
        )
        response = storage.send(storage.build_request("GET", redirect.url.join(location)), stream=True)
        stack.callback(response.close)
        if response.status_code >= 400:
            raise APIError(
                f"the storage server answered {response.status_code} for the download",
                status_code=response.status_code,
            )
        return response

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        content: bytes | Iterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """Send a request with the module's retries; return a response under 400 (a streamed
        one, still open, when ``stream``); raise the status's ``LabError`` otherwise."""
        if not self._token:
            raise AuthenticationError(self._missing_token_message, code="invalid_api_key")
        query = {key: value for key, value in (params or {}).items() if value is not None}
        request = self._client.build_request(
            method.upper(), path.lstrip("/"), params=query, content=content, headers=headers
        )
        retry = 0
        while True:
            try:
                response = self._client.send(request, stream=stream)
            except _RETRYABLE_TRANSPORT_ERRORS as exc:
                if retry >= self.max_retries:
                    raise APIConnectionError(
                        f"could not reach Lab at {self.base_url}: {exc or type(exc).__name__}"
                    ) from exc
                self._pause(self.backoff_delay(retry))
                retry += 1
                continue
            except httpx.HTTPError as exc:
                raise APIConnectionError(f"could not reach Lab at {self.base_url}: {exc}") from exc

            if is_retryable_status(response.status_code):
                delay = self._retry_delay(response, retry)
                if delay is not None:
                    response.close()
                    self._pause(delay)
                    retry += 1
                    continue
            if response.status_code >= 400:
                response.read()
                response.close()
                self._decode(response)
            return response

    def _retry_delay(self, response: httpx.Response, retry: int) -> float | None:
        """Seconds to wait before retrying ``response``, or ``None`` to give up now."""
        if retry >= self.max_retries:
            return None
        asked = parse_retry_after(response.headers.get("retry-after"))
        if asked is None:
            return self.backoff_delay(retry)
        return asked if asked <= self.max_retry_after else None

    @staticmethod
    def _decode(response: httpx.Response) -> Any:
        body: Any
        text = response.text
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = text
        if response.status_code >= 400:
            raise error_from_response(
                response.status_code, body, {k.lower(): v for k, v in response.headers.items()}
            )
        if isinstance(body, str):
            raise APIError(
                f"Lab answered {response.status_code} with a body that is not JSON",
                status_code=response.status_code, body=body,
            )
        return body


class _MultipartBody:
    """A multipart/form-data body of text fields and one file read from disk in chunks; each
    iteration reads the file afresh, so a retried request sends it whole again."""

    _CHUNK = 1024 * 1024

    def __init__(self, *, fields: Mapping[str, str], field: str, file: Path, content_type: str):
        self.boundary = uuid.uuid4().hex
        self.file = file
        parts = [
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
            for name, value in fields.items()
        ]
        filename = file.name.replace("\\", "_").replace('"', "_")
        parts.append(
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        )
        self.head = "".join(parts).encode()
        self.tail = f"\r\n--{self.boundary}--\r\n".encode()
        self.size = len(self.head) + file.stat().st_size + len(self.tail)

    def __iter__(self) -> Iterator[bytes]:
        yield self.head
        with self.file.open("rb") as handle:
            while chunk := handle.read(self._CHUNK):
                yield chunk
        yield self.tail
