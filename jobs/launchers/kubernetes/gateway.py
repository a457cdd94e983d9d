"""The cluster gateway: the calls Lab makes to Kubernetes, and their implementation on the
official ``kubernetes`` client.

``apply`` creates an object and treats 409 AlreadyExists as success (Lab's names are
deterministic per job attempt, so a retried launch finds what the first one made); ``get``,
``list`` and ``watch`` read; ``delete`` removes with ``propagationPolicy: Background``. Objects
are plain dicts in the API's JSON shape. ``watch`` continues from a ``list``'s
``resourceVersion`` and raises ``ResourceVersionGone`` on 410 Gone, when the caller must list
again (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes).
``patch`` sends a JSON merge patch (RFC 7386); one that carries ``metadata.resourceVersion`` is
applied only to that version of the object, else it is refused with 409 Conflict (the API's
optimistic concurrency: https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts).

``KubernetesGateway`` paces its requests with a client-side token bucket (``qps``, ``burst``: the
shape of client-go's default limiter) and retries 429 and 5xx answers and network errors with
capped exponential backoff, honouring ``Retry-After``; after ``max_retries`` it raises
``ClusterUnavailable``.
"""

from __future__ import annotations

import abc
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from labsdk.retry import exponential_backoff

from jobs.launchers.base import LauncherUnavailable
from jobs.launchers.kubernetes.kinds import Kind, kind_of

#: Kueue's on-demand visibility API (an aggregated API served by Kueue's controller).
VISIBILITY_API = "visibility.kueue.x-k8s.io/v1beta2"
#: Answers worth asking again: throttling and server-side failures.
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
#: The content type of a JSON merge patch (RFC 7386).
MERGE_PATCH = "application/merge-patch+json"


class ClusterError(Exception):
    """The API refused a request; ``status`` is its HTTP status (0 without an answer)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class ResourceVersionGone(ClusterError):
    """410 Gone: the watch's ``resourceVersion`` is too old; list again."""


class ClusterUnavailable(ClusterError, LauncherUnavailable):
    """The API did not answer, or kept answering 429/5xx, through every retry."""


@dataclass(frozen=True)
class ObjectList:
    """What a list returned: the objects and the collection's ``resourceVersion`` to watch from."""

    items: list[dict]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ``type`` is ``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK``."""

    type: str
    object: dict


class ClusterGateway(abc.ABC):
    """What Lab asks of a cluster. Every call is safe to repeat."""

    @abc.abstractmethod
    def apply(self, obj: dict) -> dict:
        """Create ``obj`` (a manifest with ``kind`` and ``metadata.name``) or, if an object of that
        name exists already (409), return the existing one; return the object as stored."""

    @abc.abstractmethod
    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict | None:
        """Return the named object, or None when there is none (404)."""

    @abc.abstractmethod
    def list(self, kind: Kind, *, namespace: str | None = None, label_selector: str = "") -> ObjectList:
        """Return every object of ``kind`` (in ``namespace``, else in all namespaces) matching
        ``label_selector`` (the API's syntax: ``key``, ``key=value``, ``key!=value``, comma-joined)."""

    @abc.abstractmethod
    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        timeout_s: int = 60,
    ) -> Iterator[WatchEvent]:
        """Yield the changes after ``resource_version`` until the server ends the stream (after
        about ``timeout_s`` seconds); raise ResourceVersionGone when it is too old."""

    @abc.abstractmethod
    def patch(self, kind: Kind, name: str, namespace: str | None, patch: dict) -> dict:
        """Apply the JSON merge patch ``patch`` to the named object and return it as stored; raise
        ClusterError 404 when there is none, 409 when ``patch`` names a ``metadata.resourceVersion``
        the object no longer has."""

    @abc.abstractmethod
    def delete(self, kind: Kind, name: str, namespace: str | None = None, *, grace_period_s: int | None = None) -> bool:
        """Delete the named object with Background propagation (its dependents are deleted by
        the garbage collector); return False when it was already gone."""

    @abc.abstractmethod
    def pending_workloads(self, cluster_queue: str, *, limit: int = 1000) -> list[dict] | None:
        """Return the first ``limit`` pending workloads of ClusterQueue ``cluster_queue`` in
        Kueue's order, from Kueue's visibility API (``visibility.kueue.x-k8s.io/v1beta2``,
        ``clusterqueues/{name}/pendingworkloads``: its ``PendingWorkloadsSummary`` items, each with
        ``metadata`` (name, namespace, ``ownerReferences``: the JobSet), ``priority``,
        ``localQueueName``, ``positionInClusterQueue`` and ``positionInLocalQueue``, from 0).
        None when the API is not there or does not answer (Kueue's ``VisibilityOnDemand`` off,
        its APIService unavailable, no RBAC): asked once, never retried, since a caller has an
        estimate of its own."""


