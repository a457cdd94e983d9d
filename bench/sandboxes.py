"""Benchmarks ``sandbox_create_ms``, ``sandbox_first_command_ms`` and ``sandbox_exec_ms``.

A real uvicorn serves Lab on PostgreSQL with the local runtime (bubblewrap); this process drives
it with the SDK (``labsdk.Lab``), as a client would, over HTTP on loopback.

- ``sandbox_create_ms``: ``POST /sandboxes`` until its answer (the sandbox is ``running``: request
  to ready), p50 and p99 over ``--sandboxes`` sandboxes. Baseline: the goal of issue 34, p50 100 ms.
- ``sandbox_first_command_ms``: from sending the create to the end of the first command's answer
  (``true``), p50 and p99.
- ``sandbox_exec_ms``: a trivial command's (``true``) round trip through the SDK, the API and the
  runtime, p50 and p99 over ``--commands`` commands. Baseline: the goal, p50 15 ms.

Each line also carries ``get_sandbox_p50_ms``, a ``GET /sandboxes/{id}`` through the same client and
server: what the API itself costs a request, beside what the sandbox adds.

Usage: ``python bench/sandboxes.py [--sandboxes 20] [--commands 50]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx

import _django


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandboxes", type=int, default=20, help="sandboxes created")
    parser.add_argument("--commands", type=int, default=50, help="trivial commands timed")
    args = parser.parse_args()
    url = _django.setup()

    from django.conf import settings
    from labsdk import Lab

    from lab.bootstrap import bootstrap_tenant
    from tests.support.stack import wait_for

    result = bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": settings.SECRET_KEY, "LAB_PUBLIC_URL": base,
           "LAB_API_RATE_LIMIT_PER_MINUTE": "1000000", "LAB_SANDBOX_MAX_PER_ORG": str(args.sandboxes + 1)}
    web = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        cwd=_django.REPO, env=env,
    )
    try:
        wait_for(lambda: _healthy(base), timeout=60, what="the web server")
        with Lab(api_key=result["api_key"], base_url=base) as lab:
            lab.sandboxes.run(lab.sandboxes.create().id, "true")  # warm: imports, connections
            created, first = [], []
            sandbox_ids = []
            for _ in range(args.sandboxes):
                started = time.perf_counter()
                sandbox = lab.sandboxes.create(timeout_s=600)
                created.append((time.perf_counter() - started) * 1000)
                answer = lab.sandboxes.run(sandbox.id, "true")
                first.append((time.perf_counter() - started) * 1000)
                assert sandbox.status == "running" and answer.exit_code == 0, (sandbox, answer)
                sandbox_ids.append(sandbox.id)
            executed = []
            for _ in range(args.commands):
                started = time.perf_counter()
                answer = lab.sandboxes.run(sandbox_ids[0], "true")
                executed.append((time.perf_counter() - started) * 1000)
                assert answer.exit_code == 0, answer
            read = []
            for _ in range(args.commands):
                started = time.perf_counter()
                lab.sandboxes.get(sandbox_ids[0])
                read.append((time.perf_counter() - started) * 1000)
            for sandbox_id in sandbox_ids:
                lab.sandboxes.delete(sandbox_id)
        for name, values, baseline in (
            ("sandbox_create_ms", created, 100.0),
            ("sandbox_first_command_ms", first, None),
            ("sandbox_exec_ms", executed, 15.0),
        ):
            _django.report(name, statistics.median(values), "ms", baseline, p99_ms=round(_p99(values), 3), n=len(values),
                           get_sandbox_p50_ms=round(statistics.median(read), 3))
    finally:
        web.terminate()
        web.wait(timeout=30)


if __name__ == "__main__":
    main()
