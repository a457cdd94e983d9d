"""The hardened outgoing client (lab/lib/http.py): every refusal, no redirects, timeouts, masking."""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lab.lib import http
from lab.lib.http import RequestFailed, SafeClient, UnsafeURL, check_url, mask_url
from tests.support import http_server


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://127.0.0.1/hook", "private_address"),
        ("http://10.1.2.3/hook", "private_address"),
        ("http://172.16.0.9/hook", "private_address"),
        ("http://192.168.1.1/hook", "private_address"),
        ("http://100.64.0.1/hook", "private_address"),
        ("http://[::1]/hook", "private_address"),
        ("http://[fd12::1]/hook", "private_address"),
        ("http://[::ffff:127.0.0.1]/hook", "private_address"),
        ("http://[2002:7f00:1::]/hook", "private_address"),
        ("http://169.254.169.254/latest/meta-data", "blocked_address"),
        ("http://169.254.10.10/hook", "blocked_address"),
        ("http://[fe80::1]/hook", "blocked_address"),
        ("http://[fd00:ec2::254]/hook", "blocked_address"),
        ("http://224.0.0.1/hook", "blocked_address"),
        ("http://240.0.0.1/hook", "blocked_address"),
        ("http://0.0.0.0/hook", "blocked_address"),
        ("http://255.255.255.255/hook", "blocked_address"),
        ("ftp://example.com/hook", "unsupported_scheme"),
        ("javascript:alert(1)", "unsupported_scheme"),
        ("https:///no-host", "invalid_url"),
        ("https://user:pw@example.com/hook", "invalid_url"),
        ("https://example.com/a b", "invalid_url"),
        ("https://example.com/\x00", "invalid_url"),
        ("https://example.com/\ud800", "invalid_url"),
        ("http://127.0.0.1/\u202e<script>", "invalid_url"),
        ("https://example.com/caf\u00e9", "invalid_url"),
        ("https://example.com/a<b", "invalid_url"),
        ('https://example.com/"quoted"', "invalid_url"),
        ("https://example.com/?q={x}", "invalid_url"),
        ("https://example.com:99999/", "invalid_url"),
        ("https://example.com/" + "a" * 2040, "url_too_long"),
    ],
)
def test_it_refuses_unsafe_urls(url, code):
    with pytest.raises(UnsafeURL) as caught:
        check_url(url, allow_private=False, resolve=False)
    assert caught.value.code == code


@pytest.mark.parametrize(
    "url",
    ["http://169.254.169.254/", "http://100.100.100.200/", "http://[fe80::1]/", "http://224.0.0.1/", "http://0.0.0.0/"],
)
def test_it_refuses_metadata_link_local_and_multicast_even_when_private_addresses_are_allowed(url):
    with pytest.raises(UnsafeURL) as caught:
        check_url(url, allow_private=True, resolve=False)
    assert caught.value.code == "blocked_address"


@pytest.mark.parametrize("allow_private", [False, True])
@pytest.mark.parametrize(
    "url",
    [
        "http://[2002:a9fe:a9fe::]/",  # 6to4 of 169.254.169.254
        "http://[2002:a9fe:a01::1]/",  # 6to4 of link-local 169.254.10.1
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",  # Teredo, client 169.254.169.254
        "http://[2001:0:a9fe:a9fe:8000:63bf:f7f7:f7f7]/",  # Teredo, server 169.254.169.254
        "http://[::ffff:169.254.169.254]/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://[::ffff:169.254.10.10]/",
        "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    ],
)
def test_it_refuses_ipv6_forms_of_refused_ipv4_addresses(url, allow_private):
    with pytest.raises(UnsafeURL) as caught:
        check_url(url, allow_private=allow_private, resolve=False)
    assert caught.value.code == "blocked_address"


@pytest.mark.parametrize("url", ["http://[2002:808:808::1]/hook", "http://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/hook"])
def test_it_accepts_6to4_and_teredo_forms_of_public_addresses(url):
    check_url(url, allow_private=False, resolve=False)


@pytest.mark.parametrize("allow_private", [False, True])
@pytest.mark.parametrize(
    "url",
    [
        "http://\u2460\u2461\u2466.0.0.1/",  # IDNA 2003 maps the circled digits to 127.0.0.1; IDNA 2008 refuses them
        "http://\uff45xample.com/",  # fullwidth e: mapped by IDNA 2003 only
        "http://169.254.169.254.:80/",
        "http://hooks.example.com./hook",
        "http://%31%32%37.0.0.1/",
        "http://hooks..example.com/",
    ],
)
def test_it_refuses_hosts_the_client_cannot_send_to_as_written(url, allow_private):
    with pytest.raises(UnsafeURL) as caught:
        check_url(url, allow_private=allow_private)
    assert caught.value.code == "invalid_url"
    with pytest.raises(UnsafeURL) as sending:
        SafeClient(allow_private=allow_private).post(url, content=b"{}", headers={})
    assert sending.value.code == "invalid_url"
    assert sending.value.permanent is True


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/hook", "http://10.0.0.5/hook", "http://[::1]/hook"])
def test_it_allows_loopback_and_private_addresses_with_the_setting(url):
    check_url(url, allow_private=True, resolve=False)


def test_it_refuses_a_host_name_that_cannot_be_encoded():
    with pytest.raises(UnsafeURL) as caught:
        check_url("https://a..b/hook", allow_private=False)
    assert caught.value.code == "invalid_url"


def test_it_accepts_public_addresses():
    check_url("https://93.184.215.14/hook", allow_private=False, resolve=False)


def test_it_accepts_an_internationalized_host_and_percent_encoded_paths():
    check_url("https://b\u00fccher.example/caf%C3%A9?q=%7Bx%7D", allow_private=False, resolve=False)


def _fake_dns(monkeypatch, answers: dict[str, list[str]]):
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in answers[host]]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(http.socket, "getaddrinfo", getaddrinfo)


