"""The real gateway (the official ``kubernetes`` client) against a fake API HTTP server
(pytest-httpserver): create, 409 as success, get, paged list, watch with a 410 in the middle
and the relist after it, delete with Background propagation, retries on 429/5xx, QPS pacing."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from werkzeug import Response

from jobs.launchers.kubernetes.cache import ClusterCache, WatchSpec
from jobs.launchers.kubernetes.gateway import ClusterError, ClusterUnavailable, KubernetesGateway, ResourceVersionGone, TokenBucket
from jobs.launchers.kubernetes.kinds import JOBSET, NAMESPACE, POD, SECRET

SECRETS = "/api/v1/namespaces/lab-acme/secrets"


def secret(name: str = "lab-job-abc-a1", version: str = "7") -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "lab-acme", "resourceVersion": version},
            "immutable": True, "stringData": {"LAB_JOB_TOKEN": "t"}}


def status(code: int, reason: str, message: str = "") -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message or reason}


@pytest.fixture
def slept() -> list[float]:
    return []


@pytest.fixture
def gateway(httpserver, slept) -> KubernetesGateway:
    configuration = client.Configuration()
    configuration.host = httpserver.url_for("/").rstrip("/")
    configuration.api_key = {"authorization": "Bearer test-token"}
    return KubernetesGateway(configuration, sleep=slept.append, backoff_s=0.25, max_retries=3)


def test_it_creates_with_the_bearer_token_and_returns_the_stored_object(httpserver, gateway):
    body = secret()
    httpserver.expect_oneshot_request(SECRETS, method="POST", json=body, headers={"authorization": "Bearer test-token"}).respond_with_json(
        {**body, "metadata": {**body["metadata"], "uid": "u1"}}, status=201)

    stored = gateway.apply(body)

    assert stored["metadata"]["uid"] == "u1"
    httpserver.check_assertions()


def test_it_treats_409_on_create_as_success_and_returns_the_existing_object(httpserver, gateway):
    existing = {**secret(), "metadata": {**secret()["metadata"], "uid": "first"}}
    httpserver.expect_oneshot_request(SECRETS, method="POST").respond_with_json(status(409, "AlreadyExists"), status=409)
    httpserver.expect_oneshot_request(f"{SECRETS}/lab-job-abc-a1", method="GET").respond_with_json(existing)

    assert gateway.apply(secret())["metadata"]["uid"] == "first"
    assert len(httpserver.log) == 2


def test_it_raises_other_refusals_with_the_api_message(httpserver, gateway):
    httpserver.expect_oneshot_request(SECRETS, method="POST").respond_with_json(
        status(422, "Invalid", 'Secret "x" is invalid: metadata.name'), status=422)

    with pytest.raises(ClusterError) as raised:
        gateway.apply(secret())

    assert (raised.value.status, raised.value.message) == (422, 'Secret "x" is invalid: metadata.name')
    assert len(httpserver.log) == 1  # a 4xx is final: never retried


def test_get_answers_none_for_a_missing_object(httpserver, gateway):
    httpserver.expect_oneshot_request("/api/v1/namespaces/lab-acme", method="GET").respond_with_json(status(404, "NotFound"), status=404)
    httpserver.expect_oneshot_request("/apis/jobset.x-k8s.io/v1alpha2/namespaces/lab-acme/jobsets/js", method="GET").respond_with_json(
        {"kind": "JobSet", "metadata": {"name": "js"}})

    assert gateway.get(NAMESPACE, "lab-acme") is None
    assert gateway.get(JOBSET, "js", "lab-acme")["metadata"]["name"] == "js"


def test_list_follows_continue_tokens_and_returns_the_collection_version(httpserver, gateway):
    path = "/api/v1/pods"
    httpserver.expect_oneshot_request(path, query_string={"labelSelector": "lab.dev/job-id", "limit": "500"}).respond_with_json(
        {"kind": "PodList", "metadata": {"resourceVersion": "40", "continue": "page2"}, "items": [{"metadata": {"name": "a"}}]})
    httpserver.expect_oneshot_request(path, query_string={"labelSelector": "lab.dev/job-id", "limit": "500", "continue": "page2"}).respond_with_json(
        {"kind": "PodList", "metadata": {"resourceVersion": "41"}, "items": [{"metadata": {"name": "b"}}]})

    listing = gateway.list(POD, label_selector="lab.dev/job-id")

    assert [pod["metadata"]["name"] for pod in listing.items] == ["a", "b"]
    assert listing.resource_version == "41"


def watch_lines(*events: dict) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


def test_watch_streams_events_from_the_version_and_raises_gone_on_an_error_event(httpserver, gateway):
    path = "/api/v1/namespaces/lab-acme/secrets"
    httpserver.expect_oneshot_request(path, query_string={
        "watch": "true", "resourceVersion": "7", "allowWatchBookmarks": "true", "timeoutSeconds": "5"}).respond_with_data(
        watch_lines({"type": "MODIFIED", "object": secret(version="8")},
                    {"type": "ERROR", "object": status(410, "Expired", "too old resource version: 7 (9)")}),
        content_type="application/json")

    seen = []
    with pytest.raises(ResourceVersionGone):
        for event in gateway.watch(SECRET, namespace="lab-acme", resource_version="7", timeout_s=5):
            seen.append((event.type, event.object["metadata"]["resourceVersion"]))

    assert seen == [("MODIFIED", "8")]


def test_the_cache_relists_after_a_410_in_the_middle_of_a_watch(httpserver, gateway):
    path = "/api/v1/pods"
    selector = "lab.dev/job-id"

    def pod(name: str, version: str) -> dict:
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "lab-acme", "resourceVersion": version,
                                            "labels": {selector: "job_1", "jobset.sigs.k8s.io/jobset-name": "js"}}}

    def listing(version: str, *items: dict) -> dict:
        return {"kind": "PodList", "metadata": {"resourceVersion": version}, "items": list(items)}

    list_query = {"labelSelector": selector, "limit": "500"}
    watch_query = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": "1", "labelSelector": selector}
    httpserver.expect_ordered_request(path, query_string=list_query).respond_with_json(listing("10", pod("a", "10")))
    httpserver.expect_ordered_request(path, query_string={**watch_query, "resourceVersion": "10"}).respond_with_data(
        watch_lines({"type": "ADDED", "object": pod("b", "11")},
                    {"type": "ERROR", "object": status(410, "Expired")}))
    httpserver.expect_ordered_request(path, query_string=list_query).respond_with_json(listing("20", pod("b", "12"), pod("c", "20")))
    httpserver.expect_ordered_request(path, query_string={**watch_query, "resourceVersion": "20"}).respond_with_data(
        watch_lines({"type": "DELETED", "object": pod("c", "21")},
                    {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "25"}}}))
    cache = ClusterCache(gateway, [WatchSpec(POD, selector)], watch_timeout_s=1)

    cache.sync()

    assert sorted(cache.group("lab-acme", "js").pods) == ["b"]
    assert cache.lists == 2 and cache.synced
    assert cache._resource_version["Pod"] == "25"
    httpserver.check_assertions()


def test_delete_sends_background_propagation_and_answers_false_when_gone(httpserver, gateway):
    path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/lab-acme/jobsets/js"
    httpserver.expect_oneshot_request(path, method="DELETE", json={
        "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}).respond_with_json(status(200, "Success"))
    httpserver.expect_oneshot_request(path, method="DELETE").respond_with_json(status(404, "NotFound"), status=404)

    assert gateway.delete(JOBSET, "js", "lab-acme") is True
    assert gateway.delete(JOBSET, "js", "lab-acme") is False
    httpserver.check_assertions()


def test_it_retries_429_after_retry_after_and_5xx_with_backoff(httpserver, gateway, slept):
    path = f"{SECRETS}/s"
    httpserver.expect_ordered_request(path).respond_with_response(
        Response(json.dumps(status(429, "TooManyRequests")), status=429, headers={"Retry-After": "2"}, content_type="application/json"))
    httpserver.expect_ordered_request(path).respond_with_json(status(503, "ServiceUnavailable"), status=503)
    httpserver.expect_ordered_request(path).respond_with_json(secret("s"))

    assert gateway.get(SECRET, "s", "lab-acme")["metadata"]["name"] == "s"
    assert slept == [2.0, 0.5]  # Retry-After, then the second backoff step (0.25 doubled)
    assert gateway.retries == 2


def test_it_gives_up_after_the_last_retry(httpserver, gateway, slept):
    httpserver.expect_request(f"{SECRETS}/s").respond_with_json(status(500, "InternalError"), status=500)

    with pytest.raises(ClusterUnavailable) as raised:
        gateway.get(SECRET, "s", "lab-acme")

    assert raised.value.status == 500
    assert len(httpserver.log) == 4 and slept == [0.25, 0.5, 1.0]


def test_it_retries_when_nothing_answers(slept):
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # the discard port: refused
    gateway = KubernetesGateway(configuration, sleep=slept.append, max_retries=2, request_timeout_s=2)

    with pytest.raises(ClusterUnavailable) as raised:
        gateway.list(POD)

    assert raised.value.status == 0 and len(slept) == 2


def test_the_token_bucket_lets_a_burst_through_then_paces_at_the_rate():
    now = [0.0]
    waits: list[float] = []
    bucket = TokenBucket(rate=10, burst=3, clock=lambda: now[0], sleep=waits.append)

    for _ in range(5):
        bucket.take()

    assert waits == [pytest.approx(0.1), pytest.approx(0.2)]


def test_the_cache_keeps_current_in_background_threads_against_the_api(httpserver, gateway):
    pod = {"kind": "Pod", "metadata": {"name": "a", "namespace": "lab-acme", "resourceVersion": "5",
                                        "labels": {"jobset.sigs.k8s.io/jobset-name": "js"}}}
    httpserver.expect_request("/api/v1/pods", query_string={"limit": "500"}).respond_with_json(
        {"kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": [pod]})
    httpserver.expect_request("/api/v1/pods", query_string={
        "watch": "true", "resourceVersion": "5", "allowWatchBookmarks": "true", "timeoutSeconds": "1"}).respond_with_data("")
    cache = ClusterCache(gateway, [WatchSpec(POD)], watch_timeout_s=1)

    cache.start()
    try:
        assert cache.wait_synced(10)
        assert list(cache.group("lab-acme", "js").pods) == ["a"]
    finally:
        cache.stop(wait_s=5)


PENDING = "/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/lab/pendingworkloads"


def test_it_reads_kueues_pending_workloads_in_one_call(httpserver, gateway):
    item = {"metadata": {"name": "jobset-lab-job-abc-a1-1f2e3", "namespace": "lab-acme",
                         "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                              "name": "lab-job-abc-a1", "uid": "u1"}]},
            "priority": 500, "localQueueName": "lab", "positionInClusterQueue": 3, "positionInLocalQueue": 1}
    httpserver.expect_oneshot_request(PENDING, method="GET", query_string={"limit": "1000", "offset": "0"}).respond_with_json(
        {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta2", "metadata": {}, "items": [item]})

    assert gateway.pending_workloads("lab") == [item]


@pytest.mark.parametrize("code", [404, 403, 503])
def test_without_the_visibility_api_it_says_none_and_asks_once(httpserver, gateway, slept, code):
    httpserver.expect_request(PENDING, method="GET").respond_with_json(status(code, "NotFound"), status=code)

    assert gateway.pending_workloads("lab") is None
    assert len(httpserver.log) == 1 and slept == []  # never retried: the caller has its own estimate