class TokenBucket:
    """At most ``burst`` requests at once, refilled at ``rate`` per second (thread-safe)."""

    def __init__(self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._clock, self._sleep = clock, sleep
        self._last = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Wait for a token; return how long it waited (seconds)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= 1
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait:
            self._sleep(wait)
        return wait


def load_configuration():
    """Return the ``kubernetes.client.Configuration`` of this process: the in-cluster service
    account when running in a pod (``KUBERNETES_SERVICE_HOST``), else the kubeconfig
    (``KUBECONFIG``, or ``~/.kube/config``)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    return configuration


class KubernetesGateway(ClusterGateway):
    """The gateway on the official ``kubernetes`` client (its configuration, authentication, TLS
    and HTTP pool; the paths are ``Kind``'s)."""

    def __init__(
        self,
        configuration=None,
        *,
        qps: float = 20.0,
        burst: int = 40,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        request_timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        from kubernetes import client

        configuration = configuration if configuration is not None else load_configuration()
        # The retries are this class's (429/5xx/network, paced, with an injectable sleep): the
        # HTTP pool's own (urllib3 honours Retry-After by itself) would hide them.
        configuration.retries = False
        self.api = client.ApiClient(configuration)
        self.bucket = TokenBucket(rate=qps, burst=burst, sleep=sleep)
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.request_timeout_s = request_timeout_s
        self._sleep = sleep
        #: How many requests were retried (429, 5xx, network errors), for logs and tests.
        self.retries = 0

    # --- the calls ---------------------------------------------------------------------

    def apply(self, obj: dict) -> dict:
        kind = kind_of(obj)
        namespace = obj["metadata"].get("namespace")
        try:
            return self._json("POST", kind.collection_path(namespace), body=obj)
        except ClusterError as exc:
            if exc.status != 409:
                raise
        existing = self.get(kind, obj["metadata"]["name"], namespace)
        if existing is None:  # deleted between the two calls: create it again
            return self._json("POST", kind.collection_path(namespace), body=obj)
        return existing

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict | None:
        try:
            return self._json("GET", kind.object_path(name, namespace))
        except ClusterError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: Kind, *, namespace: str | None = None, label_selector: str = "") -> ObjectList:
        items: list[dict] = []
        query = [("labelSelector", label_selector)] if label_selector else []
        token = ""
        while True:  # pages of 500 (the API's limit/continue), so a large cluster is not one answer
            page = self._json("GET", kind.collection_path(namespace), query=query + [("limit", "500")] + (
                [("continue", token)] if token else []))
            items += page.get("items") or []
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return ObjectList(items=items, resource_version=str(metadata.get("resourceVersion", "")))

    def watch(self, kind: Kind, *, resource_version: str, namespace: str | None = None, label_selector: str = "",
              timeout_s: int = 60) -> Iterator[WatchEvent]:
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        from kubernetes.watch.watch import iter_resp_lines

        response = self._request("GET", kind.collection_path(namespace), query=query, timeout=timeout_s + 10)
        try:
            for line in iter_resp_lines(response.response):
                if not line:
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise _error(int(status.get("code") or 0), status.get("message") or "watch error")
                yield WatchEvent(type=event["type"], object=event["object"])
        finally:
            response.response.release_conn()

    def patch(self, kind: Kind, name: str, namespace: str | None, patch: dict) -> dict:
        return self._json("PATCH", kind.object_path(name, namespace), body=patch, content_type=MERGE_PATCH)

    def delete(self, kind: Kind, name: str, namespace: str | None = None, *, grace_period_s: int | None = None) -> bool:
        body: dict = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            self._json("DELETE", kind.object_path(name, namespace), body=body)
        except ClusterError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def pending_workloads(self, cluster_queue: str, *, limit: int = 1000) -> list[dict] | None:
        path = f"/apis/{VISIBILITY_API}/clusterqueues/{cluster_queue}/pendingworkloads"
        try:
            summary = self._json("GET", path, query=[("limit", str(limit)), ("offset", "0")], retries=0)
        except ClusterError:
            return None
        items = summary.get("items")
        return items if isinstance(items, list) else None

    # --- requests -----------------------------------------------------------------------------

    def _json(self, method: str, path: str, *, query: list | None = None, body: dict | None = None,
              retries: int | None = None, content_type: str = "application/json") -> dict:
        response = self._request(method, path, query=query, body=body, timeout=self.request_timeout_s, retries=retries,
                                 content_type=content_type)
        return json.loads(response.read() or b"{}")

    def _request(self, method: str, path: str, *, query: list | None = None, body: dict | None = None,
                 timeout: float, retries: int | None = None, content_type: str = "application/json"):
        """Send one request, paced and retried (``retries``, default ``max_retries``); return the
        client's RESTResponse of a 2xx answer."""
        import urllib3

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        max_retries = self.max_retries if retries is None else retries
        for attempt in range(max_retries + 1):
            self.bucket.take()
            retry_after = None
            try:
                method_, url, sent_headers, sent_body, _ = self.api.param_serialize(
                    method, path, query_params=query or [], header_params=dict(headers), body=body,
                    auth_settings=["BearerToken"],
                )
                response = self.api.call_api(method_, url, header_params=sent_headers, body=sent_body,
                                             _request_timeout=timeout)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                status, message = 0, f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= response.status < 300:
                    return response
                status, message = response.status, _message(response.read())
                retry_after = response.headers.get("Retry-After")
                if status not in RETRYABLE_STATUSES:
                    raise _error(status, message)
            if attempt == max_retries:
                raise ClusterUnavailable(status, message)
            self.retries += 1
            self._sleep(self._backoff(attempt, retry_after))
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before retry ``attempt`` + 1: ``Retry-After`` when the server says, else
        ``backoff_s`` doubling per attempt, both capped at ``max_backoff_s``."""
        if retry_after:
            try:
                return min(self.max_backoff_s, max(0.0, float(retry_after)))
            except ValueError:
                pass
        return exponential_backoff(attempt, base=self.backoff_s, cap=self.max_backoff_s)


def _message(data: bytes) -> str:
    """Return the ``message`` of a Kubernetes ``Status`` body, or the body's start."""
    try:
        return str(json.loads(data).get("message") or "")[:500]
    except (ValueError, AttributeError):
        return data[:500].decode(errors="replace")


def _error(status: int, message: str) -> ClusterError:
    return ResourceVersionGone(status, message) if status == 410 else ClusterError(status, message)