def test_it_refuses_a_name_when_any_of_its_addresses_is_private(monkeypatch):
    _fake_dns(monkeypatch, {"mixed.example": ["93.184.215.14", "10.0.0.1"]})
    with pytest.raises(UnsafeURL) as caught:
        check_url("https://mixed.example/hook", allow_private=False)
    assert caught.value.code == "private_address"


class _Server:
    """A tiny HTTP server that answers with a given status, headers, body and delay."""

    def __init__(self, status=200, headers=None, body=b"ok", delay=0.0):
        self.requests: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append({k.lower(): v for k, v in self.headers.items()})
                if delay:
                    threading.Event().wait(delay)
                try:
                    self.send_response(status)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # the client closing a kept-alive connection is expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        http_server.start(self.server)

    def close(self):
        http_server.stop(self.server)


@pytest.fixture
def server_factory():
    servers = []

    def make(**kwargs):
        servers.append(_Server(**kwargs))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_it_refuses_a_name_that_resolves_to_loopback_at_connect_time_and_sends_nothing(monkeypatch, server_factory):
    server = server_factory()
    _fake_dns(monkeypatch, {"rebind.example": ["127.0.0.1"]})
    client = SafeClient(allow_private=False, timeout=5)
    with pytest.raises(UnsafeURL) as caught:
        client.post(f"http://rebind.example:{server.port}/hook", content=b"{}", headers={})
    assert caught.value.code == "private_address"
    assert server.requests == []


def test_it_connects_to_the_address_it_checked_and_keeps_the_host_header(monkeypatch, server_factory):
    server = server_factory()
    _fake_dns(monkeypatch, {"receiver.example": ["127.0.0.1"]})
    client = SafeClient(allow_private=True, timeout=5)
    response = client.post(f"http://receiver.example:{server.port}/hook", content=b"{}", headers={"x-test": "1"})
    assert response.status_code == 200
    assert server.requests[0]["host"] == f"receiver.example:{server.port}"
    assert server.requests[0]["x-test"] == "1"


def test_it_does_not_follow_redirects(server_factory):
    target = server_factory()
    redirect = server_factory(status=307, headers={"Location": f"http://127.0.0.1:{target.port}/elsewhere"})
    response = SafeClient(allow_private=True, timeout=5).post(
        f"http://127.0.0.1:{redirect.port}/hook", content=b"{}", headers={}
    )
    assert response.status_code == 307
    assert target.requests == []


def test_it_keeps_only_an_excerpt_of_a_large_answer(server_factory):
    server = server_factory(body=b"x" * 1_000_000)
    response = SafeClient(allow_private=True, timeout=5, max_excerpt=2048).post(
        f"http://127.0.0.1:{server.port}/hook", content=b"{}", headers={}
    )
    assert response.status_code == 200
    assert response.excerpt == "x" * 2048


def test_it_times_out_a_slow_receiver(server_factory):
    server = server_factory(delay=3)
    with pytest.raises(RequestFailed) as caught:
        SafeClient(allow_private=True, timeout=1).post(
            f"http://127.0.0.1:{server.port}/hook", content=b"{}", headers={}
        )
    assert caught.value.timed_out is True
    assert 900 <= caught.value.duration_ms < 2900


def test_it_reports_a_refused_connection_without_the_url_in_logs(caplog):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level(logging.INFO, logger="lab.lib.http")
    with pytest.raises(RequestFailed) as caught:
        SafeClient(allow_private=True, timeout=2).post(
            f"http://127.0.0.1:{port}/secret-path?token=hunter2", content=b"{}", headers={}
        )
    assert caught.value.timed_out is False
    assert "hunter2" not in caught.value.message
    logged = " ".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)
    assert "hunter2" not in logged and "secret-path" not in logged
    assert "http://127.0.0.1/…" in logged


def test_it_ignores_proxy_settings_from_the_environment(monkeypatch, server_factory):
    server = server_factory()
    monkeypatch.setenv("HTTP_PROXY", "http://10.255.255.1:3128")
    monkeypatch.setenv("ALL_PROXY", "http://10.255.255.1:3128")
    response = SafeClient(allow_private=True, timeout=3).post(
        f"http://127.0.0.1:{server.port}/hook", content=b"{}", headers={}
    )
    assert response.status_code == 200


def test_mask_url_keeps_scheme_and_host_only():
    assert mask_url("https://hooks.example.com/abc/def?token=1") == "https://hooks.example.com/…"
